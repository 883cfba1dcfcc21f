"""Aspect prediction loss: multi-label softmax cross entropy over an aspect's value vocabulary (paper 000 Eq. 3)."""

from __future__ import annotations

import torch
from torch import nn


def _check_labels(logits: torch.Tensor, labels: torch.Tensor, name: str = "labels") -> None:
    if logits.dim() != 2:
        raise ValueError(f"logits must be [batch, num_values], got shape {tuple(logits.shape)}")
    if labels.dim() != 2 or labels.shape[0] != logits.shape[0]:
        raise ValueError(f"{name} must be [batch={logits.shape[0]}, max_labels] value ids padded with -1, "
                         f"got shape {tuple(labels.shape)}")
    if labels.dtype not in (torch.int64, torch.int32):
        raise ValueError(f"{name} must hold integer value ids (LongTensor), got dtype {labels.dtype}")
    bad = (labels < -1) | (labels >= logits.shape[1])
    if bad.any():
        row, col = (int(i) for i in bad.nonzero()[0])
        raise ValueError(f"{name}[{row}, {col}] = {int(labels[row, col])} is not a value id in "
                         f"[0, {logits.shape[1]}) nor the padding -1")


def multi_label_nll(logits: torch.Tensor, labels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-row `-1/|A| * sum_{x in A} log softmax(logits)[x]`, A = the row's set of valid value ids.

    Args:
        logits: `[B, V]` scores over the value vocabulary.
        labels: `[B, M]` LongTensor of value ids padded with -1. A repeated id counts once (A is a set).

    Returns:
        `(per_row_loss [B], has_label [B] bool)`. Rows without a valid id have loss exactly 0 (no NaN)
        and `has_label` False; reduce with `masked_mean`.
    """
    _check_labels(logits, labels)
    log_probs = torch.log_softmax(logits, dim=-1)
    ids, _ = labels.sort(dim=1)  # equal ids become neighbours, so repeats can be dropped
    valid = ids >= 0
    valid[:, 1:] &= ids[:, 1:] != ids[:, :-1]
    picked = log_probs.gather(1, ids.clamp(min=0))
    picked = torch.where(valid, picked, torch.zeros_like(picked))  # where, not *, so a -inf logit cannot NaN
    count = valid.sum(dim=1)
    per_row = -picked.sum(dim=1) / count.clamp(min=1).to(picked.dtype)
    return per_row, count > 0


def masked_mean(values: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
    """Mean of `values[keep]`; a zero still on the graph of `values` when nothing is kept (no host sync)."""
    values = torch.where(keep, values, torch.zeros_like(values))
    return values.sum() / keep.sum().clamp(min=1).to(values.dtype)


class AspectPredictionLoss(nn.Module):
    """Aspect prediction (AP) loss of one aspect (paper 000 Sec. 5, Eq. 3).

    `P(x) = softmax(E_a U_a^T + b_a)[x]` and, per input with annotation set `A_a`,
    `L_AP^a = -1/|A_a| * sum_{x in A_a} log P(x)`: several annotations (e.g. {Sandals, Shoes}) are
    averaged. The loss is the mean over the rows that have at least one annotation; rows without one
    contribute nothing. If no row has an annotation it is a zero still connected to the graph.

    Inputs: `logits [B, V]` (= `E_a U_a^T + b_a`, computed by the model with its value table and bias)
    and `labels [B, M]` value ids padded with -1. The OTHER aspect has no vocabulary and gets no AP loss.

    Use this when the model owns a linear value classifier (MADRAL, MtBERT). When the value embeddings
    are a table to dot the aspect representation with (MURAL, shared or unshared tables), use
    `GroupWiseContrastiveLoss`, which is the same loss with `logits = h @ values.T` and no bias.
    """

    def forward(self, logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        per_row, has_label = multi_label_nll(logits, labels)
        return masked_mean(per_row, has_label)
