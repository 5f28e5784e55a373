"""The bytes an MoE step moves, and where: one layer's four all-to-alls, the servers an ep group spans,
and the pipeline's point-to-point messages, for `moe_cost.MoEConfig` (whose docstring derives them).

`moe_cost` prices these bytes in seconds; chapter 12's dry run (`distlab.dryrun.moe_report`) records the
same messages on a fake process group and compares them with these functions, byte for byte.
"""

from __future__ import annotations

from typing import Protocol

from distlab.layout import Layout
from distlab.model_shape import ModelShape
from distlab.plan.inputs import ClusterSpec


class MoEConfig(Protocol):
    """What these functions read of a `moe_cost.MoEConfig` (named as a protocol so that this file, which
    `moe_cost` imports, does not import it back)."""

    shape: ModelShape
    layout: Layout
    cluster: ClusterSpec
    micro_batch: int

    @property
    def microbatches(self) -> int: ...

    @property
    def tokens_per_rank(self) -> int: ...


class MoEAssumptions(Protocol):
    """What `a2a_bytes` reads of a `moe_cost.MoEAssumptions`."""

    fp8_dispatch: bool


def a2a_bytes(c: MoEConfig, a: MoEAssumptions) -> list[int]:
    """The buffers of one MoE layer's 4 all-to-alls on one rank and micro-batch, T k h b bytes each: the
    forward dispatch (1-byte values with `fp8_dispatch`), the forward combine and the two of the backward."""
    rows = c.tokens_per_rank * c.shape.moe.top_k * c.shape.hidden
    return [rows * (1 if a.fp8_dispatch else 2)] + [rows * 2] * 3


def a2a_nodes(c: MoEConfig) -> int:
    """The servers one ep group spans: its ep etp consecutive ranks (Megatron-Core's order, module
    docstring) fit in one server (1) or fill n whole servers; a group that straddles servers unevenly (12
    ranks on servers of 8) is refused, since its traffic would be neither of the two priced here."""
    span, gpn = c.layout.expert_sizes["ep"] * c.layout.expert_sizes["etp"], c.cluster.gpus_per_node
    if span <= gpn and gpn % span == 0:
        return 1
    if span > gpn and span % gpn == 0:
        return span // gpn
    raise ValueError(f"the ep x etp group of {span} consecutive ranks straddles servers of {gpn} GPUs "
                     f"unevenly; choose ep x etp that divides {gpn} or is a multiple of it")


def p2p_message_bytes(c: MoEConfig) -> int:
    """One pipeline message, an activation or its gradient: b (s/c) h / t bf16 values (module docstring)."""
    return c.micro_batch * (c.shape.seq // c.layout.size("cp")) * c.shape.hidden * 2 // c.layout.size("tp")


def p2p_bytes(c: MoEConfig, stage: int, microbatches: int | None = None) -> dict[str, tuple[int, int]]:
    """(messages, bytes) the rank of pipeline `stage` sends in one 1F1B step of `microbatches` (default the
    config's m): "fwd", one activation per micro-batch on every stage but the last; "bwd", one gradient per
    micro-batch on every stage but the first (Narayanan et al. 2021, sec. 2.2; v = 1)."""
    pp, m = c.layout.size("pp"), microbatches or c.microbatches
    if not 0 <= stage < pp:
        raise ValueError(f"stage={stage} is not a pipeline stage of pp={pp}; choose 0 <= stage < {pp}")
    fwd = m if stage < pp - 1 else 0
    bwd = m if stage > 0 else 0
    one = p2p_message_bytes(c)
    return {"fwd": (fwd, fwd * one), "bwd": (bwd, bwd * one)}
