"""The book's distributed-Muon tables, written by `cost_model` (the chapter's text prints these strings; a
test checks that the book holds exactly them): bytes per rank per step and state per rank, by layout."""

from __future__ import annotations

from collections.abc import Sequence

from distlab.memory.muon.cost_model import MuonModel, all_to_all_bytes, owner_bytes, sent_bytes, state_bytes


def _mb(x: float) -> str:
    return f"{x / 1e6:.0f}"


def bytes_table(model: MuonModel, worlds: Sequence[int], element_size: int = 2) -> str:
    """Per layout and N: B summed per op (the busiest rank where ranks differ) and bytes sent, in MB."""
    lines = ["| layout | N | B per op, per rank (MB) | sent per rank, busiest (MB) |",
             "| --- | --- | --- | --- |"]
    for world in worlds:
        b = owner_bytes(model, world, element_size)
        ops = ", ".join(f"{op} {_mb(v)}" for op, v in b.items())
        sent_a = sent_bytes("owner", model, world, 0, element_size)
        lines.append(f"| (a) owner | {world} | {ops} | {_mb(sent_a)} |")
        per_rank = [all_to_all_bytes(model, world, r, element_size) for r in range(world)]
        ops = ", ".join(f"{op} {_mb(max(b[op] for b in per_rank))}" for op in per_rank[0])
        sent = max(sent_bytes("all_to_all", model, world, r, element_size) for r in range(world))
        lines.append(f"| (b) all-to-all | {world} | {ops} | {_mb(sent)} |")
    return "\n".join(lines)


def memory_table(model: MuonModel, worlds: Sequence[int], element_size: int = 4) -> str:
    """Per layout and N: optimizer state per rank, smallest and largest, in MB."""
    lines = ["| N | (a) owner: min / max (MB) | (b) all-to-all: min / max (MB) | ZeRO-1 AdamW: max (MB) |",
             "| --- | --- | --- | --- |"]
    for world in worlds:
        cells = []
        for layout in ("owner", "all_to_all"):
            s = [state_bytes(layout, model, world, r, element_size) for r in range(world)]
            cells.append(f"{_mb(min(s))} / {_mb(max(s))}")
        zero = max(state_bytes("zero1_adamw", model, world, r, element_size) for r in range(world))
        lines.append(f"| {world} | {cells[0]} | {cells[1]} | {_mb(zero)} |")
    return "\n".join(lines)
