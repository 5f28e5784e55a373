"""The tensor-parallel layers of Megatron-LM (Shoeybi et al. 2019, sec. 3), one matrix split p ways.

Every layer takes `group` (the tensor-parallel process group; None = the whole world, or one process
without torch.distributed); p is the group's size and r this rank's position in it. Each labels its
collectives with its `name`, which an open `distlab.comm_log` records. Weights keep `nn.Linear`'s
layout, (out_features, in_features), so y = x W^T + b. For a layer
Y = X A with A = W^T:

- `ColumnParallelLinear` splits A by columns (the *rows* of W): rank r holds out_features / p outputs
  and computes its slice Y_r = X A_r with no communication. Its input passes through `f`.
- `RowParallelLinear` splits A by rows (the *columns* of W): rank r holds in_features / p inputs, takes
  the matching slice X_r of the input, and computes a partial sum X_r A_r; `g` adds the partial sums.
  The bias is added once, after the sum.
- `VocabParallelEmbedding` splits the vocabulary: each rank looks up the ids it owns, writes zeros for
  the others, and `g` adds the ranks' rows.
- `vocab_parallel_cross_entropy` computes the loss from logits split over the vocabulary without ever
  gathering them: the max and the sum of exponentials are all-reduced, and the target's logit is found
  by a masked lookup on the rank that owns it, then all-reduced.

Token ids and targets are checked against the *whole* vocabulary on every rank (each rank holds the
whole id tensor), so an out-of-range id raises IndexError everywhere, as the dense model does, instead
of being looked up as zeros. Targets equal to `ignore_index` (-100) are skipped, as in F.cross_entropy.

With `sequence_parallel=True` (Korthikanti et al. 2022, sec. 4.2.2) the activations outside the layers
are split along the sequence (dim 1): the column layer all-gathers its input instead of `f`, and the row
layer reduce-scatters its output instead of `g`.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor, nn

from distlab.tensor_parallel.comm import (
    Group,
    all_gather_seq,
    all_reduce,
    f,
    g,
    group_rank,
    group_size,
    reduce_scatter_seq,
)

IGNORE_INDEX = -100  # F.cross_entropy's default


def check_divisible(name: str, value: int, tp_size: int) -> int:
    """`value // tp_size`, or a ValueError naming the value, the divisor and the fix."""
    check_features(name, value)
    if value % tp_size:
        divisors = [d for d in range(1, value + 1) if value % d == 0 and d <= 8]
        raise ValueError(f"{name}={value} is not divisible by tensor-parallel size {tp_size}; choose a size "
                         f"that divides {value} (e.g. {', '.join(map(str, divisors))})")
    return value // tp_size


def check_features(name: str, value: int) -> int:
    """`value`, or a ValueError unless it is a positive integer (a width of a layer)."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name}={value!r} must be a positive integer (a layer's width); e.g. {name}=64")
    return value


def check_token_ids(ids: Tensor, vocab_size: int, name: str = "idx", ignore_index: int | None = None) -> None:
    """Raise unless `ids` are integer ids in [0, vocab_size) (or `ignore_index`), naming the first bad one.

    TypeError for a non-integer dtype, IndexError (what nn.Embedding and F.cross_entropy raise) for an id
    outside the whole vocabulary. Run it on every rank: each holds all the ids, so all raise alike.
    """
    allowed = (torch.int64,) if ignore_index is not None else (torch.int64, torch.int32)
    if ids.dtype not in allowed:
        raise TypeError(f"{name} has dtype {ids.dtype}; token ids must be integers of dtype "
                        f"{' or '.join(map(str, allowed))}: convert with {name}.long()")
    if ids.is_meta:  # a dry run on the meta device (chapter 12): shapes only, no ids to check
        return
    bad = (ids < 0) | (ids >= vocab_size)
    if ignore_index is not None:
        bad &= ids != ignore_index
    if not bool(bad.any()):
        return
    where = [int(i) for i in torch.nonzero(bad)[0]]  # the first bad id, in row-major order
    also = f" (or ignore_index={ignore_index})" if ignore_index is not None else ""
    raise IndexError(f"{name}[{', '.join(map(str, where))}] = {int(ids[tuple(where)])} is outside the "
                     f"vocabulary: token ids must lie in [0, vocab_size={vocab_size}){also}; check the "
                     "tokenizer against the model's vocab_size")


@dataclass(frozen=True)
class Placement:
    """How a tensor-parallel layer splits one of its parameters over the group: along tensor dimension
    `dim` (None: the whole tensor on every rank), after cutting it into `chunks` equal parts along that
    dimension that are split one by one (c_attn packs [q | k | v]: each is split by heads). Each layer
    class declares its parameters' placements once (`placements`); `model.placement` reads them, and so
    do the shard/gather functions and the checkpoints of chapter 9."""

    dim: int | None
    chunks: int = 1


