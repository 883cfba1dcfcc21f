"""Temperature scaling of the aspect value predictions, so `/explain`'s confidences mean what they say.

Paper 000 Table 8 reports, per aspect, the top value of `P(x) = softmax(E_a U_a^T + b_a)` (Eq. 3). A model
trained for a few hundred steps over vocabularies of thousands of values ranks the right value first far
above chance yet spreads its mass thinly: the top value is right half the time with a probability of 0.02.
Temperature scaling (Guo et al., "On Calibration of Modern Neural Networks", ICML 2017, Sec. 4.2) fits one
scalar T per aspect and side on held-out annotated texts by minimising the loss the model was trained
with (Eq. 3 on `logits / T`). It leaves every ranking, hence Accuracy@1 and retrieval, unchanged; only the
reported confidence moves, toward the frequency with which the top value is right.

A fitted calibration is saved next to the model (`aspect_calibration.json`) and read by `BiEncoder.load`.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path

import torch

from madr.losses.aspect_prediction import multi_label_nll

CALIBRATION_FILE = "aspect_calibration.json"
SIDES = ("query", "doc")


def scaled_nll(logits: torch.Tensor, labels: torch.Tensor, temperature: float) -> float:
    """Mean paper 000 Eq. 3 loss of `logits / temperature` over the rows with at least one label."""
    per_row, has = multi_label_nll(logits / temperature, labels)
    return float(per_row[has].mean()) if bool(has.any()) else math.nan


def fit_temperature(logits: torch.Tensor, labels: torch.Tensor, low: float = 1e-3, high: float = 1e3,
                    iterations: int = 80) -> float:
    """The T in [low, high] minimising `scaled_nll`: golden-section search over log T.

    The loss is convex in 1/T (a log-sum-exp of linear functions of 1/T minus a linear one), so it is
    unimodal in log T and the search finds its minimum. `logits [N, V]`, `labels [N, M]` value ids padded
    with -1 (as `AspectPredictionLoss`); at least one row needs a label."""
    if not bool((labels >= 0).any()):
        raise ValueError("fit_temperature: no row has a label to calibrate on")
    logits = logits.detach().float()
    a, b = math.log(low), math.log(high)
    ratio = (math.sqrt(5) - 1) / 2
    c, d = b - ratio * (b - a), a + ratio * (b - a)
    fc, fd = scaled_nll(logits, labels, math.exp(c)), scaled_nll(logits, labels, math.exp(d))
    for _ in range(iterations):
        if fc <= fd:
            b, d, fd = d, c, fc
            c = b - ratio * (b - a)
            fc = scaled_nll(logits, labels, math.exp(c))
        else:
            a, c, fc = c, d, fd
            d = a + ratio * (b - a)
            fd = scaled_nll(logits, labels, math.exp(d))
    return math.exp((a + b) / 2)


def top_confidence(logits: torch.Tensor, temperature: float = 1.0) -> tuple[torch.Tensor, torch.Tensor]:
    """(confidence [N], value id [N]) of the top value of `softmax(logits / temperature)`."""
    return torch.softmax(logits.float() / temperature, dim=-1).max(dim=-1)


def expected_calibration_error(confidence: torch.Tensor, correct: torch.Tensor, bins: int = 10) -> float:
    """ECE (Guo et al. 2017, Eq. 3): the |accuracy - mean confidence| of equal-width confidence bins,
    weighted by the share of items in each bin."""
    if confidence.numel() == 0:
        return math.nan
    edges = torch.linspace(0, 1, bins + 1)
    which = torch.bucketize(confidence.clamp(0, 1), edges[1:-1], right=True)
    total = 0.0
    for k in range(bins):
        inside = which == k
        if bool(inside.any()):
            gap = correct[inside].float().mean() - confidence[inside].mean()
            total += float(inside.float().mean()) * abs(float(gap))
    return total


def correct_top(logits: torch.Tensor, labels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(rows with a label [N] bool, top value is one of the row's labels [N] bool)."""
    top = logits.argmax(dim=-1, keepdim=True)
    return (labels >= 0).any(dim=1), ((labels == top) & (labels >= 0)).any(dim=1)


@dataclass
class AspectCalibration:
    """Per side ("query" / "doc") and aspect objective key (e.g. "brand"), the fitted temperature; keys with
    no entry keep T = 1. `fitted_on` says on what (e.g. "dev split: 1,000 queries, 6,000 products")."""

    temperatures: dict[str, dict[str, float]] = field(default_factory=dict)
    fitted_on: str = ""

    def temperature(self, side: str, key: str) -> float:
        return self.temperatures.get(side, {}).get(key, 1.0)

    def save(self, directory: str | Path) -> Path:
        path = Path(directory) / CALIBRATION_FILE
        path.write_text(json.dumps({"temperatures": self.temperatures, "fitted_on": self.fitted_on}, indent=2))
        return path

    @classmethod
    def load(cls, directory: str | Path) -> AspectCalibration | None:
        """The calibration saved in a model directory, None when it has none."""
        path = Path(directory) / CALIBRATION_FILE
        if not path.is_file():
            return None
        raw = json.loads(path.read_text())
        temps = raw.get("temperatures")
        if not isinstance(temps, dict) or any(s not in SIDES for s in temps):
            raise ValueError(f"{path}: 'temperatures' must map the sides {SIDES} to {{aspect: T}}")
        for side, per in temps.items():
            for key, t in per.items():
                if not isinstance(t, (int, float)) or not t > 0:
                    raise ValueError(f"{path}: temperatures.{side}.{key} = {t!r} is not a positive number")
        return cls({s: {k: float(t) for k, t in per.items()} for s, per in temps.items()}, raw.get("fitted_on", ""))
