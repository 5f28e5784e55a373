"""What chapter 1's collectives do, computed on symbolic data: the facts the figures draw, and no drawing.

`apply_semantics` applies each collective's definition (MPI Forum 2021, "MPI: A Message-Passing Interface
Standard 4.0", ch. 6) to symbolic buffers. `ring_all_reduce_trace` replays `ring_all_reduce_schedule`, the
schedule that `ring_all_reduce` runs (Patarasuk & Yuan 2009), on symbolic data, so a wrong schedule gives a
wrong trace. The binomial-tree and recursive-doubling rounds follow Thakur, Rabenseifner & Gropp 2005, and
`hierarchical_all_reduce_trace` composes the semantics into the phases of `hierarchical_all_reduce`.
`figures` draws these traces; the tests check them without matplotlib.

A cell is a sum of symbolic terms, kept as a sorted tuple: ("A0", "B0") is rank 0's chunk 0 plus rank 1's
chunk 0 (rank r is the letter chr(65 + r)); None is a slot whose content is not defined.
"""

from __future__ import annotations

from collections.abc import Sequence

from distlab.collectives.ring import REDUCE_SCATTER, ring_all_reduce_schedule

COLLECTIVES = ("broadcast", "scatter", "gather", "reduce", "all_reduce", "all_gather", "reduce_scatter",
               "all_to_all")
Cell = tuple[str, ...] | None

def letter(rank: int) -> str:
    """The symbol of rank `rank`'s data: A, B, C, ..."""
    return chr(ord("A") + rank)


def _as_cell(c: str | Sequence[str] | None) -> Cell:
    return None if c is None else (c,) if isinstance(c, str) else tuple(sorted(c))


def _sum(cells: Sequence[Cell]) -> Cell:
    return None if any(c is None for c in cells) else tuple(sorted(t for c in cells for t in c))


def _split(buf: list[Cell], p: int, collective: str) -> list[list[Cell]]:
    if len(buf) % p:
        raise ValueError(f"{collective} splits a buffer of {len(buf)} cells into {p} equal chunks; "
                         f"give it a multiple of {p} cells")
    k = len(buf) // p
    return [buf[i * k:(i + 1) * k] for i in range(p)]


def apply_semantics(collective: str, buffers: Sequence[Sequence[str | Sequence[str] | None]],
                    root: int = 0) -> list[list[Cell]]:
    """Each rank's output buffer after `collective`, given each rank's input buffer (a list of cells).

    A cell is a term like "A0", a sequence of terms (a sum), or None. Ranks that receive nothing
    (all but the root in gather and reduce) get []. Sums are sorted tuples, so they compare exactly.
    """
    _check_semantics(collective, len(buffers), root)
    bufs = [[_as_cell(c) for c in b] for b in buffers]
    if collective in ("reduce", "all_reduce", "reduce_scatter"):
        return _reduce(collective, bufs, root)
    return _move(collective, bufs, root)


def _check_semantics(collective: str, p: int, root: int) -> None:
    if collective not in COLLECTIVES:
        raise ValueError(f"collective={collective!r} is not known; choose one of {', '.join(COLLECTIVES)}")
    if p == 0:
        raise ValueError("buffers=[] holds no rank; pass one buffer (a list of cells) per rank")
    if not 0 <= root < p:
        raise ValueError(f"root={root} is not one of the {p} ranks; choose a root in 0..{p - 1}")


def _move(collective: str, bufs: list[list[Cell]], root: int) -> list[list[Cell]]:
    """The collectives that only move cells: broadcast, scatter, gather, all-gather, all-to-all."""
    p = len(bufs)
    if collective == "broadcast":
        return [list(bufs[root]) for _ in range(p)]
    if collective == "scatter":
        return _split(bufs[root], p, collective)
    if collective in ("gather", "all_gather"):
        return _gather(collective, bufs, root)
    return _all_to_all(bufs)


def _gather(collective: str, bufs: list[list[Cell]], root: int) -> list[list[Cell]]:
    """Gather (the root gets every rank's cells, rank by rank) and all-gather (every rank gets them)."""
    joined = [c for b in bufs for c in b]
    return [list(joined) if collective == "all_gather" or r == root else [] for r in range(len(bufs))]


