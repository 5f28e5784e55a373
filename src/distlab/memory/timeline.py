"""Live bytes over one training step: the ledger behind every predicted peak of this chapter.

A prediction of a step's peak (`peak.predict_peak` for the course's GPT, `peak_zero` and `peak_pipeline`
for ZeRO and pipeline steps) walks the step op by op and calls `alloc` when an op's output comes into
being and `free` when its last user is done, as PyTorch's caching allocator sees it. `Timeline` keeps the
running total, and at its maximum remembers the phase, the op and every tensor alive, by kind (`KINDS`,
the same kinds `accounting.measure_step` measures, with the recomputed working set shown apart; Chen et
al. 2016, sec. 3).
"""

from __future__ import annotations

from dataclasses import dataclass, field

KINDS = ("params", "grads", "optimizer", "activations", "recomputed", "temporaries")


@dataclass
class Timeline:
    """Live bytes over one step: `alloc` and `free` named tensors; the peak remembers who was alive."""

    phase: str = "forward"
    where: str = ""
    alive: dict[str, tuple[str, int]] = field(default_factory=dict)  # name -> (kind, bytes)
    current: int = 0
    peak: int = 0
    peak_phase: str = "forward"
    peak_where: str = ""
    peak_alive: dict[str, tuple[str, int]] = field(default_factory=dict)

    def alloc(self, name: str, nbytes: float, kind: str = "temporaries") -> None:
        if kind not in KINDS:
            raise ValueError(f"kind={kind!r} is not one of {KINDS}")
        if name in self.alive:
            raise ValueError(f"tensor {name!r} is already alive; free it first")
        if nbytes <= 0:
            return
        self.alive[name] = (kind, int(nbytes))
        self.current += int(nbytes)
        if self.current > self.peak:
            self.peak, self.peak_phase, self.peak_where = self.current, self.phase, self.where
            self.peak_alive = dict(self.alive)

    def free(self, *names: str) -> None:
        for name in names:
            if name in self.alive:
                self.current -= self.alive.pop(name)[1]

    def parts(self) -> dict[str, int]:
        """Bytes alive at the peak, by kind."""
        out = dict.fromkeys(KINDS, 0)
        for kind, nbytes in self.peak_alive.values():
            out[kind] += nbytes
        return out
