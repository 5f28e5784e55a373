"""A tensor-parallel GPT assembled from the layers of `layers.py` (Shoeybi et al. 2019, sec. 3).

The modules and parameter names mirror `distlab.models.GPT` (nanoGPT's c_attn, c_proj, c_fc), so a
dense state dict maps onto the shards name by name:

- `ParallelMLP`: c_fc column-parallel (4h/p outputs per rank), GELU on the local slice, c_proj
  row-parallel. One all-reduce forward (g after c_proj), one backward (f before c_fc).
- `ParallelSelfAttention`: c_attn column-parallel with whole heads per rank (n_head/p heads), attention
  on the local heads, c_proj row-parallel. Again one all-reduce in each direction.
- `ParallelGPT`: vocabulary-parallel token embedding, replicated position embedding and LayerNorms, the
  blocks, and an output layer that reuses the embedding's shard (the dense model ties lm_head to wte),
  trained with `vocab_parallel_cross_entropy`, so the full logits are never gathered.

`shard_state_dict` cuts a dense state dict into rank r's share; `gather_state_dict` glues the shards
back. c_attn packs [q | k | v]: each of q, k, v is split by heads, and the shard is [q_r | k_r | v_r]
(splitting the packed matrix into p row blocks would give rank 0 all of q and half of k when p = 2).

With `sequence_parallel=True` (Korthikanti et al. 2022, sec. 4.2.2) the residual stream, LayerNorms
and the embedding sum hold T/p positions per rank; after backward, `allreduce_sequence_parallel_grads`
sums the gradients of the parameters that saw only this rank's positions (LayerNorms, the position
embedding, the biases added after a reduce-scatter).
"""

from __future__ import annotations

import functools
import re
from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from distlab.comm_log import where as labelled
from distlab.models import GPTConfig
from distlab.tensor_parallel.comm import (
    Group,
    all_gather_seq,
    all_reduce,
    f,
    group_rank,
    group_size,
)
from distlab.tensor_parallel.layers import (
    REPLICATED,
    ColumnParallelLinear,
    Placement,
    RowParallelLinear,
    VocabParallelEmbedding,
    check_divisible,
    check_token_ids,
    shard_cols,
    shard_rows,
    vocab_parallel_cross_entropy,
)


def check_config(config: GPTConfig, tp_size: int) -> None:
    """Raise a ValueError naming the first size of `config` that `tp_size` does not divide."""
    if isinstance(tp_size, bool) or not isinstance(tp_size, int) or tp_size < 1:
        raise ValueError(f"tensor-parallel size {tp_size!r} must be a positive integer, e.g. 2")
    check_divisible("n_head", config.n_head, tp_size)
    check_divisible("n_embd", config.n_embd, tp_size)
    check_divisible("ffn size 4*n_embd", 4 * config.n_embd, tp_size)
    check_divisible("vocab_size", config.vocab_size, tp_size)
    if config.dropout:
        raise ValueError(f"dropout={config.dropout} is not supported by ParallelGPT (its random masks would "
                         "have to be coordinated across ranks); use dropout=0.0")


class ParallelMLP(nn.Module):
    """The feed-forward block split as Shoeybi et al. 2019 (sec. 3, fig. 3a) split it: column, GELU, row."""

    def __init__(self, config: GPTConfig, *, group: Group = None,
                 sequence_parallel: bool = False, name: str = "mlp") -> None:
        super().__init__()
        h = config.n_embd
        comm = {"group": group, "sequence_parallel": sequence_parallel}
        self.c_fc = ColumnParallelLinear(h, 4 * h, config.bias, name=f"{name}.c_fc", **comm)
        self.c_proj = RowParallelLinear(4 * h, h, config.bias, name=f"{name}.c_proj", **comm)

    def forward(self, x: Tensor) -> Tensor:
        return self.c_proj(F.gelu(self.c_fc(x)))


class ParallelSelfAttention(nn.Module):
    """Causal self-attention with the heads split across ranks (Shoeybi et al. 2019, sec. 3, fig. 3b).

    Each rank computes q, k and v for its n_head/p heads (c_attn, column-parallel), runs attention on
    them with no communication (heads are independent), and projects its heads' part of the output
    (c_proj, row-parallel), whose partial sums `g` adds.
    """

    def __init__(self, config: GPTConfig, *, group: Group = None,
                 sequence_parallel: bool = False, name: str = "attn") -> None:
        super().__init__()
        self.local_heads = check_divisible("n_head", config.n_head, group_size(group))
        self.head_size = config.n_embd // config.n_head
        h = config.n_embd
        comm = {"group": group, "sequence_parallel": sequence_parallel}
        self.c_attn = ColumnParallelLinear(h, 3 * h, config.bias, name=f"{name}.c_attn", chunks=3, **comm)
        self.c_proj = RowParallelLinear(h, h, config.bias, name=f"{name}.c_proj", **comm)

    def forward(self, x: Tensor) -> Tensor:
        qkv = self.c_attn(x)  # (B, T, 3 h/p) = [q_r | k_r | v_r]; T is the full sequence here
        B, T, _ = qkv.shape
        q, k, v = (t.view(B, T, self.local_heads, self.head_size).transpose(1, 2)
                   for t in qkv.split(self.local_heads * self.head_size, dim=2))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.c_proj(y.transpose(1, 2).reshape(B, T, -1))


