"""Ring attention against dense causal attention on the same seed: outputs and gradients of q, k, v.

The reference is the single-process `F.scaled_dot_product_attention(q, k, v, is_causal=True)` on the
whole sequence (PyTorch's built-in, the same softmax(q k^T / sqrt(d)) v of Vaswani et al. 2017). Every
rank builds the same full tensors from the seed, runs the reference, and compares its own shard of the
reference's output and gradients with what ring attention gives it (`distlab.parity.compare`). In
float64 the two agree to rounding (the block-wise sums add the same terms in another order), a few
1e-16; float64's tolerance in `distlab.parity.TOLERANCE` is 1e-10. Several ranks' reports make one with
`distlab.parity.merge`, whose `verdict()` a lab prints.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

import torch
import torch.distributed as dist
import torch.nn.functional as F

from distlab.context_parallel.layouts import check_layout, pad_to_multiple, padded_length, positions, shard
from distlab.context_parallel.ring import RingStats, ring_attention
from distlab.mesh import group_rank, group_size
from distlab.parity import ParityReport, compare


@dataclass
class CPParityReport(ParityReport):
    """`distlab.parity`'s report of one rank (output, dq, dk, dv against dense causal attention), with
    the layout and what its ring did: `RingStats`' blocks, score entries and bytes."""

    rank: int = 0
    layout: str = ""
    blocks: dict[str, int] = field(default_factory=dict)
    score_entries: int = 0
    bytes_forward: int = 0
    bytes_backward: int = 0

    @property
    def max_error(self) -> dict[str, float]:
        """The worst |difference| of the output and of each gradient, by name."""
        return self.flat()

    def to_dict(self) -> dict:
        out = asdict(self)
        out["dtype"] = str(self.dtype).removeprefix("torch.")
        return out


def _device(group: dist.ProcessGroup | None) -> torch.device:
    """Where this rank's tensors must live: its GPU on NCCL (which sends only CUDA tensors), else the CPU."""
    nccl = dist.is_initialized() and dist.get_backend(group) == "nccl"
    return torch.device("cuda", torch.cuda.current_device()) if nccl else torch.device("cpu")


def random_qkv(seed: int, batch: int, heads: int, seq_len: int, head_dim: int,
               dtype: torch.dtype = torch.float64) -> tuple[torch.Tensor, ...]:
    """q, k, v and an output gradient of shape (batch, heads, seq_len, head_dim), the same on every rank."""
    g = torch.Generator().manual_seed(seed)
    return tuple(torch.randn(batch, heads, seq_len, head_dim, generator=g, dtype=dtype, device="cpu")
                 for _ in range(4))


def attention_parity(layout: str = "zigzag", seed: int = 0, batch: int = 2, heads: int = 2,
                     seq_len: int = 24, head_dim: int = 8, dtype: torch.dtype = torch.float64,
                     group: dist.ProcessGroup | None = None, pad: bool = False) -> CPParityReport:
    """Run on every rank of `group`: ring attention forward and backward against the dense reference.
    pad: append zeros up to a length the layout can split (`layouts.pad_to_multiple`) and compare the
    real tokens only; without it a seq_len that does not split raises a ValueError naming seq_len."""
    check_layout(layout)
    p, r = group_size(group), group_rank(group, "context-parallel group")
    q, k, v, dout = (t.to(_device(group)) for t in random_qkv(seed, batch, heads, seq_len, head_dim, dtype))
    ref = [t.clone().requires_grad_() for t in (q, k, v)]
    ref_out = F.scaled_dot_product_attention(*ref, is_causal=True)
    ref_out.backward(dout)
    full_len = padded_length(seq_len, p, layout) if pad else seq_len
    real = (positions(r, p, full_len, layout) < seq_len).to(q.device)  # this rank's rows that are not padding

    def mine(t: torch.Tensor) -> torch.Tensor:
        return shard(pad_to_multiple(t, p, layout) if pad else t, r, p, layout)

    local = [mine(t).requires_grad_() for t in (q, k, v)]
    stats = RingStats()
    out = ring_attention(*local, group=group, layout=layout, stats=stats)
    out.backward(mine(dout))  # zero gradient on padded rows: they add nothing to dk, dv
    ours = {"output": out[..., real, :], "dq": local[0].grad[..., real, :], "dk": local[1].grad[..., real, :],
            "dv": local[2].grad[..., real, :]}
    want = {"output": mine(ref_out.detach())[..., real, :]} | {
        name: mine(t.grad)[..., real, :] for name, t in zip(("dq", "dk", "dv"), ref, strict=True)}
    report = compare(ours, want, dtype=dtype, label=layout, against="dense causal attention")
    return CPParityReport(report.differences, report.tolerance, report.dtype, report.label,
                          against=report.against, rank=r, layout=layout, blocks=dict(stats.blocks),
                          score_entries=stats.score_entries, bytes_forward=stats.bytes_forward,
                          bytes_backward=stats.bytes_backward)


