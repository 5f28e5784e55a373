"""What Shampoo's and SOAP's preconditioners hold and send when sharded, beside AdamW's and Muon's state.

Shampoo (Gupta et al. 2018) preconditions an m x n matrix G by L^(-1/4) G R^(-1/4), with L (m x m) and
R (n x n) sums of G G^T and G^T G. Shi et al. 2023 (the distributed Shampoo of PyTorch, arXiv 2309.06497)
cut each dimension into blocks of at most `block` (their max_preconditioner_dim), keep for each block its
two factor matrices and their inverse roots, and spread the *blocks* over the data-parallel ranks: each
rank computes the search directions of its blocks and one all-gather per step gives every rank all of
them (the gradients are all-reduced first, as in DDP). SOAP (Vyas et al. 2024) runs Adam in the
eigenbasis of Shampoo's factors: per block L, R and their eigenvectors Q_L, Q_R, plus Adam's two moments
of the whole rotated matrix. Like Muon, neither is element-wise, so ZeRO's flat slices cannot hold them;
like Muon's owners, the unit of sharding is a whole block.

Counted here, for the model's matrices (the other parameters take AdamW under every optimizer), in
`element_size` bytes per value:
- state values per matrix: AdamW 2 m n; Muon m n (momentum); Shampoo sum over blocks of 2 (b1^2 + b2^2)
  (factors and inverse roots; its momentum and grafting state come on top and are left out); SOAP sum over
  blocks of 2 (b1^2 + b2^2) + 2 m n;
- bytes sent per rank per step: AdamW under ZeRO-1, a reduce-scatter and an all-gather, 2 (N-1)/N M e;
  Muon, layout (b) (`cost_model.sent_bytes`, the busiest rank); Shampoo and SOAP as Shi et al. distribute
  them, an all-reduce and an all-gather of the search directions, 3 (N-1)/N M e.
The state per rank is the total over N, the best a balanced assignment of blocks can do.
"""

from __future__ import annotations

from distlab.comm_record import ring_bytes
from distlab.memory.muon.cost_model import MuonModel, sent_bytes

OPTIMIZERS = ("AdamW", "Muon", "Shampoo", "SOAP")


def blocks(shape: tuple[int, int], block: int) -> list[tuple[int, int]]:
    """The blocks of an m x n matrix when each dimension is cut into pieces of at most `block`."""
    if block < 1:
        raise ValueError(f"block={block} must be a positive dimension (Shi et al.'s max_preconditioner_dim)")

    def cuts(d: int) -> list[int]:
        return [min(block, d - i) for i in range(0, d, block)]

    return [(a, b) for a in cuts(shape[0]) for b in cuts(shape[1])]


def state_values(optimizer: str, shape: tuple[int, int], block: int) -> int:
    """Optimizer state values for one m x n matrix (see the module docstring)."""
    m, n = shape
    factors = sum(2 * (a * a + b * b) for a, b in blocks(shape, block))
    values = {"AdamW": 2 * m * n, "Muon": m * n, "Shampoo": factors, "SOAP": factors + 2 * m * n}
    if optimizer not in values:
        raise ValueError(f"optimizer={optimizer!r}; choose one of {', '.join(OPTIMIZERS)}")
    return values[optimizer]


def sharded_rows(model: MuonModel, world: int, block: int, element_size: int = 4) -> list[dict]:
    """One row per optimizer: state per rank and bytes sent per rank per step, for `model`'s matrices."""
    matrices = MuonModel(model.matrices)  # the matrices alone: the others are AdamW's under every optimizer
    total = sum(a * b for a, b in model.matrices) * element_size
    sent = {"AdamW": 2 * ring_bytes("all_gather", total, world),
            "Muon": max(sent_bytes("all_to_all", matrices, world, r, element_size) for r in range(world)),
            "Shampoo": ring_bytes("all_reduce", total, world) + ring_bytes("all_gather", total, world)}
    sent["SOAP"] = sent["Shampoo"]
    rows = []
    for opt in OPTIMIZERS:
        state = sum(state_values(opt, s, block) for s in model.matrices) * element_size
        rows.append({"optimizer": opt, "state_per_value": state / total, "state_per_rank": state / world,
                     "sent_per_rank": sent[opt]})
    return rows


def markdown_table(model: MuonModel, world: int, block: int, element_size: int = 4) -> str:
    """The book's table: `sharded_rows` in MB (10^6 bytes)."""
    lines = ["| optimizer | state per matrix value | state per rank (MB) | sent per rank per step (MB) |",
             "| --- | --- | --- | --- |"]
    for r in sharded_rows(model, world, block, element_size):
        lines.append(f"| {r['optimizer']} | {r['state_per_value']:.2f} x | {r['state_per_rank'] / 1e6:.0f} | "
                     f"{r['sent_per_rank'] / 1e6:.0f} |")
    return "\n".join(lines)