def _all_to_all(bufs: list[list[Cell]]) -> list[list[Cell]]:
    """All-to-all: rank i gets chunk i of every rank's buffer, in rank order."""
    p = len(bufs)
    parts = [_split(b, p, "all_to_all") for b in bufs]
    return [[c for j in range(p) for c in parts[j][i]] for i in range(p)]


def _reduce(collective: str, bufs: list[list[Cell]], root: int) -> list[list[Cell]]:
    """The collectives that add cells element by element: reduce, all-reduce, reduce-scatter."""
    p = len(bufs)
    if len({len(b) for b in bufs}) != 1:
        raise ValueError(f"{collective} adds buffers element by element, so they must be of equal length; "
                         f"got lengths {[len(b) for b in bufs]}")
    total = [_sum(cells) for cells in zip(*bufs, strict=True)]
    if collective == "reduce":
        return [list(total) if r == root else [] for r in range(p)]
    if collective == "all_reduce":
        return [list(total) for _ in range(p)]
    return _split(total, p, collective)  # reduce_scatter


def example_buffers(collective: str, p: int = 4, root: int = 0) -> list[list[Cell]]:
    """The input buffers the semantics figure starts from: rank r's chunk j is the term letter(r) + str(j)."""
    _check_p(p, "p", 1)
    if collective in ("broadcast", "scatter"):
        data = [(letter(root),)] if collective == "broadcast" else [(f"{letter(root)}{j}",) for j in range(p)]
        return [list(data) if r == root else [None] for r in range(p)]
    if collective in ("gather", "all_gather"):
        return [[(letter(r),)] for r in range(p)]
    if collective not in COLLECTIVES:
        apply_semantics(collective, [[None]])  # raises the ValueError that names the choices
    return [[(f"{letter(r)}{j}",) for j in range(p)] for r in range(p)]


def _check_p(p: int, name: str, low: int, high: int = 8) -> int:
    if isinstance(p, bool) or not isinstance(p, int) or not low <= p <= high:
        raise ValueError(f"{name}={p!r} must be an integer from {low} to {high} (the figures use one colour "
                         f"per rank), e.g. {name}=4")
    return p


def ring_all_reduce_trace(p: int) -> tuple[list, list[list[list[Cell]]]]:
    """Replay `ring_all_reduce_schedule(p)` on symbolic data: (schedule, states).

    states[k] is every rank's p chunks before step k (states[-1]: after the last step); rank r starts
    with letter(r) in every chunk. Reduce-scatter steps add the received chunk, all-gather steps copy it.
    Raises ValueError if a rank expects a chunk that its peer does not send it.
    """
    schedule = ring_all_reduce_schedule(_check_p(p, "p", 1))
    states = [[[(letter(r),) for _ in range(p)] for r in range(p)]]
    for k, step in enumerate(schedule):
        before, after = states[-1], [list(row) for row in states[-1]]
        for r, s in enumerate(step):
            peer = step[s.recv_from]
            if peer.send_to != r or peer.send_chunk != s.recv_chunk:
                raise ValueError(f"schedule step {k}: rank {r} expects chunk {s.recv_chunk} from rank "
                                 f"{s.recv_from}, which sends chunk {peer.send_chunk} to rank {peer.send_to}")
            incoming = before[s.recv_from][s.recv_chunk]
            old = before[r][s.recv_chunk]
            after[r][s.recv_chunk] = _sum([old, incoming]) if s.phase == REDUCE_SCATTER else incoming
        states.append(after)
    return schedule, states


def binomial_broadcast_steps(p: int, root: int = 0) -> list[list[tuple[int, int]]]:
    """The (src, dst) sends of each round of a binomial-tree broadcast (Thakur et al. 2005).

    With L = ceil(log2 p) rounds, in round k every rank that holds the data sends it 2^(L-1-k) ranks on
    (counted from the root): on 8 ranks, 0->4, then 0->2 and 4->6, then 0->1, 2->3, 4->5, 6->7.
    """
    _check_p(p, "p", 1, 64)
    if not 0 <= root < p:
        raise ValueError(f"root={root} is not one of the {p} ranks; choose a root in 0..{p - 1}")
    rounds = (p - 1).bit_length()
    steps = []
    for k in range(rounds):
        mask = 1 << (rounds - 1 - k)
        steps.append([((rel + root) % p, (rel + mask + root) % p) for rel in range(0, p, 2 * mask)
                      if rel + mask < p])
    return steps


