"""Distributed Muon's cost, predicted: bytes per rank per step, Newton-Schulz FLOPs per rank, state memory.

The model is a list of Muon matrices (shapes) and AdamW tensors (element counts), in the layouts' order;
e bytes per element (parameters and gradients share a dtype); N ranks; P = M + A elements, M in the
matrices and A in AdamW's tensors; s = ceil(P / N), the flat shard. B is `distlab.comm_log`'s B (the
whole buffer of each call), summed over the step's calls of one op, on one rank:

  (a) gather to owner (`owner.py`), the same on every rank:
      reduce    P e      (one reduce of every tensor to its owner)
      broadcast P e      (one broadcast of every tensor from its owner)
  (b) all-to-all (`all_to_all.py`), on rank r:
      reduce_scatter  N s e   and   all_gather  N s e  (ZeRO's flat buffer, padding included)
      all_to_all      (m_r + o_r) e, m_r the matrices' elements in r's shard (sent to the owners),
                      o_r the elements of the matrices r owns (sent back in pieces)

Bytes sent per rank (`comm_record.ring_bytes`): (a) 2 P e for N > 1 (a chained reduce and broadcast pass
the whole tensor once); (b) 2 (N-1)/N N s e + (m_r - k_r) e + (o_r - k_r) e, k_r the elements of r's own
matrices already in r's shard (they never leave it). For large N, (b) sends about 2 P e + 2 M e / N,
(a) 2 P e: the same order; (a) makes two calls per tensor, (b) four per step.

State per rank: (a) the momentum of the matrices r owns plus AdamW's two moments of the tensors it owns,
whole tensors, so uneven; (b) momentum on r's elements of the matrices and two moments on its elements of
AdamW's tensors: about (M + 2 A) e / N on every rank. ZeRO-1 with AdamW everywhere: 2 P e / N.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from torch import Tensor

from distlab.comm_record import ring_bytes
from distlab.memory.muon.flat_layout import FlatLayout, elements
from distlab.memory.muon.newton_schulz import NS_STEPS, newton_schulz_flops
from distlab.memory.muon.owners import greedy_owners, loads

Shape = tuple[int, int]


@dataclass(frozen=True)
class MuonModel:
    """The tensors a distributed Muon steps: Muon's `matrices` and AdamW's `others` (element counts)."""

    matrices: tuple[Shape, ...]
    others: tuple[int, ...] = ()

    @property
    def numels(self) -> tuple[int, ...]:
        return tuple(a * b for a, b in self.matrices) + tuple(self.others)

    def owners(self, world: int, steps: int = NS_STEPS) -> list[int]:
        """The matrices' owners, as both layouts compute them (`owners.greedy_owners`)."""
        return greedy_owners([newton_schulz_flops(s, steps) for s in self.matrices], world)

    def layout(self, world: int) -> FlatLayout:
        return FlatLayout(self.numels, world)


def from_parameters(muon: Sequence[tuple[str, Tensor]], adamw: Sequence[tuple[str, Tensor]]) -> MuonModel:
    """The `MuonModel` of named parameters as `split.split_parameters` returns them."""
    return MuonModel(tuple((p.shape[0], p.shape[1]) for _, p in muon), tuple(p.numel() for _, p in adamw))


def gpt_model(n_layer: int, d: int, vocab: int, block: int, bias: bool = True) -> MuonModel:
    """A GPT-2-shaped model (Radford et al. 2019): per block the attention's qkv (3d x d) and output
    (d x d), the MLP's (4d x d) and (d x 4d) to Muon; embeddings (tied head), norms and biases to AdamW."""
    matrices = [(3 * d, d), (d, d), (4 * d, d), (d, 4 * d)] * n_layer
    per_block = [d, d, d, d] + ([3 * d, d, 4 * d, d] if bias else [])  # 2 norms (weight, bias), biases
    others = [vocab * d, block * d, *per_block * n_layer, d, d]
    return MuonModel(tuple(matrices), tuple(others))


def owner_bytes(model: MuonModel, world: int, element_size: int) -> dict[str, int]:
    """Layout (a): B summed by op, on every rank."""
    total = sum(model.numels) * element_size
    return {"reduce": total, "broadcast": total}


