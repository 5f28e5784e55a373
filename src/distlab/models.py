"""The small models and data sets that every chapter trains: an MLP, a GPT, and data made by code.

Everything here is deterministic under a seed and fast on two CPU cores, so a lab can train the same
model on one rank and on four and compare the two bit for bit (or to a stated tolerance):

- `MLP`: a stack of `nn.Linear` layers. `mlp.layers` is the flat list that pipeline parallelism cuts
  into stages.
- `GPT`: a decoder-only transformer (Vaswani et al. 2017; Radford et al. 2019) in the shape of nanoGPT.
  Its `Block`, `CausalSelfAttention` and `MLPBlock` keep the names `c_attn`, `c_proj` and `c_fc`, which
  tensor parallelism shards (Shoeybi et al. 2019).
- Data, made by code, never downloaded: `regression_data`, `classification_data`, and `char_corpus`, a
  text of arithmetic sentences such as ``12+7=19.`` for the GPT, with `CharTokenizer` and `get_batch`.
- Sharding for data parallelism: `batch_indices` draws step t's global batch the same way on every rank,
  and `shard` gives each rank its contiguous slice of it.

Randomness comes from an explicit seed or `torch.Generator`. Model weights are drawn from torch's global
generator, as in any PyTorch script: call `torch.manual_seed(s)` before building a model.
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

ACTIVATIONS = {"gelu": nn.GELU, "relu": nn.ReLU, "tanh": nn.Tanh}


class MLP(nn.Sequential):
    """Linear layers of widths `sizes`, with `activation` between them (none after the last).

    `MLP([8, 32, 32, 4])` is Linear(8, 32), GELU, Linear(32, 32), GELU, Linear(32, 4). It is an
    `nn.Sequential`, so `nn.Sequential(*mlp.layers[a:b])` is a pipeline stage.
    """

    def __init__(self, sizes: Sequence[int], activation: str = "gelu") -> None:
        sizes = list(sizes)
        if len(sizes) < 2:
            raise ValueError(f"sizes={sizes} needs at least two widths (input and output); "
                             "for example [8, 32, 4]")
        if any(s <= 0 for s in sizes):
            raise ValueError(f"sizes={sizes} has a width that is not positive; make every width at least 1")
        if activation not in ACTIVATIONS:
            raise ValueError(f"activation={activation!r} is unknown; choose one of {sorted(ACTIVATIONS)}")
        modules: list[nn.Module] = []
        for i, (d_in, d_out) in enumerate(zip(sizes[:-1], sizes[1:], strict=True)):
            modules.append(nn.Linear(d_in, d_out))
            if i < len(sizes) - 2:
                modules.append(ACTIVATIONS[activation]())
        super().__init__(*modules)
        self.sizes = sizes

    @property
    def layers(self) -> list[nn.Module]:
        """The modules in order, activations included, for a pipeline to partition."""
        return list(self)


@dataclass
class GPTConfig:
    """The shape of a `GPT`. The defaults train in seconds on two CPU cores."""

    vocab_size: int
    block_size: int = 32  # the longest context, in tokens
    n_layer: int = 2
    n_head: int = 4
    n_embd: int = 64
    dropout: float = 0.0
    bias: bool = True

    def __post_init__(self) -> None:
        for name in ("vocab_size", "block_size", "n_layer", "n_head", "n_embd"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                raise ValueError(f"{name}={value!r} must be a positive integer; for example {name}=4")
        if self.n_embd % self.n_head:
            raise ValueError(f"n_embd={self.n_embd} is not divisible by n_head={self.n_head}; "
                             f"choose n_head that divides {self.n_embd} or an n_embd that is a multiple "
                             f"of {self.n_head}")
        if not 0.0 <= self.dropout < 1.0:
            raise ValueError(f"dropout={self.dropout} must be in [0, 1); use 0.0 to switch it off")


class CausalSelfAttention(nn.Module):
    """Multi-head masked self-attention (Vaswani et al. 2017, sec. 3.2).

    `c_attn` projects x to queries, keys and values in one matmul, `[q | k | v]`, each n_embd wide and
    split into `n_head` heads of `n_embd // n_head`. Position i attends only to positions <= i (the
    causal mask, `is_causal=True`). `c_proj` maps the concatenated heads back to n_embd.
    """

    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        self.n_head = config.n_head
        self.n_embd = config.n_embd
        self.dropout = config.dropout
        self.c_attn = nn.Linear(config.n_embd, 3 * config.n_embd, bias=config.bias)
        self.c_proj = nn.Linear(config.n_embd, config.n_embd, bias=config.bias)
        self.resid_dropout = nn.Dropout(config.dropout)

    def forward(self, x: Tensor) -> Tensor:
        B, T, C = x.shape
        q, k, v = self.c_attn(x).split(C, dim=2)
        # (B, T, C) -> (B, n_head, T, head_size)
        q, k, v = (t.view(B, T, self.n_head, C // self.n_head).transpose(1, 2) for t in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, dropout_p=self.dropout if self.training else 0.0,
                                           is_causal=True)
        y = y.transpose(1, 2).contiguous().view(B, T, C)
        return self.resid_dropout(self.c_proj(y))


class MLPBlock(nn.Module):
    """The position-wise feed-forward network (Vaswani et al. 2017, sec. 3.3): c_fc widens to 4 n_embd,
    GELU (Hendrycks & Gimpel 2016), c_proj narrows back."""

    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        self.c_fc = nn.Linear(config.n_embd, 4 * config.n_embd, bias=config.bias)
        self.gelu = nn.GELU()
        self.c_proj = nn.Linear(4 * config.n_embd, config.n_embd, bias=config.bias)
        self.dropout = nn.Dropout(config.dropout)

    def forward(self, x: Tensor) -> Tensor:
        return self.dropout(self.c_proj(self.gelu(self.c_fc(x))))


class Block(nn.Module):
    """One transformer block with the LayerNorm moved to each sub-block's input (pre-norm, as in
    Radford et al. 2019, sec. 2.3): x + attn(ln_1(x)), then x + mlp(ln_2(x))."""

    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        self.ln_1 = nn.LayerNorm(config.n_embd, bias=config.bias)
        self.attn = CausalSelfAttention(config)
        self.ln_2 = nn.LayerNorm(config.n_embd, bias=config.bias)
        self.mlp = MLPBlock(config)

    def forward(self, x: Tensor) -> Tensor:
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class GPT(nn.Module):
    """A decoder-only language model (Radford et al. 2019) built from the blocks of Vaswani et al. 2017.

    Token and learned position embeddings, `n_layer` pre-norm `Block`s, a final LayerNorm, and `lm_head`,
    whose weight is the token embedding's (weight tying, Press & Wolf 2017). Weights are drawn from
    N(0, 0.02); the projections into the residual stream (`c_proj`) get 0.02 / sqrt(2 n_layer), as
    Radford et al. 2019 (sec. 2.3) scale residual layers by 1 / sqrt(N). So the logits start near zero
    and the loss at init is close to ln(vocab_size).
    """

    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        self.config = config
        self.wte = nn.Embedding(config.vocab_size, config.n_embd)
        self.wpe = nn.Embedding(config.block_size, config.n_embd)
        self.drop = nn.Dropout(config.dropout)
        self.h = nn.ModuleList(Block(config) for _ in range(config.n_layer))
        self.ln_f = nn.LayerNorm(config.n_embd, bias=config.bias)
        self.lm_head = nn.Linear(config.n_embd, config.vocab_size, bias=False)
        self.lm_head.weight = self.wte.weight  # tied: one matrix, two uses
        for name, p in self.named_parameters():
            if name.endswith("c_proj.weight"):
                nn.init.normal_(p, 0.0, 0.02 / math.sqrt(2 * config.n_layer))
            elif name.endswith("bias"):
                nn.init.zeros_(p)
            elif p.dim() == 2:  # Linear and Embedding weights; LayerNorm keeps weight 1, bias 0
                nn.init.normal_(p, 0.0, 0.02)

    def forward(self, idx: Tensor, targets: Tensor | None = None) -> tuple[Tensor, Tensor | None]:
        """Logits of shape (B, T, vocab_size) for token ids `idx` (B, T), and the mean cross-entropy
        against `targets` (B, T) when given (else None)."""
        B, T = idx.shape
        if T > self.config.block_size:
            raise ValueError(f"sequence length {T} exceeds block_size={self.config.block_size}; "
                             f"crop the input to its last {self.config.block_size} tokens")
        pos = torch.arange(T, device=idx.device)
        x = self.drop(self.wte(idx) + self.wpe(pos))
        for block in self.h:
            x = block(x)
        logits = self.lm_head(self.ln_f(x))
        if targets is None:
            return logits, None
        return logits, F.cross_entropy(logits.view(B * T, -1), targets.reshape(B * T))

    def num_params(self) -> int:
        """Parameters counted once each (the tied embedding is one matrix)."""
        return sum(p.numel() for p in self.parameters())


# ---------------------------------------------------------------- data, made by code


def regression_data(n: int, d_in: int, d_out: int, seed: int, noise: float = 0.1,
                    hidden: int = 32) -> tuple[Tensor, Tensor]:
    """`n` points x ~ N(0, I) and y = W2 tanh(W1 x) + noise * eps, from a fixed random teacher network
    (a teacher-student setup). The same seed gives the same X, y and teacher."""
    g = torch.Generator().manual_seed(seed)
    X = torch.randn(n, d_in, generator=g)
    W1 = torch.randn(d_in, hidden, generator=g) / math.sqrt(d_in)
    W2 = torch.randn(hidden, d_out, generator=g) / math.sqrt(hidden)
    y = torch.tanh(X @ W1) @ W2 + noise * torch.randn(n, d_out, generator=g)
    return X, y


def classification_data(n: int, d_in: int, n_classes: int, seed: int) -> tuple[Tensor, Tensor]:
    """`n` points x ~ N(0, I) labelled by a fixed random linear teacher: y = argmax(W x). Returns X (n,
    d_in) float and y (n,) long."""
    if n_classes < 2:
        raise ValueError(f"n_classes={n_classes} must be at least 2; use regression_data for one output")
    g = torch.Generator().manual_seed(seed)
    X = torch.randn(n, d_in, generator=g)
    W = torch.randn(d_in, n_classes, generator=g)
    return X, (X @ W).argmax(dim=1)


def char_corpus(n_sentences: int = 2000, seed: int = 0, max_operand: int = 99) -> str:
    """Arithmetic sentences, one per line, such as ``12+7=19.`` and ``40-13=27.``.

    The text has structure a small model can learn: the digits before `=` are random, but the format is
    fixed and the digits after it follow from the ones before. Subtraction never goes below zero.
    """
    rng = random.Random(seed)  # a private generator: Python's global one is left alone
    lines = []
    for _ in range(n_sentences):
        a, b = rng.randint(0, max_operand), rng.randint(0, max_operand)
        if rng.random() < 0.5:
            lines.append(f"{a}+{b}={a + b}.")
        else:
            a, b = max(a, b), min(a, b)
            lines.append(f"{a}-{b}={a - b}.")
    return "\n".join(lines) + "\n"


class CharTokenizer:
    """One token per character; the vocabulary is the sorted set of characters in `text`."""

    def __init__(self, text: str) -> None:
        self.chars = sorted(set(text))
        self.stoi = {c: i for i, c in enumerate(self.chars)}

    @property
    def vocab_size(self) -> int:
        return len(self.chars)

    def encode(self, s: str) -> Tensor:
        """The token ids of `s`, as a 1-D long tensor."""
        unknown = sorted(set(s) - self.stoi.keys())
        if unknown:
            raise ValueError(f"characters {unknown} are not in the vocabulary {self.chars}; "
                             "build the tokenizer from a text that contains them")
        return torch.tensor([self.stoi[c] for c in s], dtype=torch.long)

    def decode(self, ids: Sequence[int] | Tensor) -> str:
        """The text of token ids `ids`."""
        return "".join(self.chars[int(i)] for i in ids)


def get_batch(data: Tensor, block_size: int, batch_size: int,
              generator: torch.Generator) -> tuple[Tensor, Tensor]:
    """`batch_size` random windows of `block_size` tokens from the 1-D tensor `data`, and the same windows
    shifted by one: the next-token targets. Both have shape (batch_size, block_size)."""
    if len(data) <= block_size:
        raise ValueError(f"data has {len(data)} tokens, too few for block_size={block_size}; "
                         f"use more than {block_size} tokens or a smaller block_size")
    ix = torch.randint(len(data) - block_size, (batch_size,), generator=generator)
    x = torch.stack([data[i:i + block_size] for i in ix.tolist()])
    y = torch.stack([data[i + 1:i + 1 + block_size] for i in ix.tolist()])
    return x, y
