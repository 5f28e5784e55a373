"""One rank of a published MoE layout runs its pipeline stage's whole step on the meta device and the fake
process group: every layer of its stage, the 1F1B schedule, its point-to-point messages, its all-to-alls,
its model states and the peak of what it holds.

`stage_step(ms, layout, rank)` builds the rank's stage with `moe_rank.stage_modules` (the parameters
chapter 7's `moe_states` counts), in bf16, and walks chapter 4's 1F1B schedule for its pipeline position
(`pipeline.schedules.one_f_one_b_schedule`, PipeDream-Flush: Narayanan et al. 2021, sec. 2.2.1): p - k - 1
warm-up forwards on stage k held, then one forward and one backward at a time, then the cool-down
backwards. A forward (`moe_layer.mla_forward` or `gqa_forward`, then `moe_rank.moe_forward` or a dense
SwiGLU) runs on the micro-batch received from stage k - 1 (`dist.recv` of b s h bf16 values), or on the
token ids on the first stage (the embedding); the last stage ends with the final RMSNorm, the output layer
and the cross-entropy in fp32. Every send and receive is a real `dist.send` / `dist.recv` to the rank of
the neighbouring stage (pp is the outermost axis), which `distlab.comm_log` records with its bytes.

What it holds is counted on the tensors:

- parameters: the stage's distinct parameter storages; gradients: the `.grad` storages backward filled
  (`held.gradient_watch`); optimizer: a real `torch.optim.Adam` stepped on this rank's ZeRO-1 shard of
  each group (the dense parameters over dp x cp, the experts over edp; Rajbhandari et al. 2020, DeepSeek-AI
  2024 sec. 3.2): the fp32 master shard and its two moments;
- activations: the peak over the schedule of the bytes autograd saved for the micro-batches in flight,
  each storage once, parameters and rotary tables left out, from a micro-batch's forward to the end of its
  backward. A stage's output, which it keeps to call backward on, is not counted: Megatron-LM frees its
  data once it is sent (`deallocate_output_tensor`), keeping only the graph;
- buffers: one MoE layer's forward all-to-all buffers, the send and the receive tensor of the dispatch and
  of the combine (the log's B is the send buffer; balanced routing makes the receive buffer the same size).

With `savings` (chapter 7's `moe_savings.Savings`) the layers run DeepSeek-V3's recomputation and FP8
activation caching (`moe_savings_step`), and the saved bytes are those of the cached forms.

These are the quantities chapter 7's `moe_activations.moe_stage_peaks` estimates and chapter 9's
`plan.moe_cost` prices (`a2a_bytes`, `p2p_bytes`). With tp > 1 (Megatron-Bridge's H100 row) the stage runs
under the sequence parallelism Megatron-Core requires with experts: the messages and the residual stream
are the rank's T / tp tokens; each layer all-gathers them for attention (on all T, heads split) and
reduce-scatters its output, as `moe_layer.whole_layer_step` does; a dense layer's MLP, the output layer and
the loss likewise run on all T, the embedding's partial sums are reduce-scattered. Interleaved stages (vp)
run as 1F1B over the same layers; the savings run with tp = 1 only.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import Tensor, nn

from distlab.comm_log import comm_log
from distlab.dryrun.fake_world import fake_world
from distlab.dryrun.held import gradient_watch, storage_key
from distlab.dryrun.moe_layer import _residual, gqa_forward, mla_forward
from distlab.dryrun.moe_rank import FusedRMSNorm, _ep_group, moe_forward, stage_modules
from distlab.dryrun.moe_savings_step import CachedSaves, dense_ffn, head, mark_rules, mla_attention, moe_half
from distlab.dryrun.moe_sequence_parallel import tp_group_ranks
from distlab.layout import Layout
from distlab.memory.estimate import shape as stages
from distlab.memory.estimate.moe_savings import NONE, Savings
from distlab.model_shape import ModelShape
from distlab.pipeline.schedules import one_f_one_b_schedule
from distlab.tensor_parallel.comm import all_gather_seq, reduce_scatter_seq

__all__ = ["StageStep", "stage_step"]


@dataclass(frozen=True)
class StageStep:
    """One rank's whole step (module docstring): its messages, all-to-alls and held bytes."""

    rank: int
    stage: int
    microbatches: int
    sends: dict[str, tuple[int, int]]  # "fwd" / "bwd": (messages sent, bytes)
    receives: dict[str, tuple[int, int]]
    a2a_calls: int
    a2a_bytes: int  # the sum of the all-to-alls' whole buffers B
    params: int
    grads: int
    optimizer: int
    activations: int  # the peak of the saved bytes of the micro-batches in flight
    in_flight: int  # micro-batches held at that peak
    buffers: int  # one MoE layer's dispatch and combine buffers (0 on a stage without MoE layers)

    @property
    def model_states(self) -> int:
        return self.params + self.grads + self.optimizer

    @property
    def total(self) -> int:
        return self.model_states + self.activations + self.buffers