def recursive_doubling_steps(p: int) -> list[tuple[str, list[tuple[int, int]]]]:
    """The rounds of recursive-doubling all-reduce as (kind, pairs) (Thakur et al. 2005).

    With q the largest power of two <= p and e = p - q: "fold", rank 2i sends its vector to rank 2i+1
    (i < e), which adds it, and rank 2i waits; then log2 q "exchange" rounds in which the q remaining
    ranks swap vectors with the partner whose new rank differs in bit k, and both add; "unfold", rank
    2i+1 sends the result back to rank 2i. A power of two has exchange rounds only.
    """
    _check_p(p, "p", 1, 64)
    q = 1 << (p.bit_length() - 1)
    extra = p - q
    real = [2 * i + 1 if i < extra else i + extra for i in range(q)]  # new rank -> rank
    rounds: list[tuple[str, list[tuple[int, int]]]] = []
    if extra:
        rounds.append(("fold", [(2 * i, 2 * i + 1) for i in range(extra)]))
    mask = 1
    while mask < q:
        rounds.append(("exchange", [(real[i], real[i ^ mask]) for i in range(q) if i < i ^ mask]))
        mask <<= 1
    if extra:
        rounds.append(("unfold", [(2 * i + 1, 2 * i) for i in range(extra)]))
    return rounds


def recursive_doubling_trace(p: int) -> list[list[Cell]]:
    """Each rank's symbolic vector after each round of `recursive_doubling_steps(p)` (states[0]: start)."""
    states = [[(letter(r),) for r in range(p)]]
    for kind, pairs in recursive_doubling_steps(p):
        old, new = states[-1], list(states[-1])
        for a, b in pairs:
            if kind == "exchange":
                new[a] = new[b] = _sum([old[a], old[b]])
            else:
                new[b] = _sum([old[a], old[b]]) if kind == "fold" else old[a]
        states.append(new)
    return states


def _hierarchical_phases(start: list[list[Cell]], groups: list[list[int]], leaders: list[int]
                         ) -> tuple[list[list[Cell]], list[list[Cell]], list[list[Cell]]]:
    """Every rank's vector after each phase: reduce to the leader, all-reduce among leaders, broadcast."""
    one = [list(v) for v in start]
    for ranks in groups:
        one[ranks[0]] = apply_semantics("reduce", [start[g] for g in ranks])[0]
    two = [list(v) for v in one]
    for g, out in zip(leaders, apply_semantics("all_reduce", [one[g] for g in leaders]), strict=True):
        two[g] = out
    three = [list(v) for v in two]
    for ranks in groups:
        for g, out in zip(ranks, apply_semantics("broadcast", [two[g] for g in ranks]), strict=True):
            three[g] = out
    return one, two, three


def hierarchical_all_reduce_trace(nodes: int = 2, ranks_per_node: int = 4
                                  ) -> list[tuple[str, list[list[Cell]], list[tuple[int, int]]]]:
    """The phases of `hierarchical_all_reduce` as (title, vectors, sends), from `apply_semantics`.

    Rank g sits on node g // ranks_per_node; each node's first rank is its leader. 1: binomial-tree
    reduce to the leader (the other ranks keep their own vector); 2: ring all-reduce among the leaders;
    3: binomial-tree broadcast from the leader. `sends` are the (src, dst) messages of the phase.
    """
    q = _check_p(ranks_per_node, "ranks_per_node", 1)
    p = _check_p(nodes, "nodes", 1) * q
    _check_p(p, "nodes * ranks_per_node", 1, 26)
    groups = [list(range(n * q, (n + 1) * q)) for n in range(nodes)]
    leaders = [g[0] for g in groups]
    tree = binomial_broadcast_steps(q)
    start = [[(letter(g),)] for g in range(p)]
    one, two, three = _hierarchical_phases(start, groups, leaders)
    up = [(ranks[d], ranks[s]) for step in reversed(tree) for s, d in step for ranks in groups]
    ring = list(zip(leaders, leaders[1:] + leaders[:1], strict=True)) if nodes > 1 else []
    down = [(ranks[s], ranks[d]) for step in tree for s, d in step for ranks in groups]
    return [("before", start, []), ("1. reduce to each\nnode's leader (tree)", one, up),
            ("2. all-reduce among\nleaders (ring)", two, ring),
            ("3. broadcast from\nthe leader (tree)", three, down)]