REPLICATED = Placement(None)


def shard_rows(w: Tensor, rank: int, size: int) -> Tensor:
    """Rows [rank k, (rank+1) k) of `w`, k = rows / size: a column-parallel shard of nn.Linear's weight."""
    k = check_divisible("rows", w.shape[0], size)
    return w[rank * k:(rank + 1) * k]


def shard_cols(w: Tensor, rank: int, size: int) -> Tensor:
    """Columns [rank k, (rank+1) k) of `w`, k = columns / size: a row-parallel shard of nn.Linear's weight."""
    k = check_divisible("columns", w.shape[-1], size)
    return w[..., rank * k:(rank + 1) * k]


class ColumnParallelLinear(nn.Module):
    """Y = X A with A split by columns across the tensor-parallel group (Shoeybi et al. 2019, sec. 3).

    Rank r holds `weight` = W[r k:(r+1) k] (k = out_features / p) and its bias slice, and returns its
    slice Y_r of the output (last dimension). The input passes through `f` (identity forward,
    all-reduce backward), or, with sequence parallelism, is all-gathered along the sequence. `chunks`:
    the output packs that many equal parts, each split over the ranks (3 for attention's q, k, v).
    """

    placements = {"weight": Placement(0), "bias": Placement(0)}  # W's rows (outputs), the bias likewise

    def __init__(self, in_features: int, out_features: int, bias: bool = True, *, group: Group = None,
                 sequence_parallel: bool = False, name: str = "column", chunks: int = 1) -> None:
        super().__init__()
        if chunks != 1:
            self.placements = {k: Placement(0, chunks) for k in self.placements}
        self.group = group
        self.name, self.sequence_parallel = name, sequence_parallel
        local = check_divisible(f"{name}.out_features", out_features, group_size(group))
        self.weight = nn.Parameter(torch.empty(local, check_features(f"{name}.in_features", in_features)))
        self.bias = nn.Parameter(torch.zeros(local)) if bias else None
        nn.init.normal_(self.weight, 0.0, 0.02)

    def forward(self, x: Tensor) -> Tensor:
        enter = all_gather_seq if self.sequence_parallel else f
        return nn.functional.linear(enter(x, self.group, self.name), self.weight, self.bias)


class RowParallelLinear(nn.Module):
    """Y = X A with A split by rows across the tensor-parallel group (Shoeybi et al. 2019, sec. 3).

    Rank r holds `weight` = W[:, r k:(r+1) k] (k = in_features / p) and takes X_r, the matching slice of
    the input's last dimension (what a column-parallel layer produced). X_r A_r is a partial sum; `g`
    (all-reduce forward, identity backward) adds the partial sums, or, with sequence parallelism, a
    reduce-scatter adds them and keeps this rank's slice of the sequence. The bias is replicated and
    added after the sum, so that it counts once.
    """

    placements = {"weight": Placement(1), "bias": REPLICATED}  # W's columns (inputs); the bias whole

    def __init__(self, in_features: int, out_features: int, bias: bool = True, *, group: Group = None,
                 sequence_parallel: bool = False,
                 name: str = "row") -> None:
        super().__init__()
        self.group = group
        self.name, self.sequence_parallel = name, sequence_parallel
        local = check_divisible(f"{name}.in_features", in_features, group_size(group))
        self.weight = nn.Parameter(torch.empty(check_features(f"{name}.out_features", out_features), local))
        self.bias = nn.Parameter(torch.zeros(out_features)) if bias else None
        nn.init.normal_(self.weight, 0.0, 0.02)

    def forward(self, x_parallel: Tensor) -> Tensor:
        partial = nn.functional.linear(x_parallel, self.weight)
        leave = reduce_scatter_seq if self.sequence_parallel else g
        y = leave(partial, self.group, self.name)
        return y if self.bias is None else y + self.bias