class _Stage:
    """The stage's modules and how one micro-batch runs through them (module docstring)."""

    def __init__(self, ms: ModelShape, layout: Layout, stage: int, micro_batch: int, groups: tuple,
                 savings: Savings = NONE) -> None:
        self.ms, self.b, self.groups, self.stage, self.savings = ms, micro_batch, groups, stage, savings
        self.first, self.last = stage == 0, stage == layout.size("pp") - 1
        self.mods = stage_modules(ms, layout, stage).to(torch.bfloat16)
        start = sum(stages.stage_layers(ms.layers, layout.size("pp"))[:stage])
        self.moe = [start + i >= ms.moe.dense_layers for i in range(len(self.mods["layers"]))]
        rope = ms.moe.mla.qk_rope if ms.moe.mla else ms.moe.head_dim or ms.hidden // ms.heads
        with torch.device("meta"):
            self.tables = (torch.empty(ms.seq, rope, dtype=torch.bfloat16),) * 2
        self.weights = {storage_key(p) for p in [*self.mods.parameters(), *self.tables]}
        self.rules: list[str] = []  # the saving rule of the linear layer running now (moe_savings_step)
        if savings.fp8:
            mark_rules(self.mods, self.rules)

    def _moe_view(self, layer: nn.ModuleDict) -> nn.ModuleDict:
        """The layer's MoE half in the names `moe_forward` reads (the same parameters)."""
        view = nn.ModuleDict({"router": layer["router"], "experts": layer["experts"]})
        if len(layer["shared"]):
            view["shared"] = layer["shared"][0]
        view.register_parameter("norm", layer["ffn_norm"].weight)
        return view

    def _saving_layer(self, layer: nn.ModuleDict, moe: bool, x: Tensor) -> Tensor:
        """A layer under DeepSeek-V3's savings (`moe_savings_step`)."""
        sv = self.savings
        h = x + mla_attention(layer["attn"], layer["attn_norm"].weight, x, self.b, self.tables, self.ms, sv)
        if moe:
            return h + moe_half(self._moe_view(layer), h, self.ms.moe.top_k, self.groups[0], sv, self.rules)
        return h + dense_ffn(layer["mlp"], layer["ffn_norm"].weight, h, sv)

    def _gather(self, x: Tensor) -> Tensor:
        """All T tokens from the rank's T / tp under sequence parallelism (tp > 1); x itself with tp = 1."""
        return x if self.groups[1] is None else all_gather_seq(x, self.groups[1], dim=0)

    def _layer(self, layer: nn.ModuleDict, moe: bool, x: Tensor) -> Tensor:
        if self.savings != NONE:
            return self._saving_layer(layer, moe, x)
        attend, tp = (mla_forward if self.ms.moe.mla else gqa_forward), self.groups[1]
        full = self._gather(x)
        h = _residual(full, attend(layer["attn"], layer["attn_norm"].weight, full, self.b, self.tables,
                                   self.ms), tp)
        if moe:
            return h + moe_forward(self._moe_view(layer), h, self.ms.moe.top_k, self.groups, ["layer"])
        y = layer["mlp"](FusedRMSNorm.apply(self._gather(h), layer["ffn_norm"].weight))
        return h + (y if tp is None else reduce_scatter_seq(y, tp, dim=0))

    def forward(self, x: Tensor) -> Tensor:
        """x: the token ids (b, s) on the first stage, else the received (b s, h) activations; returns the
        activations to send on, or the loss on the last stage."""
        h = x
        if self.first:
            h = self.mods["embedding"](x).view(-1, self.ms.hidden)
            if self.groups[1] is not None:  # the vocab-parallel embedding's partial sums
                h = reduce_scatter_seq(h, self.groups[1], dim=0)
        for layer, moe in zip(self.mods["layers"], self.moe, strict=True):
            h = self._layer(layer, moe, h)
        if not self.last:
            return h
        if self.savings != NONE:
            return head(self.mods, h, self.savings)
        logits = self.mods["head"](FusedRMSNorm.apply(self._gather(h), self.mods["final_norm"].weight))
        targets = torch.zeros(logits.shape[0], dtype=torch.long, device=logits.device)
        return F.cross_entropy(logits.float(), targets)


