"""Which rank broke a collective, and where: the first sequence number at which the ranks' records differ.

Every rank of a group must issue the same collectives in the same order with the same sizes; a rank that
skips one, issues two in another order, or passes a different size leaves the others waiting (a hang
until the group's timeout) or, worse, matched with the wrong call. Each rank's flight record
(`flight.CollectiveRecord`: sequence number, operation, sizes) is the evidence. Aligning the records by
sequence number, the first number at which the ranks disagree is where the job diverged; the rank(s)
whose call differs from the majority's are the culprits (the approach of PyTorch's flight-recorder
analyser, `torch.distributed.flight_recorder`, which looks for the first mismatched collective of a group).

What the records can tell apart, and what they cannot:
- "size": the odd rank called the same operation with sizes the others never use;
- "order": it called, at this number, a collective the others also issue, but elsewhere in their order
  (it skipped the expected one, or moved one: the records end at the hang, so the two look the same);
- "missing": it has no record at this number (it stopped before: skipped the last one, or is stuck
  outside communication);
- "other": some other operation.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from distlab.observe.flight import CollectiveRecord

KINDS = ("size", "order", "missing", "other")


@dataclass(frozen=True)
class Divergence:
    """Where the ranks' records first differ: the sequence number, the rank(s) that differ from the
    majority, what they called (None: nothing) and what the majority called, and the kind (see KINDS)."""

    seq: int
    ranks: tuple[int, ...]
    kind: str
    called: str | None
    expected: str | None

    def verdict(self) -> str:
        """The diagnosis in one sentence."""
        who = "rank " + ", ".join(str(r) for r in self.ranks)
        did = f"called {self.called}" if self.called else "issued nothing"
        why = {"size": "the same operation with different sizes",
               "order": "a collective the others issue elsewhere: it skipped one, or swapped two",
               "missing": "no collective at all: it stopped before this one",
               "other": "a different operation"}[self.kind]
        others = f"called {self.expected}" if self.expected else "issued nothing"
        return f"collective #{self.seq}: {who} {did} where the others {others} ({why})"


def _by_seq(records: Sequence[CollectiveRecord]) -> dict[int, CollectiveRecord]:
    out: dict[int, CollectiveRecord] = {}
    for r in records:
        if r.seq in out:
            raise ValueError(f"two records with sequence number {r.seq}; pass one group's records per rank")
        out[r.seq] = r
    return out


def _kind(mine: CollectiveRecord | None, seq: int, majority: Mapping[int, CollectiveRecord]) -> str:
    want = majority.get(seq)
    if mine is None:
        return "missing"
    if any(s != seq and r.signature == mine.signature for s, r in majority.items()):
        return "order"  # a call of the program, out of place (checked first: a skipped all-reduce can be
    if want is not None and mine.op == want.op:  # followed by another all-reduce of another size)
        return "size"
    return "other"


def _majority(tables: Mapping[int, dict[int, CollectiveRecord]], seq: int) -> tuple:
    votes = Counter(t[seq].signature if seq in t else None for t in tables.values())
    top = votes.most_common()
    if len(top) > 1 and top[0][1] == top[1][1]:  # a tie: prefer a call over nothing
        return next(sig for sig, n in top if n == top[0][1] and sig is not None)
    return top[0][0]


def diagnose(records: Mapping[int, Sequence[CollectiveRecord]]) -> Divergence | None:
    """The first divergence among the ranks' records of one group ({rank: records}), or None if they agree.

    Sequence numbers below the latest first entry of any rank are skipped (a ring buffer forgets the
    oldest). With two ranks a disagreement has no majority: the rank that issued less (or the higher
    rank, on a tie) is named."""
    if len(records) < 2:
        raise ValueError(f"records of {len(records)} rank(s): pass {{rank: records}} of at least 2 ranks")
    tables = {r: _by_seq(recs) for r, recs in records.items()}
    for seq in _common_seqs(tables):
        sigs = {r: (t[seq].signature if seq in t else None) for r, t in tables.items()}
        if len(set(sigs.values())) > 1:
            return _divergence(tables, sigs, seq)
    return None


def _common_seqs(tables: Mapping[int, dict[int, CollectiveRecord]]) -> range:
    """The sequence numbers to compare: from the latest first entry of any rank to the last of any (none
    when no rank has a record)."""
    nonempty = [t for t in tables.values() if t]
    if not nonempty:
        return range(0)
    return range(max(min(t) for t in nonempty), max(max(t) for t in nonempty) + 1)


def _divergence(tables: Mapping[int, dict[int, CollectiveRecord]], sigs: Mapping[int, object],
                seq: int) -> Divergence:
    """The divergence at `seq`, where the ranks' signatures `sigs` differ: the odd rank(s) against the
    majority."""
    want = _majority(tables, seq)
    odd = tuple(sorted(r for r, s in sigs.items() if s != want))
    if 2 * len(odd) == len(tables):  # no majority (two ranks): name the one that issued less
        odd = (max(odd, key=lambda r: (-len(tables[r]), r)),)
        want = next(sigs[r] for r in tables if r not in odd)
    model = next(r for r in tables if sigs[r] == want)
    majority = tables[model]
    mine = tables[odd[0]].get(seq)
    return Divergence(seq, odd, _kind(mine, seq, majority), mine.describe() if mine else None,
                      majority[seq].describe() if seq in majority else None)
