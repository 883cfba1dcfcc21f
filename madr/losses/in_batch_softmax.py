"""In-batch softmax cross entropy with optional hard negatives (paper 000 L_SCE, paper 001 Eq. 10)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

SIMILARITIES = ("dot", "cosine")


class InBatchSoftmaxLoss(nn.Module):
    """In-batch softmax cross entropy L_SCE (paper 000 Sec. 7 Eq. 8; paper 001 Sec. 4.5 Eq. 10).

    `L_SCE = -log( exp(s(q, d+)/t) / (exp(s(q, d+)/t) + sum_{d-} exp(s(q, d-)/t)) )`, averaged over the
    queries. Query i scores against all B positives of the batch (the other queries' positives are its
    random negatives) and against every hard negative of the batch (paper 001 Sec. 5.3.2: one per query);
    its target is its own positive, column i.

    Args:
        similarity: "dot" (the papers) or "cosine" (then use a temperature, e.g. 0.05).
        temperature: scores are divided by it; 1.0 leaves dot products as in Eq. 10.

    Inputs: `q [B, d]`, `d_pos [B, d]` (row i is query i's positive), and optional `hard_negatives`
    as `[B, n, d]` or flat `[N, d]` (any N, e.g. B*n). Requires B >= 1; the loss gets more informative
    with larger batches. A positive that is also relevant to another query of the batch is scored as
    that query's negative (false negative); batch unique positives to avoid it. Negatives are not
    gathered across devices here. Use `PointwiseCELoss` for graded labels of judged pairs instead.
    `weights [B]` (optional) weight each query's term of the mean: clipped inverse-propensity weights of clicked
    positives (Joachims et al., WSDM'17, Eq. 9: the IPS-weighted empirical risk), normalised to mean 1.
    """

    def __init__(self, similarity: str = "dot", temperature: float = 1.0) -> None:
        super().__init__()
        if similarity not in SIMILARITIES:
            raise ValueError(f"similarity {similarity!r} is not one of {', '.join(SIMILARITIES)}")
        if temperature <= 0:
            raise ValueError(f"temperature must be > 0, got {temperature}")
        self.similarity = similarity
        self.temperature = temperature

    @staticmethod
    def scores(q: torch.Tensor, docs: torch.Tensor, similarity: str = "dot") -> torch.Tensor:
        """`[Bq, N]` similarity of every query to every document: dot product or cosine."""
        if similarity not in SIMILARITIES:
            raise ValueError(f"similarity {similarity!r} is not one of {', '.join(SIMILARITIES)}")
        if similarity == "cosine":
            q, docs = F.normalize(q, dim=-1), F.normalize(docs, dim=-1)
        return q @ docs.T

    def forward(self, q: torch.Tensor, d_pos: torch.Tensor, hard_negatives: torch.Tensor | None = None,
                weights: torch.Tensor | None = None) -> torch.Tensor:
        if q.dim() != 2 or q.shape != d_pos.shape or q.shape[0] == 0:
            raise ValueError(f"q {tuple(q.shape)} and d_pos {tuple(d_pos.shape)} must both be [batch>=1, dim]")
        docs = d_pos
        if hard_negatives is not None:
            ok = hard_negatives.shape[-1] == q.shape[1] and (
                hard_negatives.dim() == 2 or (hard_negatives.dim() == 3 and hard_negatives.shape[0] == q.shape[0]))
            if not ok:
                raise ValueError(f"hard_negatives must be [batch={q.shape[0]}, n, {q.shape[1]}] or "
                                 f"[N, {q.shape[1]}], got {tuple(hard_negatives.shape)}")
            docs = torch.cat([d_pos, hard_negatives.reshape(-1, q.shape[1])])
        logits = self.scores(q, docs, self.similarity) / self.temperature
        target = torch.arange(q.shape[0], device=q.device)
        if weights is None:
            return F.cross_entropy(logits, target)
        return (F.cross_entropy(logits, target, reduction="none") * weights.to(logits)).mean()