def _optimizer_bytes(ms: ModelShape, layout: Layout, mods: nn.Module) -> int:
    """Adam stepped on this rank's ZeRO-1 shard of the dense parameters (over dp x cp) and of the experts
    (over edp), on the meta device: the fp32 master shard and its two moments."""
    experts = sum(p.numel() for n, p in mods.named_parameters() if ".experts." in n)
    dense = sum(p.numel() for p in mods.parameters()) - experts
    shards = []
    for n, parts in ((dense, layout.size("dp") * layout.size("cp")), (experts, layout.edp)):
        if n:
            master = nn.Parameter(torch.empty(-(-n // parts), dtype=torch.float32, device="meta"))
            master.grad = torch.empty_like(master)
            shards.append(master)
    adam = torch.optim.Adam(shards)
    adam.step()
    state = [t for p in shards for t in adam.state[p].values() if t.device.type == "meta"]
    return sum(t.untyped_storage().nbytes() for t in [*shards, *state])


def _peers(layout: Layout, rank: int) -> tuple[int, int]:
    """The global ranks of the previous and the next stage's rank at the same other coordinates."""
    stride = layout.world_size // layout.size("pp")
    return rank - stride, rank + stride


class _Walk:
    """This rank's 1F1B actions, run in order, with the saved bytes of each micro-batch in flight."""

    def __init__(self, stage: _Stage, peers: tuple[int, int], tokens: int) -> None:
        self.stage, self.peers, self.tokens = stage, peers, tokens
        self.inputs: dict[int, Tensor] = {}
        self.outputs: dict[int, Tensor] = {}
        self.grads: dict[int, Tensor] = {}
        self.saved: dict[int, int] = {}
        self.live = self.peak = self.peak_count = 0

    def _buffer(self) -> Tensor:
        return torch.empty(self.tokens, self.stage.ms.hidden, dtype=torch.bfloat16, device="meta")

    def _forward(self, mb: int) -> None:
        saves = CachedSaves(self.stage.weights, self.stage.savings.fp8, self.stage.rules)
        if self.stage.first:
            x = torch.zeros(self.stage.b, self.stage.ms.seq, dtype=torch.long, device="meta")
        else:
            x = self.inputs[mb]
        with torch.autograd.graph.saved_tensors_hooks(saves.pack, saves.unpack):
            self.outputs[mb] = self.stage.forward(x)
        self.saved[mb] = saves.nbytes
        self.live += self.saved[mb]
        if self.live > self.peak:
            self.peak, self.peak_count = self.live, len(self.outputs)

    def _backward(self, mb: int) -> None:
        out = self.outputs.pop(mb)
        out.backward(None if self.stage.last else self.grads.pop(mb))
        self.live -= self.saved.pop(mb)

    def run(self, action) -> None:  # type: ignore[no-untyped-def]
        mb, (prev, nxt) = action.microbatch, self.peers
        if action.op == "F":
            self._forward(mb)
        elif action.op == "B":
            self._backward(mb)
        elif action.op == "recv_fwd":
            self.inputs[mb] = self._buffer()
            dist.recv(self.inputs[mb], src=prev)
            self.inputs[mb].requires_grad_()
        elif action.op == "send_fwd":
            dist.send(self.outputs[mb].detach(), dst=nxt)
        elif action.op == "recv_bwd":
            self.grads[mb] = self._buffer()
            dist.recv(self.grads[mb], src=nxt)
        else:  # send_bwd
            dist.send(self.inputs.pop(mb).grad, dst=prev)


def _messages(log, op: str) -> dict[str, tuple[int, int]]:  # type: ignore[no-untyped-def]
    """(calls, bytes) of the point-to-point `op` ("send" or "recv"), by direction (the log's where)."""
    out = {}
    for kind in ("fwd", "bwd"):
        got = [r for r in log.records if r.op == op and r.where == kind]
        out[kind] = (len(got), sum(r.nbytes for r in got))
    return out


def _groups(layout: Layout, rank: int) -> tuple:
    """The rank's ep group and its tp group (None with tp = 1), made on the fake world."""
    tp = dist.new_group(tp_group_ranks(layout, rank)) if layout.size("tp") > 1 else None
    return dist.new_group(_ep_group(layout, rank)), tp


def _check(ms: ModelShape, layout: Layout, micro_batch: int, savings: Savings) -> None:
    tp = layout.size("tp")
    if ms.moe is None or layout.size("cp") != 1:
        raise ValueError("stage_step runs an MoE shape (moe=MoEShape(...)) on a layout with cp=1 "
                         f"(got cp={layout.size('cp')}); choose a judged MoE layout")
    if savings != NONE and (ms.moe.mla is None or tp != 1):
        raise ValueError(f"savings={savings} are DeepSeek-V3's, for multi-head latent attention with tp=1; "
                         f"this layout has tp={tp} and {'MLA' if ms.moe.mla else 'grouped-query attention'}: "
                         "run it with savings=NONE")
    if ms.moe.shared_experts > 1 or ms.moe.shared_gate:
        raise ValueError("stage_step runs at most one ungated shared expert (DeepSeek-V3's); this shape "
                         f"has {ms.moe.shared_experts} (gate: {ms.moe.shared_gate})")
    if micro_batch * ms.seq % tp or micro_batch * ms.seq // tp * ms.moe.top_k % layout.expert_sizes["ep"]:
        raise ValueError(f"micro_batch={micro_batch}: its b s tokens must split over tp={tp} and their "
                         f"T k / tp copies over ep={layout.expert_sizes['ep']}; choose another micro_batch")


def stage_step(ms: ModelShape, layout: Layout, rank: int, micro_batch: int = 1,
               microbatches: int | None = None, savings: Savings = NONE) -> StageStep:
    """Rank `rank` of `layout` runs its pipeline stage's whole 1F1B step of `microbatches` micro-batches
    (default p) of `micro_batch` sequences on the meta device and the fake process group (module
    docstring), with DeepSeek-V3's `savings` (`moe_savings_step`) or none."""
    _check(ms, layout, micro_batch, savings)
    pp = layout.size("pp")
    m = pp if microbatches is None else microbatches
    if isinstance(m, bool) or not isinstance(m, int) or m < 1:
        raise ValueError(f"microbatches={microbatches!r} must be a positive integer")
    with fake_world(rank, layout.world_size):
        stage_index = layout.coords(rank)["pp"]
        stage = _Stage(ms, layout, stage_index, micro_batch, _groups(layout, rank), savings)
        walk = _Walk(stage, _peers(layout, rank), micro_batch * ms.seq // layout.size("tp"))
        with comm_log() as log, gradient_watch(stage.mods) as grads:
            for action in one_f_one_b_schedule(pp, m).actions[stage_index]:
                with log.where(action.op.split("_")[-1]):
                    walk.run(action)
        a2a = [r for r in log.records if r.op == "all_to_all"]
        dispatch = [r.nbytes for r in a2a if r.phase == "forward"][:2]
        params = sum({storage_key(p): p.untyped_storage().nbytes() for p in stage.mods.parameters()}.values())
        return StageStep(rank, stage_index, m, _messages(log, "send"), _messages(log, "recv"), len(a2a),
                         sum(r.nbytes for r in a2a), params, grads.nbytes,
                         _optimizer_bytes(ms, layout, stage.mods), walk.peak, walk.peak_count,
                         2 * sum(dispatch))