def _pieces(model: MuonModel, world: int, rank: int, steps: int) -> tuple[int, int, int]:
    """(m_r, o_r, k_r) of the module docstring, in elements."""
    lay, owners = model.layout(world), model.owners(world, steps)
    matrices = list(range(len(model.matrices)))
    sends = lay.sends(rank, matrices, owners)
    m_r = sum(elements(p) for p in sends)
    o_r = sum(a * b for (a, b), q in zip(model.matrices, owners, strict=True) if q == rank)
    return m_r, o_r, elements(sends[rank])


def all_to_all_bytes(model: MuonModel, world: int, rank: int, element_size: int,
                     steps: int = NS_STEPS) -> dict[str, int]:
    """Layout (b): B summed by op, on `rank`."""
    flat = model.layout(world).padded * element_size
    m_r, o_r, _ = _pieces(model, world, rank, steps)
    return {"reduce_scatter": flat, "all_gather": flat, "all_to_all": (m_r + o_r) * element_size}


def sent_bytes(layout: str, model: MuonModel, world: int, rank: int, element_size: int,
               steps: int = NS_STEPS) -> float:
    """Bytes `rank` puts on the wire in one step (`comm_record.ring_bytes`; all-to-all: all but its own)."""
    if layout == "owner":
        return sum(ring_bytes(op, b, world) for op, b in owner_bytes(model, world, element_size).items())
    if layout == "all_to_all":
        flat = model.layout(world).padded * element_size
        m_r, o_r, k_r = _pieces(model, world, rank, steps)
        return 2 * ring_bytes("all_gather", flat, world) + (m_r + o_r - 2 * k_r) * element_size
    raise ValueError(f"layout={layout!r}; choose 'owner' or 'all_to_all'")


def flops_per_rank(model: MuonModel, world: int, steps: int = NS_STEPS) -> list[float]:
    """Newton-Schulz FLOPs on each rank with the layouts' owners (the same for (a) and (b))."""
    costs = [newton_schulz_flops(s, steps) for s in model.matrices]
    return loads(costs, model.owners(world, steps), world)


def state_bytes(layout: str, model: MuonModel, world: int, rank: int, element_size: int,
                steps: int = NS_STEPS) -> int:
    """Optimizer state on `rank`: "owner", "all_to_all", or "zero1_adamw" (AdamW on everything, ZeRO-1)."""
    lay, n_m = model.layout(world), len(model.matrices)
    if layout == "owner":
        mine = [a * b for (a, b), q in zip(model.matrices, model.owners(world, steps), strict=True)
                if q == rank]
        adamw_owners = greedy_owners(list(model.others), world)
        theirs = [k for k, q in zip(model.others, adamw_owners, strict=True) if q == rank]
        return (sum(mine) + 2 * sum(theirs)) * element_size
    local = [hi - lo for lo, hi in (lay.local(i, rank) for i in range(len(model.numels)))]
    if layout == "all_to_all":
        return (sum(local[:n_m]) + 2 * sum(local[n_m:])) * element_size
    if layout == "zero1_adamw":
        return 2 * sum(local) * element_size
    raise ValueError(f"layout={layout!r}; choose 'owner', 'all_to_all' or 'zero1_adamw'")


def calls(layout: str, model: MuonModel) -> int:
    """Collective calls per step: (a) a reduce and a broadcast per tensor; (b) four."""
    return 2 * len(model.numels) if layout == "owner" else 4


def step_seconds(layout: str, model: MuonModel, world: int, alpha: float, beta: float, flops_per_s: float,
                 element_size: int = 2) -> float:
    """The optimizer step's predicted time on the busiest rank, alpha-beta-gamma: every call pays
    (N - 1) alpha (a ring's or a chain's hops), the busiest rank's bytes pay beta each, and the busiest
    rank's Newton-Schulz FLOPs run at `flops_per_s` (the same owners in both layouts). No overlap."""
    sent = max(sent_bytes(layout, model, world, r, element_size) for r in range(world))
    hops = calls(layout, model) * (world - 1) * alpha
    return hops + sent * beta + max(flops_per_rank(model, world)) / flops_per_s
