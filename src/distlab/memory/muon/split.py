"""Which parameters Muon takes, and which AdamW takes.

The rule (Jordan et al. 2024, "Muon: An optimizer for hidden layers in neural networks": Muon is for the
2D weights of hidden layers; embeddings, the classifier head and scalar or vector parameters go to AdamW;
`torch.optim.Muon`'s docstring says the same, and Liu et al. 2025 keep AdamW for the embedding and the
head too): the weight of every `nn.Linear` goes to Muon, unless its name is in `head` (an untied output
head, e.g. "lm_head.weight"); everything else (embeddings, including a head tied to the embedding, biases,
norms) goes to AdamW. Every parameter lands in exactly one list; the order is the model's.
"""

from __future__ import annotations

from collections.abc import Iterable

from torch import Tensor, nn

Named = list[tuple[str, nn.Parameter]]


def split_parameters(model: nn.Module, head: Iterable[str] = ("lm_head.weight",)) -> tuple[Named, Named]:
    """(Muon's named parameters, AdamW's named parameters) of `model`, by the rule above."""
    heads = set(head)
    linear_weights = {id(m.weight) for m in model.modules() if isinstance(m, nn.Linear)}
    # a head tied to the embedding is a Linear whose weight *is* the embedding's: AdamW's, not Muon's
    embeddings = {id(m.weight) for m in model.modules() if isinstance(m, nn.Embedding)}
    muon: Named = []
    adamw: Named = []
    for name, p in model.named_parameters():
        is_matrix = (id(p) in linear_weights and id(p) not in embeddings and p.ndim == 2
                     and name not in heads)
        (muon if is_matrix else adamw).append((name, p))
    return muon, adamw


def check_matrices(named: Named) -> None:
    """Muon's parameters must be 2D (torch.optim.Muon raises the same); name the one that is not."""
    for name, p in named:
        if p.ndim != 2:
            raise ValueError(f"parameter {name!r} has shape {tuple(p.shape)}; Muon orthogonalises matrices "
                             "only: give it to AdamW (split.split_parameters does)")


def flat_numel(tensors: Iterable[Tensor]) -> int:
    """The number of elements of `tensors` together."""
    return sum(t.numel() for t in tensors)
