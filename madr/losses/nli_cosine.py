"""Cross entropy on the clipped cosine for NLI pairs without contradictions (paper 004 Sec. III, Eq. 2).

Eq. 2: `L = 1/N sum_j y_j log(1 / y^_j) + (1 - y_j) log(1 / (1 - y^_j))`, binary cross entropy with target
y_j = 1 for entailment and 0 for neutral (the contradiction class is dropped, Sec. III). The prediction
must lie in [0, 1]; the paper uses the cosine of the two embeddings projected onto the positive side,
`y^_j = max(0, cos(f(q_j), f(d_j)))` (`mapping="clip"`, the default). `mapping="affine"` uses
`(1 + cos) / 2` instead, which keeps a gradient for entailment pairs whose cosine is negative (under "clip"
such a pair sits at y^ = 0, clamped to eps, with no gradient). The prediction is clamped to [eps, 1 - eps]
so that log(0) never occurs.

`nli_targets` maps the labels of SNLI, MNLI, XNLI and QNLI to these targets and drops what Eq. 2 cannot use.
"""

from __future__ import annotations

import numbers
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

MAPPINGS = ("clip", "affine")

# Label meaning per dataset. Integer ids follow the Hugging Face datasets cards: snli / multi_nli / xnli
# (and glue/mnli) use 0 entailment, 1 neutral, 2 contradiction, -1 = no gold label (SNLI '-');
# glue/qnli uses 0 entailment, 1 not_entailment. Strings are the original corpora's gold labels.
ENTAILMENT, NEGATIVE, CONTRADICTION, NO_LABEL = "entailment", "negative", "contradiction", "no_label"
_THREE_WAY: dict[object, str] = {
    "entailment": ENTAILMENT, "neutral": NEGATIVE, "contradiction": CONTRADICTION, "-": NO_LABEL, "": NO_LABEL,
    0: ENTAILMENT, 1: NEGATIVE, 2: CONTRADICTION, -1: NO_LABEL,
}
LABEL_MEANINGS: dict[str, dict[object, str]] = {
    "snli": _THREE_WAY,
    "mnli": _THREE_WAY,
    "xnli": _THREE_WAY,
    "qnli": {"entailment": ENTAILMENT, "not_entailment": NEGATIVE, 0: ENTAILMENT, 1: NEGATIVE, -1: NO_LABEL},
}


@dataclass(frozen=True)
class NLITargets:
    """Rows of an NLI dataset usable by Eq. 2: `keep` (row indices), their `targets` (1.0 / 0.0), and the
    number of rows dropped as contradictions and as having no gold label ('-', -1)."""

    keep: list[int]
    targets: list[float]
    dropped_contradiction: int
    dropped_no_label: int


def nli_targets(labels: Iterable[object], dataset: str) -> NLITargets:
    """Binary targets for Eq. 2 from NLI `labels` of `dataset` ("snli", "mnli", "xnli" or "qnli").

    entailment -> 1, neutral (QNLI: not_entailment) -> 0, contradiction and no-consensus ('-' / -1) rows are
    dropped and counted. Strings are matched case-insensitively; ints by the Hugging Face ids (see
    `LABEL_MEANINGS`). An unknown label raises ValueError naming the row and the label.
    """
    key = dataset.lower()
    if key not in LABEL_MEANINGS:
        raise ValueError(f"dataset {dataset!r} is not one of {', '.join(LABEL_MEANINGS)}")
    meaning = LABEL_MEANINGS[key]
    keep: list[int] = []
    targets: list[float] = []
    dropped = {CONTRADICTION: 0, NO_LABEL: 0}
    for row, label in enumerate(labels):
        norm = _normalise_label(label)
        if norm is None or norm not in meaning:
            raise ValueError(f"row {row}: label {label!r} is not a {dataset} label "
                             f"(expected one of {sorted(map(str, meaning))})")
        kind = meaning[norm]
        if kind in dropped:
            dropped[kind] += 1
            continue
        keep.append(row)
        targets.append(1.0 if kind == ENTAILMENT else 0.0)
    return NLITargets(keep, targets, dropped[CONTRADICTION], dropped[NO_LABEL])


def _normalise_label(label: object) -> str | int | None:
    """Lower-cased stripped string, or a plain int (numpy ints too); None for anything else (bools, floats)."""
    if isinstance(label, str):
        return label.strip().lower()
    if isinstance(label, numbers.Integral) and not isinstance(label, bool):
        return int(label)
    return None


class NLICosineLoss(nn.Module):
    """Binary cross entropy of Eq. 2 on `y^ = max(0, cos(u, v))` (or `(1 + cos) / 2`), paper 004 Sec. III-A.

    Args:
        mapping: "clip" (paper, default) or "affine".
        eps: the prediction is clamped to [eps, 1 - eps] before the logs.

    Inputs: `u`, `v` `[N, d]` (the two sentences' embeddings) and `targets` `[N]` in {0, 1} (or soft in
    [0, 1]): 1 for entailment, 0 for neutral; see `nli_targets`. Returns the mean over the N pairs.
    """

    def __init__(self, mapping: str = "clip", eps: float = 1e-6) -> None:
        super().__init__()
        if mapping not in MAPPINGS:
            raise ValueError(f"mapping {mapping!r} is not one of {', '.join(MAPPINGS)}")
        if not 0 < eps < 0.5:
            raise ValueError(f"eps must be in (0, 0.5), got {eps}")
        self.mapping = mapping
        self.eps = eps

    def probability(self, u: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """`[N]` predicted probability of entailment, y^ of Eq. 2, clamped to [eps, 1 - eps]."""
        cos = F.cosine_similarity(u, v, dim=-1)
        prob = cos.clamp_min(0.0) if self.mapping == "clip" else (1.0 + cos) / 2.0
        return prob.clamp(self.eps, 1.0 - self.eps)

    def forward(self, u: torch.Tensor, v: torch.Tensor, targets: torch.Tensor | Sequence[float]) -> torch.Tensor:
        if u.dim() != 2 or u.shape != v.shape or u.shape[0] == 0:
            raise ValueError(f"u {tuple(u.shape)} and v {tuple(v.shape)} must both be [N>=1, dim]")
        y = torch.as_tensor(targets, dtype=u.dtype, device=u.device)
        if y.shape != (u.shape[0],):
            raise ValueError(f"targets must be [N={u.shape[0]}], got {tuple(y.shape)}")
        if ((y < 0) | (y > 1)).any():
            raise ValueError("targets must lie in [0, 1] (1 entailment, 0 neutral)")
        prob = self.probability(u, v)
        return -(y * prob.log() + (1.0 - y) * (1.0 - prob).log()).mean()