class ParallelBlock(nn.Module):
    """A pre-norm transformer block (as `distlab.models.Block`) with parallel attention and MLP."""

    def __init__(self, config: GPTConfig, *, group: Group = None,
                 sequence_parallel: bool = False, name: str = "h.0") -> None:
        super().__init__()
        comm = {"group": group, "sequence_parallel": sequence_parallel}
        self.ln_1 = nn.LayerNorm(config.n_embd, bias=config.bias)
        self.attn = ParallelSelfAttention(config, name=f"{name}.attn", **comm)
        self.ln_2 = nn.LayerNorm(config.n_embd, bias=config.bias)
        self.mlp = ParallelMLP(config, name=f"{name}.mlp", **comm)

    def forward(self, x: Tensor) -> Tensor:
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class ParallelGPT(nn.Module):
    """`distlab.models.GPT`, tensor-parallel over `group` (Shoeybi et al. 2019, sec. 3).

    group: the tensor-parallel process group (None = the whole world, or one process without
    torch.distributed), e.g. `mesh["tp"].get_group()`; p is its size and r this rank's position in it.
    Its collectives are labelled with the dense names of the layers that call them ("h.0.attn.c_proj",
    "wte", "lm_head", "loss", "sp-grads"): an open `distlab.comm_log` records them.

    forward(idx, targets) returns this rank's logits, of shape (B, T, vocab_size / p) for the vocabulary
    ids [r V/p, (r+1) V/p), and the mean cross-entropy (identical on every rank) when targets are
    given; targets of -100 are ignored, as in F.cross_entropy. The output layer is the embedding shard
    itself (tied weights), so its gradient collects both uses, as in the dense model.
    """

    def __init__(self, config: GPTConfig, *, group: Group = None,
                 sequence_parallel: bool = False) -> None:
        super().__init__()
        check_config(config, group_size(group))
        self.config, self.group = config, group
        self.sequence_parallel = sequence_parallel
        comm = {"group": group, "sequence_parallel": sequence_parallel}
        self.wte = VocabParallelEmbedding(config.vocab_size, config.n_embd, name="wte", **comm)
        self.wpe = nn.Embedding(config.block_size, config.n_embd)
        self.h = nn.ModuleList(ParallelBlock(config, name=f"h.{i}", **comm) for i in range(config.n_layer))
        self.ln_f = nn.LayerNorm(config.n_embd, bias=config.bias)

    @property
    def tp_size(self) -> int:
        """p, the size of the tensor-parallel group."""
        return group_size(self.group)

    @property
    def tp_rank(self) -> int:
        """r, this rank's position in the tensor-parallel group."""
        return group_rank(self.group)

    @classmethod
    def from_dense(cls, dense: nn.Module, *, group: Group = None,
                   sequence_parallel: bool = False) -> ParallelGPT:
        """A ParallelGPT holding this rank's shard (its position in `group`) of the dense GPT's weights."""
        model = cls(dense.config, group=group, sequence_parallel=sequence_parallel)
        model = model.to(next(dense.parameters()))
        shard = shard_state_dict(dense.state_dict(), dense.config, model.tp_rank, model.tp_size)
        model.load_state_dict(shard)
        return model

    def _positions(self, T: int, device: torch.device) -> Tensor:
        """The positions this rank's residual stream holds: all T, or with sequence parallelism its T/p."""
        pos = torch.arange(T, device=device)
        if not self.sequence_parallel:
            return pos
        p, r = self.tp_size, self.tp_rank
        if T % p:
            raise ValueError(f"sequence length T={T} is not divisible by tensor-parallel size {p}; "
                             f"sequence parallelism keeps T/p positions per rank: use a T that is a "
                             f"multiple of {p}")
        return pos[r * (T // p):(r + 1) * (T // p)]

    def forward(self, idx: Tensor, targets: Tensor | None = None) -> tuple[Tensor, Tensor | None]:
        if idx.dim() != 2:
            raise ValueError(f"idx has shape {tuple(idx.shape)}; ParallelGPT takes token ids of shape "
                             "(B, T): add a batch dimension with idx.unsqueeze(0)")
        B, T = idx.shape
        if T > self.config.block_size:
            raise ValueError(f"sequence length {T} exceeds block_size={self.config.block_size}; "
                             f"crop the input to its last {self.config.block_size} tokens")
        if targets is not None:  # checked before any collective, so that every rank raises alike
            if targets.numel() != B * T:
                raise ValueError(f"targets have shape {tuple(targets.shape)}, but idx {tuple(idx.shape)} "
                                 f"needs B*T = {B * T} targets, one per token")
            targets = targets.reshape(B, T)
            check_token_ids(targets, self.config.vocab_size, "targets", ignore_index=-100)
        pos = self._positions(T, idx.device)
        x = self.wte(idx) + self.wpe(pos)
        for block in self.h:
            x = block(x)
        x = self.ln_f(x)
        enter = all_gather_seq if self.sequence_parallel else f
        logits = F.linear(enter(x, self.group, "lm_head"), self.wte.weight)  # (B, T, V/p)
        if targets is None:
            return logits, None
        return logits, vocab_parallel_cross_entropy(logits, targets, self.group)

    def sequence_parallel_params(self) -> list[nn.Parameter]:
        """Replicated parameters that, under sequence parallelism, see only this rank's positions."""
        params = dict(self.named_parameters())
        return [params[n] for n, pl in placements(self).items() if pl.dim is None]

    def allreduce_sequence_parallel_grads(self) -> None:
        """Sum the gradients of `sequence_parallel_params` over the group, in one flat all-reduce
        (Korthikanti et al. 2022, sec. 4.2.2). A no-op without sequence parallelism."""
        if not self.sequence_parallel:
            return
        params = [p for p in self.sequence_parallel_params() if p.grad is not None]
        with labelled("", phase="backward"):  # part of the backward pass, though autograd has finished
            flat = all_reduce(torch.cat([p.grad.reshape(-1) for p in params]), self.group, "sp-grads")
        offset = 0
        for p in params:
            p.grad.copy_(flat[offset:offset + p.numel()].view_as(p))
            offset += p.numel()


# ------------------------------------------------------------------ dense <-> shards


def placements(model: nn.Module) -> dict[str, Placement]:
    """Every parameter of `model` by name, with the placement its layer declares (`layers.Placement`);
    a parameter of any other module (LayerNorm, position embedding) is replicated."""
    out = {}
    for prefix, module in model.named_modules():
        declared = getattr(module, "placements", {})
        for name, _ in module.named_parameters(recurse=False):
            out[f"{prefix}.{name}" if prefix else name] = declared.get(name, REPLICATED)
    return out


@functools.cache
def _declared(p: int) -> dict[str, Placement]:
    """The placements of a one-block ParallelGPT, built on the meta device (no memory) with sizes that any
    group of p ranks divides; its names are the dense GPT's, with block 0 standing for every block."""
    config = GPTConfig(vocab_size=p, block_size=1, n_layer=1, n_head=p, n_embd=p)
    with torch.device("meta"):
        return placements(ParallelGPT(config))


def placement(name: str) -> Placement:
    """How ParallelGPT splits the dense GPT's parameter `name` ("h.3.attn.c_attn.weight"), as the layer
    that holds it declares; replicated for a name no layer splits. lm_head.weight, tied to wte.weight,
    is never stored on its own."""
    return _declared(group_size()).get(re.sub(r"^h\.\d+\.", "h.0.", name), REPLICATED)


def _shard(t: Tensor, pl: Placement, rank: int, size: int) -> Tensor:
    """Rank `rank`'s share of `t` under placement `pl`: each of its `chunks` parts split along `dim`."""
    if pl.dim is None:
        return t.clone()
    cut = shard_rows if pl.dim == 0 else shard_cols
    return torch.cat([cut(part, rank, size) for part in t.chunk(pl.chunks, dim=pl.dim)], dim=pl.dim).clone()


def shard_state_dict(state: dict[str, Tensor], config: GPTConfig, rank: int, size: int) -> dict[str, Tensor]:
    """Rank `rank`'s share (out of `size`) of a dense GPT state dict (or of its gradients, by name), cut as
    each layer declares (`placement`).

    Column-parallel weights keep rows, row-parallel weights keep columns (nn.Linear stores (out, in)),
    the embedding keeps its vocabulary rows, and q, k and v of c_attn are each split by heads.
    """
    check_config(config, size)
    if isinstance(rank, bool) or not isinstance(rank, int) or not 0 <= rank < size:
        raise ValueError(f"rank={rank!r} must be a position in the group, 0 .. {size - 1}")
    return {name: _shard(t, placement(name), rank, size) for name, t in state.items()
            if name != "lm_head.weight"}  # tied to wte.weight


def gather_state_dict(shards: Sequence[dict[str, Tensor]], config: GPTConfig,
                      tied: bool = True) -> dict[str, Tensor]:
    """The dense state dict rebuilt from every rank's shard, in rank order (the inverse of
    `shard_state_dict`). Replicated entries are taken from rank 0. `tied` adds lm_head.weight."""
    out = {}
    for name in shards[0]:
        parts, pl = [s[name] for s in shards], placement(name)
        if pl.dim is None:
            out[name] = parts[0].clone()
            continue
        pieces = [p.chunk(pl.chunks, dim=pl.dim) for p in parts]  # per rank: its slice of every chunk
        out[name] = torch.cat([torch.cat([pc[i] for pc in pieces], dim=pl.dim) for i in range(pl.chunks)],
                              dim=pl.dim)
    if tied and "wte.weight" in out:
        out["lm_head.weight"] = out["wte.weight"]
    return out


def grads_of(model: nn.Module) -> dict[str, Tensor]:
    """{name: gradient} of every parameter of `model` that has one (tied parameters listed once)."""
    return {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None}
