"""A transformer block with tensor-parallel attention and expert-parallel experts folded onto the same
ranks (Liu et al. 2025, arXiv 2504.14960), and its single-process reference.

`MoEBlock` (one process): h = x + attn(ln_1(x)), y = h + MoE(ln_2(h)), with chapter 5's dense
`CausalSelfAttention` and this chapter's `MoELayer`.

`FoldedMoEBlock` (one rank of a folded layout, `folding.fold_meshes`):

1. attention runs on the tp group with Megatron's column/row split (`ParallelSelfAttention`, chapter 5):
   every rank of a tp group holds the same x, its dp replica's sequences;
2. the MoE region splits the replica's tokens over the tp group (the tokens are flattened and rank t
   keeps the t-th of tp near-equal slices, as `torch.tensor_split` cuts them): `f` (identity forward,
   all-reduce backward) then a slice, so that each rank's gradient of its slice is summed back into the
   whole replicated activation;
3. `ExpertParallelMoE` routes the rank's slice and sends it to the experts' ranks over the ep group;
4. the slices come back together with `g` (all-reduce forward, identity backward) of the zero-padded
   slice, and are added to the residual stream.

Steps 2 and 4 are sequence parallelism's split and all-gather (Korthikanti et al. 2022, sec. 4.2.2)
written with the f/g pair, an all-reduce instead of an all-gather, so that the slices may be uneven.

Gradients (`reduce_gradients`), for a loss that is the mean over the dp replicas of each replica's
loss (as DDP averages): attention's shards and the LayerNorms are replicated over dp, so they are
averaged over dp; the router saw only the rank's slice of the tokens, so its gradient is summed over tp
(as sequence parallelism's LayerNorms) and averaged over dp; an expert's gradient after the backward
all-to-all already sums its ep group's tokens, so it is summed over edp, the replicas of the expert,
and divided by dp, the number of losses averaged (Megatron-Core's `expert_gradient_scaling_factor` =
1 / dp_cp size, torchtitan's `fsdp_gradient_divide_factor`): divided by edp instead, the experts would be
wrong whenever edp != dp.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import Tensor, nn

from distlab.comm_log import where
from distlab.mesh import group_rank, group_size
from distlab.models import CausalSelfAttention, GPTConfig
from distlab.moe.expert_parallel import ExpertParallelMoE
from distlab.moe.folding import FoldedMeshes, check_folding
from distlab.moe.gating import Routing
from distlab.moe.layer import MoELayer
from distlab.tensor_parallel.comm import f, g
from distlab.tensor_parallel.layers import Placement, shard_cols, shard_rows
from distlab.tensor_parallel.model import ParallelSelfAttention, placements


@dataclass
class BlockOutput:
    """The block's output, its MoE losses (mean over the GShard groups it routed) and their routings."""

    y: Tensor
    aux_loss: Tensor
    z_loss: Tensor
    routings: list[Routing]


def token_slices(num_tokens: int, parts: int) -> list[int]:
    """How many of `num_tokens` tokens each of `parts` ranks keeps: torch.tensor_split's cut, the first
    num_tokens % parts ranks one more."""
    return [len(c) for c in torch.tensor_split(torch.arange(num_tokens), parts)]


def _config(d_model: int, n_head: int) -> GPTConfig:
    return GPTConfig(vocab_size=1, block_size=1, n_layer=1, n_head=n_head, n_embd=d_model)


class MoEBlock(nn.Module):
    """One pre-norm transformer block whose feed-forward network is a mixture of experts, on one process
    (the reference of `FoldedMoEBlock`): h = x + attn(ln_1(x)), y = h + MoE(ln_2(h))."""

    def __init__(self, d_model: int, n_head: int, d_hidden: int, num_experts: int, k: int = 2,
                 capacity_factor: float = 1.25) -> None:
        super().__init__()
        config = _config(d_model, n_head)
        self.ln_1 = nn.LayerNorm(d_model)
        self.attn = CausalSelfAttention(config)
        self.ln_2 = nn.LayerNorm(d_model)
        self.moe = MoELayer(d_model, d_hidden, num_experts, k, capacity_factor)

    def forward(self, x: Tensor, group_sizes: list[int] | None = None) -> BlockOutput:
        """x: (B, T, d_model); group_sizes: the GShard groups the MoE routes (default: one)."""
        h = x + self.attn(self.ln_1(x))
        out = self.moe(self.ln_2(h), group_sizes)
        return BlockOutput(h + out.y, out.aux_loss, out.z_loss, out.routings)


