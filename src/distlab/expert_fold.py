"""The experts' own parallel sizes over a layout's ranks: parallel folding (Liu et al. 2025, "MoE Parallel
Folding", arXiv 2504.14960, sec. 3; Megatron-Core's etp x ep x edp x pp).

Attention splits the world tp x cp x dp x pp (`distlab.layout.Layout`); the experts split the same ranks
etp x ep x edp x pp, with the same pipeline: `ExpertFold(ep=64, etp=1)` beside `Layout(dp=128, pp=16)` is
DeepSeek-V3's 2,048 GPUs (DeepSeek-AI 2024, sec. 3.2), edp = 2048 / (16 x 64 x 1) = 2. edp is derived,
never given: the folding must cover every rank once, so pp x ep x etp must divide the world. Chapter 6's
`distlab.moe.folding` builds these groups on running ranks; this is the sizes alone.
"""

from __future__ import annotations

from dataclasses import dataclass


def _whole(name: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name}={value!r} must be a positive integer (ranks along the experts' {name} "
                         f"axis), e.g. {name}=8; use {name}=1 not to split over it")
    return value


@dataclass(frozen=True)
class ExpertFold:
    """The experts' expert-parallel size `ep` and expert tensor-parallel size `etp`."""

    ep: int
    etp: int = 1

    def __post_init__(self) -> None:
        _whole("ep", self.ep)
        _whole("etp", self.etp)

    def edp(self, world_size: int, pp: int) -> int:
        """The experts' data-parallel size, world / (pp ep etp); a ValueError naming the sizes and the fix
        when that is not a whole number."""
        span = pp * self.ep * self.etp
        if world_size % span:
            ok = [d for d in range(1, world_size // pp + 1) if (world_size // pp) % d == 0]
            raise ValueError(f"the experts' pp x ep x etp = {pp} x {self.ep} x {self.etp} = {span} does not "
                             f"divide the world of {world_size} ranks, so edp = world / (pp ep etp) is not "
                             f"whole; choose ep x etp among {ok}")
        return world_size // span

    def check_experts(self, experts: int) -> None:
        """Every ep rank holds the same number of whole experts."""
        if experts % self.ep:
            ok = [d for d in range(1, experts + 1) if experts % d == 0]
            raise ValueError(f"ep={self.ep} does not divide experts={experts}: expert parallelism gives "
                             f"every rank the same number of experts; choose ep among {ok}")