class VocabParallelEmbedding(nn.Module):
    """Token embedding with the vocabulary split across the group (Shoeybi et al. 2019, sec. 3).

    Rank r holds rows [r V/p, (r+1) V/p) of the V x h table. An id outside that range looks up row 0 and
    is zeroed; `g` adds the ranks' results, so each token receives its row from the one rank that owns
    it. With sequence parallelism the sum is a reduce-scatter along the sequence instead. The same
    `weight` serves as the output layer when the embeddings are tied (see `model.ParallelGPT`).
    """

    placements = {"weight": Placement(0)}  # the vocabulary's rows

    def __init__(self, vocab_size: int, embedding_dim: int, *, group: Group = None,
                 sequence_parallel: bool = False,
                 name: str = "wte") -> None:
        super().__init__()
        self.group = group
        self.name, self.sequence_parallel = name, sequence_parallel
        self.vocab_size = vocab_size
        self.per_rank = check_divisible("vocab_size", vocab_size, group_size(group))
        self.weight = nn.Parameter(torch.empty(self.per_rank, embedding_dim))
        nn.init.normal_(self.weight, 0.0, 0.02)

    @property
    def start(self) -> int:
        """The first vocabulary id this rank owns, r V/p."""
        return group_rank(self.group) * self.per_rank

    def forward(self, idx: Tensor) -> Tensor:
        check_token_ids(idx, self.vocab_size, "idx")
        local = idx - self.start
        outside = (local < 0) | (local >= self.per_rank)
        rows = nn.functional.embedding(local.masked_fill(outside, 0), self.weight)
        rows = rows.masked_fill(outside.unsqueeze(-1), 0.0)
        leave = reduce_scatter_seq if self.sequence_parallel else g
        return leave(rows, self.group, self.name)


class _VocabParallelCrossEntropy(torch.autograd.Function):
    """Per-token cross-entropy from vocabulary-sharded logits (0 where the target is ignored), with a
    hand-written backward that needs no communication: d loss / d logits = softmax - one_hot(target),
    both computable from the local slice, and 0 for ignored targets."""

    @staticmethod
    def forward(ctx, logits: Tensor, targets: Tensor, start: int, valid: Tensor,  # type: ignore[override]
                group: Group, where: str) -> Tensor:
        # 1. the global max of each row, for a numerically safe exponential
        row_max = all_reduce(logits.max(dim=-1).values, group, where, op=torch.distributed.ReduceOp.MAX)
        shifted = logits - row_max.unsqueeze(-1)
        # 2. the target's (shifted) logit: the owner looks it up, the others contribute 0
        local = targets - start
        outside = (local < 0) | (local >= logits.shape[-1])
        picked = shifted.gather(-1, local.masked_fill(outside, 0).unsqueeze(-1)).squeeze(-1)
        target_logit = all_reduce(picked.masked_fill(outside, 0.0), group, where)
        # 3. the global sum of exponentials
        exp = shifted.exp()
        sum_exp = all_reduce(exp.sum(dim=-1), group, where)
        loss = (sum_exp.log() - target_logit).masked_fill(~valid, 0.0)  # -log softmax(target), per token
        softmax = exp / sum_exp.unsqueeze(-1)
        ctx.save_for_backward(softmax, local, outside, valid)
        return loss

    @staticmethod
    def backward(ctx, grad_loss: Tensor) -> tuple[Tensor | None, ...]:  # type: ignore[override]
        softmax, local, outside, valid = ctx.saved_tensors
        grad = softmax.clone()
        hit = (~outside).unsqueeze(-1).to(grad.dtype)
        grad.scatter_add_(-1, local.masked_fill(outside, 0).unsqueeze(-1), -hit)
        scale = torch.where(valid, grad_loss, 0.0).unsqueeze(-1)  # 0 for ignored targets, even if inf
        return grad * scale, None, None, None, None, None


def vocab_parallel_cross_entropy(logits: Tensor, targets: Tensor, group: Group = None, where: str = "loss",
                                 ignore_index: int = IGNORE_INDEX) -> Tensor:
    """Mean cross-entropy of `targets` (...,) under logits split over the vocabulary: this rank holds
    logits (..., V/p) for ids [r V/p, (r+1) V/p). Three all-reduces of one number per token (max, target
    logit, sum of exponentials) replace gathering (..., V) logits (Shoeybi et al. 2019, sec. 3).

    As F.cross_entropy: targets equal to `ignore_index` count neither in the loss nor in the mean (and
    get zero gradient); if every target is ignored the mean is 0/0 = nan. Targets outside the whole
    vocabulary [0, V) raise IndexError on every rank.
    """
    if tuple(targets.shape) != tuple(logits.shape[:-1]):
        raise ValueError(f"targets have shape {tuple(targets.shape)} but the logits {tuple(logits.shape)} "
                         f"need one target per row: shape {tuple(logits.shape[:-1])}")
    p = group_size(group)
    check_token_ids(targets, logits.shape[-1] * p, "targets", ignore_index)
    valid = targets != ignore_index
    start = group_rank(group) * logits.shape[-1]
    loss = _VocabParallelCrossEntropy.apply(logits, targets, start, valid, group, where)
    return loss.sum() / valid.sum()
