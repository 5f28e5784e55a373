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

    def restart_peak(self) -> None:
        """Forget the peak so far: what follows is measured from the current total."""
        self.peak, self.peak_phase, self.peak_where = self.current, self.phase, self.where
        self.peak_alive = dict(self.alive)

    def repeat(self, name: str, count: int, net: int, rise: int, where: str, kind: str,
               reverse: bool = False) -> None:
        """`count` copies of one segment in a row that each change the total by `net` bytes and rise at most
        `rise` above where they start (a block's forward or backward, identical for every block); what they
        leave behind is one entry `name` of `count * net` bytes. The peak is on the first copy when net <= 0
        and on the last otherwise; `where` may hold `{}`, the copy's index (counted down with `reverse`, as
        backward visits the blocks)."""
        if kind not in KINDS:
            raise ValueError(f"kind={kind!r} is not one of {KINDS}")
        last = count - 1 if net > 0 else 0
        top = self.current + last * net + rise
        if count > 0 and top > self.peak:
            index = count - 1 - last if reverse else last
            self.peak, self.peak_phase, self.peak_where = top, self.phase, where.format(index)
            self.peak_alive = {**self.alive, name: (kind, last * net + rise)}
        self.alive[name] = (kind, self.alive.get(name, (kind, 0))[1] + count * net)
        self.current += count * net