def reports_label(reports: list[CPParityReport]) -> str:
    """What a list of rank reports covers, for `distlab.parity.merge(reports, label=reports_label(reports))`:
    "8 rank reports (contiguous, zigzag)"."""
    return f"{len(reports)} rank reports ({', '.join(sorted({rep.layout for rep in reports}))})"


def gpt_parity(layout: str = "zigzag", seed: int = 0, seq_len: int = 16, batch: int = 2,
               group: dist.ProcessGroup | None = None) -> ParityReport:
    """Run on every rank: the course GPT's loss and all its gradients with ring attention over `group`
    against the same GPT run densely on one process (float64)."""
    from distlab.context_parallel.layer import all_reduce_grads, cp_gpt_loss
    from distlab.models import GPT, GPTConfig

    torch.manual_seed(seed)
    config = GPTConfig(vocab_size=11, block_size=seq_len, n_layer=2, n_head=2, n_embd=16)
    dense = GPT(config).double().to(_device(group))
    ring = GPT(config).double().to(_device(group))
    ring.load_state_dict(dense.state_dict())
    g = torch.Generator().manual_seed(seed + 1)
    idx, targets = (torch.randint(0, config.vocab_size, (batch, seq_len), generator=g).to(_device(group))
                    for _ in range(2))
    _, ref_loss = dense(idx, targets)
    ref_loss.backward()
    loss = cp_gpt_loss(ring, idx, targets, group=group, layout=layout)
    loss.backward()
    all_reduce_grads(ring, group)
    total = loss.detach().clone()
    if group_size(group) > 1:
        dist.all_reduce(total, group=group)
    return compare({"loss": total, "gradients": {n: p.grad for n, p in ring.named_parameters()}},
                   {"loss": ref_loss.detach(), "gradients": {n: p.grad for n, p in dense.named_parameters()}},
                   label=f"GPT with ring attention ({layout})", against="the dense GPT")


def ulysses_parity(layout: str = "zigzag", seed: int = 0, batch: int = 2, heads: int = 4, kv_heads: int = 4,
                   seq_len: int = 24, head_dim: int = 8, dtype: torch.dtype = torch.float64,
                   group: dist.ProcessGroup | None = None, ring_group: dist.ProcessGroup | None = None,
                   ) -> ParityReport:
    """Run on every rank of `group` (and `ring_group`, for the hybrid): DeepSpeed-Ulysses (Jacobs et al.
    2023) forward and backward against dense causal attention (`F.scaled_dot_product_attention` with
    grouped-query heads when kv_heads < heads) on the whole sequence; this rank's shard of the output
    and of dq, dk, dv. With `ring_group`, the hybrid of Fang & Zhao 2024 (`ulysses.hybrid_shard`)."""
    from distlab.context_parallel.ulysses import hybrid_shard, ulysses_attention

    u, j = group_size(group), group_rank(group, "Ulysses group")
    r, i = (1, 0) if ring_group is None else (group_size(ring_group), group_rank(ring_group, "ring group"))
    g = torch.Generator().manual_seed(seed)
    shapes = (heads, kv_heads, kv_heads, heads)
    q, k, v, dout = (torch.randn(batch, a, seq_len, head_dim, generator=g, dtype=dtype, device="cpu")
                     .to(_device(group)) for a in shapes)  # the same numbers anywhere, on the rank's device
    ref = [t.clone().requires_grad_() for t in (q, k, v)]
    ref_out = F.scaled_dot_product_attention(*ref, is_causal=True, enable_gqa=kv_heads != heads)
    ref_out.backward(dout)

    def mine(t: torch.Tensor) -> torch.Tensor:
        return shard(t, j, u, layout) if ring_group is None else hybrid_shard(t, i, r, j, u, layout)

    local = [mine(t).requires_grad_() for t in (q, k, v)]
    out = ulysses_attention(*local, group=group, layout=layout, ring_group=ring_group)
    out.backward(mine(dout))
    ours = {"output": out, "dq": local[0].grad, "dk": local[1].grad, "dv": local[2].grad}
    want = {"output": mine(ref_out.detach())} | {n: mine(t.grad) for n, t in zip(("dq", "dk", "dv"), ref,
                                                                                  strict=True)}
    what = f"hybrid u={u} x r={r}" if ring_group is not None else f"Ulysses p={u}"
    return compare(ours, want, dtype=dtype, label=f"{what}, {heads}/{kv_heads} heads, {layout}",
                   against="dense causal attention")