class FoldedMoEBlock(nn.Module):
    """One rank's share of `MoEBlock` under parallel folding: attention over `meshes.attention["tp"]`,
    experts over `meshes.experts["ep"]` (module docstring). Build it with `from_reference`."""

    def __init__(self, d_model: int, n_head: int, d_hidden: int, num_experts: int, k: int,
                 capacity_factor: float, meshes: FoldedMeshes) -> None:
        super().__init__()
        sizes = meshes.sizes()
        check_folding(meshes.attention.mesh.numel(), tp=sizes["tp"], ep=sizes["ep"],
                      num_heads=n_head, num_experts=num_experts)
        self.tp_group = meshes.attention["tp"].get_group()
        self.ep_group = meshes.experts["ep"].get_group()
        self.ln_1 = nn.LayerNorm(d_model)
        self.attn = ParallelSelfAttention(_config(d_model, n_head), group=self.tp_group, name="attn")
        self.ln_2 = nn.LayerNorm(d_model)
        self.moe = ExpertParallelMoE(d_model, d_hidden, num_experts, k, capacity_factor, group=self.ep_group)

    @classmethod
    def from_reference(cls, ref: MoEBlock, meshes: FoldedMeshes) -> FoldedMoEBlock:
        """This rank's share of `ref`: its tp shard of attention, its E/ep experts, copies of the rest."""
        moe = ref.moe
        block = cls(ref.ln_1.normalized_shape[0], ref.attn.n_head, moe.experts[0].w_in.out_features,
                    moe.num_experts, moe.k, moe.capacity_factor, meshes)
        block.ln_1, block.ln_2 = copy.deepcopy(ref.ln_1), copy.deepcopy(ref.ln_2)
        rank, size = group_rank(block.tp_group), group_size(block.tp_group)
        dense = ref.attn.state_dict()
        shards = {name: shard(dense[name], pl, rank, size) for name, pl in placements(block.attn).items()}
        block.attn.load_state_dict(shards)
        block.moe = ExpertParallelMoE.from_reference(moe, block.ep_group)
        return block.to(next(ref.parameters()))

    def forward(self, x: Tensor) -> BlockOutput:
        """x: (B, T, d_model), this rank's dp replica's sequences (the same on every rank of its tp group)."""
        h = x + self.attn(self.ln_1(x))
        tokens = self.ln_2(h).reshape(-1, h.shape[-1])
        counts = token_slices(tokens.shape[0], group_size(self.tp_group))
        first = sum(counts[:group_rank(self.tp_group)])
        last = first + counts[group_rank(self.tp_group)]
        mine = f(tokens, self.tp_group, "moe.split")[first:last]
        out = self.moe(mine)
        padded = nn.functional.pad(out.y, (0, 0, first, tokens.shape[0] - last))
        y = g(padded, self.tp_group, "moe.gather").view_as(h)
        return BlockOutput(h + y, out.aux_loss, out.z_loss, [out.routing])

    def expert_parameters(self) -> list[nn.Parameter]:
        """The parameters of this rank's experts (split over ep, replicated over edp)."""
        return list(self.moe.experts.parameters())

    def reduce_gradients(self, meshes: FoldedMeshes) -> None:
        """Reduce every gradient after backward, as the module docstring derives: dense ones averaged
        over dp, the router's summed over tp and averaged over dp, the experts' summed over edp and
        divided by dp. Call it on every rank."""
        dp = meshes.attention.size(0)
        tp_group, dp_group = meshes.attention["tp"].get_group(), meshes.attention["dp"].get_group()
        edp_group = meshes.experts["edp"].get_group()
        experts = {id(p) for p in self.expert_parameters()}
        router = {id(p) for p in self.moe.router.parameters()}
        with where("grads", phase="backward"):
            for p in self.parameters():
                if p.grad is None:
                    continue
                if id(p) in experts:
                    dist.all_reduce(p.grad, group=edp_group)
                else:
                    if id(p) in router:
                        dist.all_reduce(p.grad, group=tp_group)
                    dist.all_reduce(p.grad, group=dp_group)
                p.grad /= dp

    def full_gradients(self, meshes: FoldedMeshes) -> dict[str, Tensor]:
        """Every gradient under `MoEBlock`'s names, whole: attention's shards gathered over tp, the
        experts gathered over ep in rank order (call after `reduce_gradients`, on every rank)."""
        out = {f"ln_{i}.{n}": p.grad.clone() for i, ln in ((1, self.ln_1), (2, self.ln_2))
               for n, p in ln.named_parameters()}
        out |= {f"moe.router.{n}": p.grad.clone() for n, p in self.moe.router.named_parameters()}
        params = dict(self.attn.named_parameters())
        for name, pl in placements(self.attn).items():
            out[f"attn.{name}"] = unshard(_gather(params[name].grad, self.tp_group), pl)
        per_rank = self.moe.experts_per_rank
        for j, expert in enumerate(self.moe.experts):
            for n, p in expert.named_parameters():
                for r, part in enumerate(_gather(p.grad, self.ep_group)):
                    out[f"moe.experts.{r * per_rank + j}.{n}"] = part
        return out


def _gather(t: Tensor, group: dist.ProcessGroup) -> list[Tensor]:
    """Every rank's `t`, in group-rank order."""
    parts = [torch.empty_like(t) for _ in range(group_size(group))]
    dist.all_gather(parts, t.contiguous(), group=group)
    return parts


def shard(t: Tensor, pl: Placement, rank: int, size: int) -> Tensor:
    """Rank `rank`'s share of a dense tensor under a tensor-parallel placement (chapter 5's `Placement`):
    each of its `chunks` parts cut along `dim`."""
    if pl.dim is None:
        return t.clone()
    cut = shard_rows if pl.dim == 0 else shard_cols
    return torch.cat([cut(part, rank, size) for part in t.chunk(pl.chunks, dim=pl.dim)], dim=pl.dim)


def unshard(parts: list[Tensor], pl: Placement) -> Tensor:
    """The dense tensor from every rank's share (the inverse of `shard`); a replicated one from rank 0."""
    if pl.dim is None:
        return parts[0].clone()
    pieces = [p.chunk(pl.chunks, dim=pl.dim) for p in parts]
    return torch.cat([torch.cat([pc[i] for pc in pieces], dim=pl.dim) for i in range(pl.chunks)], dim=pl.dim)
