"""One model shape: the sizes of a decoder-only transformer, and every count that follows from them.

The course describes a model in two vocabularies: `distlab.models.GPTConfig` (nanoGPT's `n_layer`, `n_embd`,
`n_head`, the model it trains) and the estimator's and planner's (`layers`, `hidden`, `heads`, with the
options of models trained since GPT-3). `ModelShape` is the second, converted to and from the first, and
the one home of the parameter count and of a block's matrix weights, so that chapter 7's estimator,
chapter 9's planner, chapter 12's dry run and `make gpu-check`'s blocks cannot disagree on a count.

A GPT-3 block (Brown et al. 2020; the course's GPT, after GPT-2, Radford et al. 2019) has 4 h^2 attention
weights and a 4h GELU MLP, 12 h^2 in all, and 13 h biases and LayerNorm parameters. The options:

- **grouped-query attention** (Ainslie et al. 2023): `kv_heads` key/value heads shared by the `heads` query
  heads, so K and V are h_kv = h kv_heads / heads wide: attention weights 2 h^2 + 2 h h_kv;
- **an explicit FFN size** f (Llama 3 405B: 53,248 for h = 16,384; Dubey et al. 2024, Table 3);
- **gated MLPs** (SwiGLU, Shazeer 2020): three matrices (gate, up, down), 3 h f weights instead of 2 h f;
- an output layer **untied** from the input embedding (`tied=False`: V h more), and no learned position
  embedding (`positions=False`: s h fewer; RoPE and ALiBi have no parameters).

The whole count is L (W + biases) + V h (twice untied) + s h (with positions) + the final LayerNorm, with
W = 2 h^2 + 2 h h_kv + (3 if gated else 2) h f and, with biases, 7 h + 2 h_kv + f (2 f gated) per block
(four LayerNorm vectors, the q, k, v, attention-output and MLP biases); without biases only the LayerNorm
weights remain (2 h per block, h at the end), as `distlab.models.GPT(bias=False)` has them.

A mixture of experts is `moe=MoEShape(...)` (`distlab.moe_shape`, where its counts live): the first
`moe.dense_layers` blocks keep this MLP (f = `ffn`), the others route to experts; `params` and
`active_params` then count through `moe_shape` (`moe_layer_params`, `dense_layer_params`).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from distlab import moe_shape
from distlab.models import GPTConfig
from distlab.moe_shape import MoEShape


def kv_width(hidden: int, heads: int, kv_heads: int | None) -> int:
    """h_kv: the width of K (and of V) with `kv_heads` key/value heads (None: multi-head attention)."""
    return hidden if kv_heads is None else hidden // heads * kv_heads


def block_weights(hidden: int, heads: int, kv_heads: int | None = None, ffn: int | None = None,
                  gated: bool = False) -> int:
    """Matrix weights of one block: attention 2 h^2 + 2 h h_kv, MLP (3 if gated else 2) h f; f = 4h unless
    given. For a GPT-3 block (kv_heads = heads, f = 4h, not gated) this is 12 h^2."""
    h, f = hidden, ffn or 4 * hidden
    return 2 * h * h + 2 * h * kv_width(hidden, heads, kv_heads) + (3 if gated else 2) * h * f


def _check_positive_int(name: str, value: object) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name}={value!r} must be a positive integer, e.g. {name}=8")


@dataclass(frozen=True, kw_only=True)
class ModelShape:
    """`layers` blocks of width `hidden` with `heads` attention heads (`kv_heads` key/value heads; None =
    heads), an MLP of hidden size `ffn` (None = 4 hidden; `gated`: SwiGLU), a `vocab`-token embedding
    (`tied` to the output layer or not), a learned position embedding of `seq` positions or not
    (`positions`), and biases or not (`bias`)."""

    layers: int
    hidden: int
    heads: int
    vocab: int
    seq: int
    kv_heads: int | None = None
    ffn: int | None = None
    gated: bool = False
    tied: bool = True
    positions: bool = True
    bias: bool = True
    moe: MoEShape | None = None

    def __post_init__(self) -> None:
        for name in ("layers", "hidden", "heads", "vocab", "seq"):
            _check_positive_int(name, getattr(self, name))
        if self.hidden % self.heads:
            raise ValueError(f"hidden={self.hidden} is not divisible by heads={self.heads}; choose heads "
                             "that divide it")
        kv = self.kv_heads
        if kv is not None and (isinstance(kv, bool) or not isinstance(kv, int) or kv < 1 or self.heads % kv):
            raise ValueError(f"kv_heads={kv!r} must be a positive integer that divides heads={self.heads}; "
                             "or leave it out (kv_heads = heads, multi-head attention)")
        if self.ffn is not None:
            _check_positive_int("ffn", self.ffn)
        if self.moe is not None:
            moe_shape.check_layers(self.moe, self.layers)

    @property
    def kv_width(self) -> int:
        """h_kv, the width of K and of V."""
        return kv_width(self.hidden, self.heads, self.kv_heads)

    @property
    def ffn_size(self) -> int:
        """f, the MLP's hidden size (4 h unless given)."""
        return self.ffn or 4 * self.hidden

    @property
    def modern(self) -> bool:
        """Whether the block or the embeddings depart from the course's GPT (GPT-2's block, tied, learned
        positions): what `to_gpt_config` cannot build."""
        return (self.kv_heads not in (None, self.heads) or self.ffn not in (None, 4 * self.hidden)
                or self.gated or not self.tied or not self.positions or self.moe is not None)

    @property
    def block_weights(self) -> int:
        """W, the matrix weights of one block."""
        return block_weights(self.hidden, self.heads, self.kv_heads, self.ffn, self.gated)

    @property
    def block_biases(self) -> int:
        """The vectors of one block: with biases 7 h + 2 h_kv + f (2 f gated), else the two LayerNorm
        weights."""
        h = self.hidden
        if not self.bias:
            return 2 * h
        return 7 * h + 2 * self.kv_width + self.ffn_size * (2 if self.gated else 1)

    @property
    def block_params(self) -> int:
        """Parameters of one block."""
        return self.block_weights + self.block_biases

    @property
    def embedding_params(self) -> int:
        """The input embedding, the untied output layer and the learned positions."""
        h = self.hidden
        return self.vocab * h * (1 if self.tied else 2) + (self.seq * h if self.positions else 0)

    @property
    def params(self) -> int:
        """Parameters of the whole model, each counted once (module docstring)."""
        h = self.hidden
        end = 2 * h if self.bias else h
        if self.moe is not None:
            moe_layers = self.layers - self.moe.dense_layers
            return (self.moe.dense_layers * self.dense_layer_params + moe_layers * self.moe_layer_params
                    + self.embedding_params + end)
        return self.layers * self.block_params + self.embedding_params + end

    @property
    def active_params(self) -> int:
        """Parameters one token uses: all of a dense model; an MoE model less the (E - k) routed experts
        per MoE layer it does not visit (`distlab.moe_shape`)."""
        if self.moe is None:
            return self.params
        idle = (self.moe.experts - self.moe.top_k) * self.expert_params
        return self.params - (self.layers - self.moe.dense_layers) * idle

    @property
    def attention_params(self) -> int:
        """One MoE model block's attention parameters (`moe_shape.attention_params`; MoE shapes only)."""
        return moe_shape.attention_params(self._moe(), self.hidden, self.heads, self.kv_heads, self.bias)

    @property
    def norm_params(self) -> int:
        """One block's two norms: LayerNorms (weight and bias) with biases, else RMSNorm weights."""
        return (4 if self.bias else 2) * self.hidden

    @property
    def expert_params(self) -> int:
        """One routed expert (MoE shapes only)."""
        return moe_shape.expert_params(self._moe(), self.hidden, self.gated, self.bias)

    @property
    def dense_layer_params(self) -> int:
        """One of an MoE model's dense blocks: attention, norms and the MLP of width `ffn`."""
        return (self.attention_params + self.norm_params
                + moe_shape.ffn_params(self.hidden, self.ffn_size, self.gated, self.bias))

    @property
    def moe_layer_params(self) -> int:
        """One MoE block: attention, norms, router, every routed expert and the shared experts."""
        m, h = self._moe(), self.hidden
        return (self.attention_params + self.norm_params + moe_shape.router_params(m, h)
                + m.experts * self.expert_params + moe_shape.shared_params(m, h, self.gated, self.bias))

    def _moe(self) -> MoEShape:
        if self.moe is None:
            raise ValueError(f"{self} is dense (moe=None); give moe=MoEShape(...) for the counts of experts")
        return self.moe

    def in_gpt_block(self) -> ModelShape:
        """The same sizes in the course's GPT block: multi-head attention, a 4h GELU MLP, tied embeddings
        and learned positions (how chapter 12 runs a published model's shape)."""
        return replace(self, kv_heads=None, ffn=None, gated=False, tied=True, positions=True)

    def to_gpt_config(self, dropout: float = 0.0) -> GPTConfig:
        """The `distlab.models.GPTConfig` of this shape (block_size = seq); a ValueError for a shape the
        course's GPT does not have (use `in_gpt_block()` first to run its sizes in GPT's block)."""
        if self.modern:
            raise ValueError(f"{self} has options distlab.models.GPT does not (grouped-query attention, an "
                             "FFN other than 4 hidden, a gated MLP, an untied output, no learned positions); "
                             "convert shape.in_gpt_block() to run its sizes in the course's block")
        return GPTConfig(vocab_size=self.vocab, block_size=self.seq, n_layer=self.layers, n_head=self.heads,
                         n_embd=self.hidden, dropout=dropout, bias=self.bias)

    @classmethod
    def from_gpt_config(cls, config: GPTConfig) -> ModelShape:
        """The shape of `distlab.models.GPT(config)`: seq is its block_size, the rows of its position
        embedding."""
        return cls(layers=config.n_layer, hidden=config.n_embd, heads=config.n_head, vocab=config.vocab_size,
                   seq=config.block_size, bias=config.bias)
