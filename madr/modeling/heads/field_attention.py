"""Multi-field documents: concatenation or query-dependent field attention (paper 004 Sec. IV, Eq. 8-9).

A document d_j has m text entities (title, description, url, ...). Paper 004 gives two ways to embed it:

* concatenation: join the fields into one multi-sentence text and encode it once (`concat_fields`); the
  embedding is fixed, so it can be indexed for first-stage retrieval;
* attention: encode every field separately and let the query decide which to attend to,
  `f(d_j) = sum_k alpha_k f(d_j^k)` (Eq. 8) with `alpha_k = exp a(q, d_j^k) / sum_l exp a(q, d_j^l)` (Eq. 9),
  where `a(x, y)` is "a one-layer or multi-layers neural net" of the query and the field. The document
  vector then depends on the query (later ranking stages, a few thousand candidates).

Scorers `a(q, d)` (`FieldAttention(scorer=...)`):

* `"additive"` (default): `v^T tanh(W_q q + W_d d + b)`, the attention of Bahdanau et al. that the paper
  cites ([29]), a one-hidden-layer net on the pair.
* `"bilinear"`: `q^T W d`, one layer with a query-field interaction.

A plain linear layer on `[q; d]` is deliberately not offered: its query term `w_q^T q` is the same for every
field of a document and cancels in the softmax of Eq. 9, so the weights would not depend on the query.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import torch
from torch import nn

SCORERS = ("additive", "bilinear")
DEFAULT_SEP = " [SEP] "


def concat_fields(fields: Mapping[str, str], order: Sequence[str] | None = None, sep: str = DEFAULT_SEP) -> str:
    """The concatenation option of paper 004 Sec. IV: the document's fields joined by `sep`.

    `order` lists the field names in the order they are joined (default: the mapping's own order). Fields
    named in `order` that the document lacks, and empty or blank fields, are skipped (a document without a
    description is common); a document with no non-empty field is a ValueError.
    """
    names = list(fields) if order is None else list(order)
    parts = [fields[name].strip() for name in names if isinstance(fields.get(name), str) and fields[name].strip()]
    if not parts:
        raise ValueError(f"document has no non-empty field among {names} (fields present: {sorted(fields)})")
    return sep.join(parts)


@dataclass
class FieldAttentionOutput:
    """Eq. 8-9 for a batch: the attended document vectors and the field weights alpha (for explanations).

    Pairwise (`FieldAttention.forward`): embedding [B, d], weights [B, F].
    Grid (`FieldAttention.grid`): embedding [B, N, d], weights [B, N, F] (query i attending to document n).
    Masked fields have weight exactly 0.
    """

    embedding: torch.Tensor
    weights: torch.Tensor


class FieldAttention(nn.Module):
    """Query-dependent attention over a document's field embeddings (paper 004 Eq. 8-9).

    Args:
        dim: embedding size d of the query and field vectors.
        scorer: "additive" (default) or "bilinear" (see the module docstring).
        hidden: hidden size of the additive scorer (default: `dim`).

    `bilinear` starts at W = I (so a(q, d) = q . d until trained); `additive` uses PyTorch's default init.
    """

    def __init__(self, dim: int, scorer: str = "additive", hidden: int | None = None) -> None:
        super().__init__()
        if scorer not in SCORERS:
            raise ValueError(f"scorer {scorer!r} is not one of {', '.join(SCORERS)}")
        if dim < 1 or (hidden is not None and hidden < 1):
            raise ValueError(f"dim and hidden must be >= 1, got dim={dim}, hidden={hidden}")
        self.dim = int(dim)
        self.scorer = scorer
        if scorer == "additive":
            hidden = hidden or dim
            self.query_proj = nn.Linear(dim, hidden, bias=False)
            self.field_proj = nn.Linear(dim, hidden, bias=True)
            self.score_vector = nn.Linear(hidden, 1, bias=False)
        else:
            self.bilinear = nn.Parameter(torch.eye(dim))

    def scores(self, query: torch.Tensor, fields: torch.Tensor) -> torch.Tensor:
        """`a(q, d^k)` of Eq. 9 for broadcastable `query [..., d]` and `fields [..., F, d]` -> `[..., F]`."""
        if self.scorer == "additive":
            hidden = torch.tanh(self.query_proj(query).unsqueeze(-2) + self.field_proj(fields))
            return self.score_vector(hidden).squeeze(-1)
        return ((query @ self.bilinear).unsqueeze(-2) * fields).sum(-1)

    def forward(self, query: torch.Tensor, fields: torch.Tensor,
                mask: torch.Tensor | None = None) -> FieldAttentionOutput:
        """Eq. 8-9 for aligned rows: query `[B, d]`, field embeddings `[B, F, d]`, mask `[B, F]` (True = present)."""
        if query.dim() != 2 or fields.dim() != 3 or fields.shape[0] != query.shape[0]:
            raise ValueError(f"query {tuple(query.shape)} must be [B, d] and fields {tuple(fields.shape)} [B, F, d]")
        self._check(query, fields, mask)
        weights = self._softmax(self.scores(query, fields), mask)
        return FieldAttentionOutput(torch.einsum("bf,bfd->bd", weights, fields), weights)

    def grid(self, query: torch.Tensor, fields: torch.Tensor, mask: torch.Tensor | None = None) -> FieldAttentionOutput:
        """Every query attending to every document: query `[B, d]`, fields `[N, F, d]`, mask `[N, F]`.

        Gives the query-dependent document vectors `[B, N, d]` that in-batch negatives need (query i scores
        document n through the weights query i puts on n's fields). The additive scorer holds a
        `[B, N, F, hidden]` activation: keep `hidden` (or the projected d, 32 in paper 004) small for large B, N.
        """
        if query.dim() != 2 or fields.dim() != 3:
            raise ValueError(f"query {tuple(query.shape)} must be [B, d] and fields {tuple(fields.shape)} [N, F, d]")
        self._check(query, fields, mask)
        scores = self.scores(query[:, None, :], fields[None])  # [B, N, F]
        weights = self._softmax(scores, None if mask is None else mask[None])
        return FieldAttentionOutput(torch.einsum("bnf,nfd->bnd", weights, fields), weights)

    def _check(self, query: torch.Tensor, fields: torch.Tensor, mask: torch.Tensor | None) -> None:
        if query.shape[-1] != self.dim or fields.shape[-1] != self.dim:
            raise ValueError(f"query {tuple(query.shape)} and fields {tuple(fields.shape)} must end in dim={self.dim}")
        if fields.shape[1] == 0:
            raise ValueError("fields has no field (F = 0)")
        if mask is None:
            return
        if mask.shape != fields.shape[:2]:
            raise ValueError(f"mask {tuple(mask.shape)} must be [{fields.shape[0]}, {fields.shape[1]}] like fields")
        empty = (~mask.bool().any(dim=1)).nonzero().flatten().tolist()
        if empty:
            raise ValueError(f"document row(s) {empty[:10]} have every field masked out")

    @staticmethod
    def _softmax(scores: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
        """Eq. 9 over the last (field) axis; masked fields get weight 0."""
        if mask is not None:
            scores = scores.masked_fill(~mask.bool(), float("-inf"))
        return torch.softmax(scores, dim=-1)
