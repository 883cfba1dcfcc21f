"""Bridge task on parallel sentences (WikiMatrix, paper 004 Sec. III): align a translation with its source.

Paper 004 adds WikiMatrix En-xx pairs "and bridge tasks to align the embedding of different languages"
(after [13], Chidambaram, Yang et al. 2018, arXiv:1810.12836) without printing the loss. Two objectives:

* `"softmax"` (default): in-batch softmax over the batch's translations. With s_ij = sim(x_i, y_j) / t,
  `L = -1/B sum_i log( exp(s_ii) / sum_j exp(s_ij) )` (source -> target; `symmetric=True` averages it with
  target -> source). The default because it needs no teacher and, besides pulling each pair together, pushes
  every sentence away from the batch's non-translations, so the shared space stays discriminative;
  the bridge tasks of [13] are of this kind (translation ranking, a softmax over the batch's candidates).
* `"mse"`: `mean_i ||x_i - stop_grad(y_i)||^2`, regressing the other language onto the English side
  (Reimers & Gurevych 2020 multilingual distillation). It only pulls pairs together, never apart, and needs a
  fixed teacher for the English side (`target` from a frozen encoder): trained end to end with one encoder
  on both sides it is minimised by collapsing all embeddings, so the target is always detached here.

Convention: `source` `[B, d]` is the non-English side, `target` `[B, d]` the English side (row i of each is
one pair). `target_ids` (`[B]`) marks rows with the same English sentence: those off-diagonal pairs are not
used as negatives (WikiMatrix repeats sentences).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

OBJECTIVES = ("softmax", "mse")
SIMILARITIES = ("cosine", "dot")


class TranslationLoss(nn.Module):
    """Translation-pair loss of the bridge task (paper 004 Sec. III; see the module docstring).

    Args:
        objective: "softmax" (in-batch, default) or "mse" (to the detached English side).
        temperature: divides the similarities of "softmax" (> 0; 0.05 suits cosine).
        symmetric: "softmax" in both directions (source -> target and target -> source), averaged.
        similarity: "cosine" (default) or "dot" for "softmax".
    """

    def __init__(self, objective: str = "softmax", temperature: float = 0.05, symmetric: bool = True,
                 similarity: str = "cosine") -> None:
        super().__init__()
        if objective not in OBJECTIVES:
            raise ValueError(f"objective {objective!r} is not one of {', '.join(OBJECTIVES)}")
        if similarity not in SIMILARITIES:
            raise ValueError(f"similarity {similarity!r} is not one of {', '.join(SIMILARITIES)}")
        if temperature <= 0:
            raise ValueError(f"temperature must be > 0, got {temperature}")
        self.objective = objective
        self.temperature = float(temperature)
        self.symmetric = symmetric
        self.similarity = similarity

    def logits(self, source: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        """`[B, B]` similarity of every source to every target, divided by the temperature."""
        if self.similarity == "cosine":
            source, target = F.normalize(source, dim=-1), F.normalize(target, dim=-1)
        return source @ target.T / self.temperature

    def forward(self, source: torch.Tensor, target: torch.Tensor,
                target_ids: torch.Tensor | None = None) -> torch.Tensor:
        if source.dim() != 2 or source.shape != target.shape or source.shape[0] == 0:
            raise ValueError(f"source {tuple(source.shape)} and target {tuple(target.shape)} must both be "
                             "[batch>=1, dim]")
        if self.objective == "mse":
            return (source - target.detach()).pow(2).sum(dim=1).mean()
        logits = self.logits(source, target)
        batch = source.shape[0]
        if target_ids is not None:
            if target_ids.shape != (batch,):
                raise ValueError(f"target_ids must be [batch={batch}], got {tuple(target_ids.shape)}")
            ids = target_ids.to(logits.device)
            same = (ids[:, None] == ids[None, :]) & ~torch.eye(batch, dtype=torch.bool, device=logits.device)
            logits = logits.masked_fill(same, float("-inf"))
        labels = torch.arange(batch, device=logits.device)
        loss = F.cross_entropy(logits, labels)
        if self.symmetric:
            loss = (loss + F.cross_entropy(logits.T, labels)) / 2
        return loss
