"""The vocabulary of a pipeline schedule: an `Action` of one rank, and a `Schedule`, every rank's list.

Stage s (model chunk s of p * v) lives on rank s % p. Messages are named after the stage that produces
them: `send_fwd(mb, s)` sends the output of stage s to the rank of stage s + 1, which receives it with
`recv_fwd(mb, s + 1)`; `send_bwd(mb, s)` sends the gradient of stage s's input to the rank of stage
s - 1, which receives it with `recv_bwd(mb, s - 1)` (names after Megatron-LM's `send_forward` and
`recv_backward`).
"""

from __future__ import annotations

from dataclasses import dataclass

COMPUTE = ("F", "B")
COMM = ("send_fwd", "recv_fwd", "send_bwd", "recv_bwd")


@dataclass(frozen=True)
class Action:
    """One step of one rank: `op` in F, B, send_fwd, recv_fwd, send_bwd, recv_bwd, on microbatch
    `microbatch` and stage `stage`; `peer` is the other rank of a send or receive (None for compute)."""

    op: str
    microbatch: int
    stage: int
    peer: int | None = None

    def __str__(self) -> str:
        where = f"{self.op}{self.microbatch}" if self.op in COMPUTE else f"{self.op}({self.microbatch})"
        return f"{where}@s{self.stage}" + ("" if self.peer is None else f"->r{self.peer}"
                                          if self.op.startswith("send") else f"<-r{self.peer}")


@dataclass(frozen=True)
class Schedule:
    """A schedule: `actions[r]` is rank r's ordered list of `Action`s for one training step."""

    name: str
    p: int  # ranks
    m: int  # microbatches
    v: int  # model chunks (virtual stages) per rank
    actions: tuple[tuple[Action, ...], ...]

    @property
    def num_stages(self) -> int:
        return self.p * self.v

    def rank_of(self, stage: int) -> int:
        return stage % self.p

    def compute_order(self, rank: int) -> list[Action]:
        """Rank `rank`'s F and B actions only, in order."""
        return [a for a in self.actions[rank] if a.op in COMPUTE]
