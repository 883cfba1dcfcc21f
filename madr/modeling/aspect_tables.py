"""Aspect value tables shared by the query and document towers, and the scores they give.

MADRAL / MtBERT (paper 000 Sec. 5): P(x) = softmax(E_a U_a^T + b_a) with a free table U_a and bias b_a
per aspect, "shared between the query and document encoders", used only in training.

MURAL (paper 001 Sec. 4.2): one value embedding table E_a^g per aspect and granularity, scored by dot
product (Eq. 2). "unshared": its own table, initialised from the average of the backbone's token
embeddings of each value; "shared": recomputed on every call as that average over the current token
embeddings (average pooling is the projection function the paper adopts).
"""

from __future__ import annotations

import torch
from torch import nn


def value_token_matrix(values: list[str], tokenize_ids) -> torch.Tensor:
    """[V, T] token ids of every value (padded with -1); `tokenize_ids(text) -> list[int]`."""
    rows = [tokenize_ids(v) or [] for v in values]
    width = max([len(r) for r in rows] + [1])
    out = torch.full((len(values), width), -1, dtype=torch.long)
    for i, r in enumerate(rows):
        out[i, : len(r)] = torch.tensor(r, dtype=torch.long)
    return out


def average_token_embeddings(token_ids: torch.Tensor, table: torch.Tensor) -> torch.Tensor:
    """Mean of `table` rows over each value's token ids (ignoring -1 padding): [V, H]."""
    mask = (token_ids >= 0).to(table.dtype)
    emb = table[token_ids.clamp_min(0)] * mask.unsqueeze(-1)
    return emb.sum(1) / mask.sum(1, keepdim=True).clamp_min(1.0)


class AspectClassifier(nn.Module):
    """MADRAL / MtBERT: one linear layer (U_a, b_a) per aspect over the aspect's phrase vocabulary."""

    def __init__(self, vocab_sizes: dict[str, int], hidden: int) -> None:
        super().__init__()
        self.tables = nn.ModuleDict({key: nn.Linear(hidden, n) for key, n in vocab_sizes.items()})

    def forward(self, aspect_repr: dict[str, torch.Tensor], word_embeddings: torch.Tensor | None = None) -> dict[str, torch.Tensor]:
        return {key: self.tables[key](h) for key, h in aspect_repr.items() if key in self.tables}

    def value_table(self, key: str, word_embeddings: torch.Tensor | None = None) -> torch.Tensor:
        return self.tables[key].weight


class ValueEmbeddings(nn.Module):
    """MURAL: value embeddings per "aspect/granularity" key, scored by dot product (Eq. 2)."""

    def __init__(self, token_ids: dict[str, torch.Tensor], word_embeddings: torch.Tensor, mode: str) -> None:
        super().__init__()
        if mode not in ("shared", "unshared"):
            raise ValueError(f"value_embeddings {mode!r} is not one of shared, unshared")
        self.mode = mode
        self.keys = list(token_ids)
        for i, key in enumerate(self.keys):
            self.register_buffer(f"tokens_{i}", token_ids[key])
        if mode == "unshared":
            with torch.no_grad():
                self.tables = nn.ParameterList(
                    [nn.Parameter(average_token_embeddings(token_ids[k], word_embeddings).clone()) for k in self.keys]
                )

    def value_table(self, key: str, word_embeddings: torch.Tensor | None = None) -> torch.Tensor:
        i = self.keys.index(key)
        if self.mode == "unshared":
            return self.tables[i]
        if word_embeddings is None:
            raise ValueError("shared value embeddings need the backbone's word embeddings")
        return average_token_embeddings(getattr(self, f"tokens_{i}"), word_embeddings)

    def forward(self, aspect_repr: dict[str, torch.Tensor], word_embeddings: torch.Tensor | None = None) -> dict[str, torch.Tensor]:
        return {key: h @ self.value_table(key, word_embeddings).T for key, h in aspect_repr.items() if key in self.keys}
