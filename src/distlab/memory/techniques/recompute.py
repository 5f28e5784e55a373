"""Activation recomputation (checkpointing) for the course's GPT: keep less, compute part of forward again.

`recompute_forward(model, idx, targets, plan)` computes exactly what `GPT.forward` computes (the same ops
in the same order, so the gradients are bitwise the same) but wraps parts of each block in
`torch.utils.checkpoint.checkpoint(..., use_reentrant=False)`: the wrapped part saves only its inputs, and
backward runs it again to get the rest. What each layer wraps is its entry in `plan`:

- ``"none"``: nothing, every activation is kept;
- ``"core"``: the attention core, softmax(q k^T / sqrt(d)) v: selective recomputation (Korthikanti et
  al. 2022, sec. 5), which drops the a s^2 b terms for a few percent more FLOPs;
- ``"mlp"``: the MLP, c_fc, GELU and c_proj; ``"core+mlp"``: both;
- ``"block"``: the whole block, which keeps only its input: full recomputation (Chen et al. 2016).

`segments` instead checkpoints runs of whole blocks, Chen et al.'s sqrt(n) scheme (sec. 4.1): each
segment keeps its input, and backward recomputes one segment at a time.

`plan_for_budget` is the cost-aware policy: under a memory budget it recomputes first what frees the
most bytes per recomputed FLOP, and keeps the rest.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor
from torch.utils.checkpoint import checkpoint

from distlab.memory.estimate import cost_model
from distlab.models import GPT, Block, CausalSelfAttention, GPTConfig, MLPBlock
from distlab.timing import median_seconds

LAYER_OPTIONS = ("none", "core", "mlp", "core+mlp", "block")
RECOMPUTE_POLICIES = ("none", "selective", "full")


def check_plan(plan: Sequence[str], n_layer: int) -> list[str]:
    """`plan` as a list, after checking it has one known option per layer."""
    plan = list(plan)
    if len(plan) != n_layer:
        raise ValueError(
            f"plan has {len(plan)} entries for a model of n_layer={n_layer}; give one option per "
            f"layer, e.g. {['block'] * n_layer}"
        )
    bad = [p for p in plan if p not in LAYER_OPTIONS]
    if bad:
        raise ValueError(f"plan has unknown option(s) {bad}; choose from {', '.join(LAYER_OPTIONS)}")
    return plan


def policy_plan(policy: str, n_layer: int) -> list[str]:
    """The per-layer plan of a named policy: none, selective (the attention core) or full (every block)."""
    named = {"none": "none", "selective": "core", "full": "block"}
    if policy not in named:
        raise ValueError(f"policy={policy!r} is unknown; choose none, selective or full (or pass a plan)")
    return [named[policy]] * n_layer


def attention_core(attn: CausalSelfAttention, qkv: Tensor) -> Tensor:
    """softmax(q k^T / sqrt(d)) v over all heads, from the packed c_attn output; returns (B, T, C)."""
    B, T, C3 = qkv.shape
    C = C3 // 3
    q, k, v = qkv.split(C, dim=2)
    q, k, v = (t.view(B, T, attn.n_head, C // attn.n_head).transpose(1, 2) for t in (q, k, v))
    y = F.scaled_dot_product_attention(
        q, k, v, dropout_p=attn.dropout if attn.training else 0.0, is_causal=True
    )
    return y.transpose(1, 2).contiguous().view(B, T, C)


def attention(attn: CausalSelfAttention, x: Tensor, recompute_core: bool) -> Tensor:
    qkv = attn.c_attn(x)
    y = (
        checkpoint(attention_core, attn, qkv, use_reentrant=False)
        if recompute_core
        else attention_core(attn, qkv)
    )
    return attn.resid_dropout(attn.c_proj(y))


def mlp(block: MLPBlock, x: Tensor) -> Tensor:
    return block.dropout(block.c_proj(block.gelu(block.c_fc(x))))


def block_forward(block: Block, x: Tensor, option: str = "none") -> Tensor:
    """One block under one plan option; the same arithmetic as `Block.forward`."""
    if option == "block":
        return checkpoint(block_forward, block, x, "none", use_reentrant=False)
    x = x + attention(block.attn, block.ln_1(x), option in ("core", "core+mlp"))
    if option in ("mlp", "core+mlp"):
        return x + checkpoint(mlp, block.mlp, block.ln_2(x), use_reentrant=False)
    return x + mlp(block.mlp, block.ln_2(x))


def _run_blocks(blocks: Sequence[Block], x: Tensor) -> Tensor:
    for block in blocks:
        x = block_forward(block, x)
    return x


def recompute_forward(
    model: GPT,
    idx: Tensor,
    targets: Tensor | None = None,
    plan: Sequence[str] | None = None,
    segments: Sequence[int] | None = None,
) -> tuple[Tensor, Tensor | None]:
    """`model(idx, targets)` with the recomputation of `plan` (one option per layer) or of `segments`
    (lengths of runs of blocks, each checkpointed as one; they must add up to n_layer)."""
    n = model.config.n_layer
    if plan is not None and segments is not None:
        raise ValueError("give either plan= (per layer) or segments= (runs of blocks), not both")
    B, T = idx.shape
    pos = torch.arange(T, device=idx.device)
    x = model.drop(model.wte(idx) + model.wpe(pos))
    if segments is not None:
        start = 0
        for length in check_segments(segments, n):
            x = checkpoint(_run_blocks, model.h[start : start + length], x, use_reentrant=False)
            start += length
    else:
        for block, option in zip(model.h, check_plan(plan or ["none"] * n, n), strict=True):
            x = block_forward(block, x, option)
    logits = model.lm_head(model.ln_f(x))
    if targets is None:
        return logits, None
    return logits, F.cross_entropy(logits.view(B * T, -1), targets.reshape(B * T))


def check_segments(segments: Sequence[int], n_layer: int) -> list[int]:
    """`segments` as a list, after checking they are positive and add up to `n_layer`."""
    segments = list(segments)
    if not segments or any((not isinstance(k, int)) or k < 1 for k in segments) or sum(segments) != n_layer:
        raise ValueError(
            f"segments={segments} must be positive lengths that add up to n_layer={n_layer}; "
            f"e.g. {cost_model.sqrt_segments(n_layer)} (sqrt_segments)"
        )
    return segments


# ------------------------------------------------------------------------ what each option saves and costs


@dataclass(frozen=True)
class LayerOption:
    """One way to run a layer: the bytes it keeps for backward and the forward FLOPs it recomputes."""

    name: str
    saved_bytes: float
    recompute_flops: float


def layer_options(
    config: GPTConfig, batch: int, seq: int, attention: str = "flash", dtype_bytes: int = 4
) -> dict[str, LayerOption]:
    """Bytes kept and FLOPs recomputed per layer for each plan option, with b, s, h, a from the config.

    FLOPs count the matmuls, 2 per multiply-add (Narayanan et al. 2021, sec. 5.1): the attention core
    4 b s^2 h, the MLP 16 b s h^2, c_attn and c_proj 8 b s h^2. The bytes are the terms of
    `cost_model.layer_activation_terms` that stay saved under each option.
    """
    b, s, h, a, e = batch, seq, config.n_embd, config.n_head, dtype_bytes
    full = cost_model.layer_bytes(s, b, h, a, e, attention, dropout=False, ln_stats=True)
    core = full - cost_model.layer_bytes(
        s, b, h, a, e, attention, dropout=False, ln_stats=True, recompute="selective"
    )
    mlp_saved = 8 * s * b * h * e  # the GELU input and the second matmul's input; the MLP input stays
    core_flops, mlp_flops, proj_flops = 4 * b * s * s * h, 16 * b * s * h * h, 8 * b * s * h * h
    return {
        "none": LayerOption("none", full, 0.0),
        "core": LayerOption("core", full - core, core_flops),
        "mlp": LayerOption("mlp", full - mlp_saved, mlp_flops),
        "core+mlp": LayerOption("core+mlp", full - core - mlp_saved, core_flops + mlp_flops),
        "block": LayerOption("block", s * b * h * e, core_flops + mlp_flops + proj_flops),
    }


def plan_for_budget(
    config: GPTConfig,
    batch: int,
    seq: int,
    budget_bytes: float,
    attention: str = "flash",
    dtype_bytes: int = 4,
) -> list[str]:
    """The cost-aware plan: the cheapest recomputation (in FLOPs) whose layers' saved bytes fit the budget.

    Greedy on bytes per FLOP: start from keep-all, and repeatedly move one layer to the option that frees
    the most bytes per extra recomputed FLOP, until the layers' saved bytes fit `budget_bytes`. Speed-centric
    keep-all and memory-centric full recomputation are the two ends of this path.
    """
    options = layer_options(config, batch, seq, attention, dtype_bytes)
    plan = ["none"] * config.n_layer
    least = config.n_layer * options["block"].saved_bytes
    if budget_bytes < least:
        raise ValueError(
            f"budget_bytes={budget_bytes:.0f} is below what full recomputation keeps, {least:.0f} "
            "bytes (one block input per layer); raise the budget, or shorten the micro-batch"
        )
    while sum(options[p].saved_bytes for p in plan) > budget_bytes:
        best: tuple[float, int, str] | None = None
        for i, current in enumerate(plan):
            now = options[current]
            for cand in options.values():
                freed, extra = now.saved_bytes - cand.saved_bytes, cand.recompute_flops - now.recompute_flops
                if freed > 0 and extra > 0 and (best is None or freed / extra > best[0]):
                    best = (freed / extra, i, cand.name)
        assert best is not None  # the budget is at least what all blocks keep, so a move exists
        plan[best[1]] = best[2]
    return plan


def plan_cost(
    config: GPTConfig,
    batch: int,
    seq: int,
    plan: Sequence[str],
    attention: str = "flash",
    dtype_bytes: int = 4,
) -> tuple[float, float]:
    """(bytes the layers keep, FLOPs recomputed) of a plan."""
    options = layer_options(config, batch, seq, attention, dtype_bytes)
    plan = check_plan(plan, config.n_layer)
    return sum(options[p].saved_bytes for p in plan), sum(options[p].recompute_flops for p in plan)


def time_recompute(
    config: GPTConfig,
    batch: int,
    policies: Sequence[str] = RECOMPUTE_POLICIES,
    repeats: int = 5,
    seed: int = 0,
) -> dict[str, dict[str, float]]:
    """Median seconds of one forward and backward of the GPT under each named policy, beside the predicted
    time: keep-all's time times (1 + recomputed FLOPs / the step's FLOPs), the step being 3 forwards
    (backward costs about twice forward; Narayanan et al. 2021, sec. 5.1). Full recomputation adds about
    one forward of the blocks, so about a third. A measurement: never asserted in tests."""
    torch.manual_seed(seed)
    model = GPT(config)
    g = torch.Generator().manual_seed(seed)
    idx = torch.randint(config.vocab_size, (batch, config.block_size), generator=g)
    seq, n = config.block_size, config.n_layer
    forward = n * (24 * batch * seq * config.n_embd**2 + 4 * batch * seq**2 * config.n_embd)
    forward += 2 * batch * seq * config.n_embd * config.vocab_size
    out: dict[str, dict[str, float]] = {}
    for policy in policies:
        plan = policy_plan(policy, n)
        def step(plan: list[str] = plan) -> None:
            recompute_forward(model, idx, idx, plan=plan)[1].backward()

        seconds = median_seconds(step, repeats, warmup=1, after=lambda: model.zero_grad(set_to_none=True))
        extra = plan_cost(config, batch, seq, plan)[1]
        out[policy] = {"seconds": seconds, "predicted_overhead": extra / (3 * forward)}
    base = out.get("none", {}).get("seconds")
    for v in out.values():
        v["measured_overhead"] = v["seconds"] / base - 1 if base else float("nan")
    return out
