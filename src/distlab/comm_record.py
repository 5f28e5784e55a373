"""One collective call as data, and the bytes a ring algorithm sends for it: the vocabulary that
`distlab.comm_log` records and that every cost model predicts in (no processes, no dispatch).

What each record holds:
- `op`: the collective in chapter 1's words: all_reduce, all_gather, reduce_scatter, all_to_all,
  broadcast, reduce, gather, scatter, send, recv, barrier.
- `axis`: the mesh axis the group belongs to ("dp", "tp", a flattened "dp_cp", ...) when the log was
  given the mesh (or `groups=`); otherwise the group's name; "world" for the default group.
- `group_size` (p), `dtype`, `numel` and `nbytes`. `nbytes` (B) is chapter 1's convention, the size of
  the *whole* buffer the collective is about, the same on every rank:
    all_reduce, broadcast, reduce      the tensor (the reduced tensor)
    all_gather, gather                 the gathered output: p x this rank's input
    reduce_scatter, scatter            the full input: p x this rank's output
    all_to_all                         this rank's input buffer (all p chunks, its own included)
    send, recv                         the message
    barrier                            0
  The bytes a rank actually sends follow from B and p by `ring_bytes`.
- `where`: the labels open at the call, joined by "/" (outermost first): `log.where(label)` labels
  one log's records; the module-level `where(label)` labels every open log, for library code that
  does not know the log (a tensor-parallel layer labels its collectives with its name).
- `phase`: "backward" when the call runs inside autograd's backward pass, else "forward" (a `where`
  may set it for work that belongs to a phase but runs outside autograd, e.g. a gradient reduction).
- `peer`: for send and recv, the other rank's position in the group.
- `own_bytes`: for all_to_all, the bytes of this rank's chunk to itself, which never leave it; its
  `sent_bytes` is then exactly B - own_bytes, also for uneven splits (ring_bytes' (p-1)/p B when even).
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["RING_FACTOR", "CommRecord", "ring_bytes"]

# Bytes each rank sends under the ring (or chain) algorithm of chapter 1, as a multiple of B, for a group
# of p > 1 ranks (Patarasuk & Yuan 2009; Thakur, Rabenseifner & Gropp 2005). A ring reduce-scatter sends
# p - 1 chunks of B/p; an all-gather the same; an all-reduce is the two in turn. All-to-all sends every
# chunk but its own. Gather and scatter count the root's link, the busiest one. A pipelined broadcast or
# reduce passes the whole buffer along the chain once; a point-to-point message is sent once.
RING_FACTOR = {
    "all_reduce": lambda p: 2 * (p - 1) / p,
    "all_gather": lambda p: (p - 1) / p,
    "reduce_scatter": lambda p: (p - 1) / p,
    "all_to_all": lambda p: (p - 1) / p,
    "gather": lambda p: (p - 1) / p,
    "scatter": lambda p: (p - 1) / p,
    "broadcast": lambda p: 1.0 if p > 1 else 0.0,
    "reduce": lambda p: 1.0 if p > 1 else 0.0,
    "send": lambda p: 1.0,
    "recv": lambda p: 1.0,
    "barrier": lambda p: 0.0,
}


def ring_bytes(op: str, nbytes: float, group_size: int) -> float:
    """The bytes one rank sends for a collective about B = `nbytes` bytes on p = `group_size` ranks,
    with the ring algorithms of chapter 1 (Patarasuk & Yuan 2009): 2 (p-1)/p B for an all-reduce,
    (p-1)/p B for an all-gather, a reduce-scatter or an all-to-all, B for a broadcast and for a
    point-to-point message (for "recv" it is what arrives). p = 1 sends nothing but a message."""
    if op not in RING_FACTOR:
        raise ValueError(f"op={op!r} is not a collective the log knows; choose one of "
                         f"{', '.join(RING_FACTOR)}")
    if isinstance(group_size, bool) or not isinstance(group_size, int) or group_size < 1:
        raise ValueError(f"group_size={group_size!r} must be a positive integer (the ranks in the group)")
    if nbytes < 0:
        raise ValueError(f"nbytes={nbytes!r} must be >= 0 (the size of the buffer in bytes)")
    return RING_FACTOR[op](group_size) * nbytes


@dataclass(frozen=True)
class CommRecord:
    """One collective call, as this rank made it (see the module docstring for what B = `nbytes` is
    per op). A predicted record (a cost model's) has the same fields, with `dtype` "" when unknown."""

    op: str
    axis: str
    group_size: int
    nbytes: int
    numel: int
    where: str = ""
    phase: str = "forward"
    dtype: str = ""
    peer: int | None = None
    own_bytes: int | None = None

    @property
    def sent_bytes(self) -> float:
        """What this rank sends for this call under the ring algorithm (`ring_bytes`); 0 for a recv; for
        an all_to_all whose own chunk is known, exactly what leaves the rank."""
        if self.op == "recv":
            return 0.0
        if self.op == "all_to_all" and self.own_bytes is not None:
            return float(self.nbytes - self.own_bytes)
        return ring_bytes(self.op, self.nbytes, self.group_size)
