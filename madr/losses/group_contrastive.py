"""MURAL's group-wise contrastive aspect loss (paper 001 Eq. 2) and its grouping over objectives (Eq. 3-5)."""

from __future__ import annotations

import torch
from torch import nn

from madr.losses.aspect_prediction import masked_mean, multi_label_nll

GROUPINGS = ("single", "granularity", "aspect")


class GroupWiseContrastiveLoss(nn.Module):
    """Group-wise contrastive loss of one aspect at one granularity (paper 001 Sec. 4.2, Eq. 2).

    `L_a^g(X) = -1/|A_a^g| * sum_{o+ in A_a^g} log( exp(h . e_o+) / sum_{v in V_a^g} exp(h . e_v) )`:
    the aspect representation is pulled towards each annotated value and pushed from every other value
    of the vocabulary; sim is the dot product (no temperature, no bias). The loss is the mean over the
    rows that have annotations; rows without one contribute nothing, and a batch without any gives a
    zero still connected to the graph.

    Inputs: `h [B, H]` the representation `h_a^g(X)` (the aspect token's hidden state), `values [V, H]`
    the value embedding table `E_a^g` (unshared) or the averaged token embeddings (shared), and
    `labels [B, M]` value ids padded with -1.

    Numerically this is `AspectPredictionLoss` on `h @ values.T`; prefer that one when the model has a
    linear classifier with a bias (MADRAL, paper 000 Eq. 3). Combine several `(aspect, granularity)`
    objectives with `combine_objectives`.
    """

    def forward(self, h: torch.Tensor, values: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        if h.dim() != 2 or values.dim() != 2 or h.shape[1] != values.shape[1]:
            raise ValueError(f"h must be [batch, hidden] and values [num_values, hidden] with the same hidden "
                             f"size, got {tuple(h.shape)} and {tuple(values.shape)}")
        per_row, has_label = multi_label_nll(h @ values.T, labels)
        return masked_mean(per_row, has_label)


def _mean(items: list[torch.Tensor]) -> torch.Tensor:
    return torch.stack(items).mean()


def _nested_mean(present: dict[tuple[str, str], torch.Tensor], group_by: int) -> torch.Tensor:
    """Mean over groups (key[group_by]) of the mean over that group's present objectives."""
    groups: dict[str, list[torch.Tensor]] = {}
    for key, loss in present.items():
        groups.setdefault(key[group_by], []).append(loss)
    return _mean([_mean(members) for members in groups.values()])


def combine_objectives(losses: dict[tuple[str, str], torch.Tensor], has_label: dict[tuple[str, str], bool],
                       grouping: str) -> torch.Tensor:
    """Aspect learning loss L_A over the `(aspect, granularity)` objectives `L_a^g` (paper 001 Sec. 4.3).

    - `"single"` (Eq. 3): mean over all objectives.
    - `"granularity"` (Eq. 4): mean over granularities of the mean over that granularity's aspects.
    - `"aspect"` (Eq. 5): mean over aspects of the mean over that aspect's granularities.

    An objective whose batch has no annotation (`has_label[key]` False) is left out of its inner mean,
    and a group left empty is left out of the outer mean. With every objective of the full |A| x |G|
    grid present the three are equal in value; the groupings then differ only in which guiding token
    carries which objectives (one per objective, per granularity, or per aspect). With objectives
    missing they differ, e.g. the aspect grouping keeps an aspect's weight at 1/|A| when only one of
    its granularities is annotated. If nothing is annotated: a zero still connected to the graph.

    Args:
        losses: `L_a^g` per `(aspect, granularity)`, scalars (e.g. from `GroupWiseContrastiveLoss`).
        has_label: for the same keys, whether any row of the batch had an annotation.
        grouping: one of "single", "granularity", "aspect".
    """
    if grouping not in GROUPINGS:
        raise ValueError(f"grouping {grouping!r} is not one of {', '.join(GROUPINGS)}")
    if not losses:
        raise ValueError("combine_objectives needs at least one (aspect, granularity) loss")
    if set(losses) != set(has_label):
        raise ValueError(f"losses and has_label must have the same (aspect, granularity) keys; only in one: "
                         f"{sorted(set(losses) ^ set(has_label))}")
    not_scalar = [key for key, loss in losses.items() if loss.dim() != 0]
    if not_scalar:
        raise ValueError(f"each objective loss must be a scalar; not scalar: {not_scalar}")
    present = {key: loss for key, loss in losses.items() if bool(has_label[key])}
    if not present:
        return torch.stack([loss.sum() for loss in losses.values()]).sum() * 0.0
    if grouping == "single":
        return _mean(list(present.values()))
    return _nested_mean(present, group_by=1 if grouping == "granularity" else 0)
