"""The scaling granularities side by side on the course's GPT: each recipe's error against bf16 on the same
step, and what its casts lost (overflow and underflow counts).

The run: train `distlab.reference.gpt_task` in float32 for `steps` SGD steps. At every step the FP8 copies
of the model (sharing the step's weights) run the same batch forward and backward, so that delayed scaling
has the amax history it would have had in training; at the last step every variant's loss and gradients
are compared with the float32 ones, and so are those of bf16 autocast, the 16-bit baseline FP8 must be
judged against (Micikevicius et al. 2022, sec. 5: FP8 training "matches" the 16-bit baseline's quality).
"""

from __future__ import annotations

import copy
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from distlab import reference
from distlab.memory.fp8.linear import Fp8Recipe, convert_to_fp8, fp8_stats
from distlab.memory.fp8.scaling import DelayedScaling

RECIPES = {
    "tensorwise, delayed": lambda: Fp8Recipe("tensorwise", delayed=DelayedScaling(history=16)),
    "tensorwise, current": lambda: Fp8Recipe("tensorwise"),
    "rowwise": lambda: Fp8Recipe("rowwise"),
    "blockwise 1x128 / 128x128": lambda: Fp8Recipe("blockwise"),
}


@dataclass(frozen=True)
class Row:
    """One variant at the compared step: relative errors against float32 and the casts' losses."""

    name: str
    loss_error: float  # |loss - loss_fp32| / loss_fp32
    grad_error: float  # ||g - g_fp32|| / ||g_fp32|| over all gradients together
    overflow: int
    underflow: int
    casts: int

    def vs(self, baseline: Row) -> float:
        """This variant's gradient error as a multiple of `baseline`'s (bf16's)."""
        return self.grad_error / baseline.grad_error


def _grads(model: nn.Module) -> Tensor:
    return torch.cat([p.grad.flatten() for p in model.parameters() if p.grad is not None])


def _step(model: nn.Module, x: Tensor, y: Tensor, autocast: bool = False) -> tuple[float, Tensor]:
    model.zero_grad(set_to_none=True)
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
        loss = model(x, y)[1]
    loss.float().backward()
    return float(loss.detach()), _grads(model).float()


def compare_granularities(steps: int = 3, batch: int = 16, n_embd: int = 256, seed: int = 0,
                          lr: float = 0.3) -> list[Row]:
    """bf16 and every recipe of `RECIPES` at step `steps` of a float32 run (module docstring); `n_embd` 256
    so that rows hold two 128-wide tiles and the MLP's weights several 128 x 128 blocks."""
    if steps < 1 or batch < 1:
        raise ValueError(f"steps={steps} and batch={batch} must be at least 1")
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # hundreds of small casts and matmuls: threads only contend (restored below)
    try:
        return _compare(steps, batch, n_embd, seed, lr)
    finally:
        torch.set_num_threads(threads)


def _compare(steps: int, batch: int, n_embd: int, seed: int, lr: float) -> list[Row]:
    task = reference.gpt_task(n_layer=2, n_embd=n_embd, block_size=16, seed=seed)
    model = task.build(seed)
    variants = {"bf16": copy.deepcopy(model)}
    variants.update({name: convert_to_fp8(copy.deepcopy(model), make()) for name, make in RECIPES.items()})
    opt = reference.SGD(model.parameters(), lr)
    rows: list[Row] = []
    for t, (x, y) in enumerate(task.batches(steps, batch, seed)):
        last = t == steps - 1
        for v in variants.values():
            v.load_state_dict(model.state_dict())
            for m in v.modules():  # count the compared step's casts only
                for s in getattr(m, "stats", {}).values():
                    s.update(overflow=0, underflow=0, nonfinite=0, numel=0)
        loss, grads = _step(model, x, y)
        for name, v in variants.items():
            if not last and name != "tensorwise, delayed":
                continue  # only delayed scaling needs the earlier steps (its amax history)
            l_v, g_v = _step(v, x, y, autocast=name == "bf16")
            if last:
                st = fp8_stats(v)
                count = {k: sum(r[k] for r in st.values()) for k in ("overflow", "underflow", "numel")}
                rows.append(Row(name, abs(l_v - loss) / loss, float((g_v - grads).norm() / grads.norm()),
                                count["overflow"], count["underflow"], count["numel"]))
        opt.step()
    return rows


def ranking(rows: list[Row]) -> list[str]:
    """The FP8 variants from the smallest gradient error to the largest."""
    return [r.name for r in sorted(rows[1:], key=lambda r: r.grad_error)]
