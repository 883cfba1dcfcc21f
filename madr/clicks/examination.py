"""The examination curve of a click log, estimated from the log itself, written as JSON and plotted.

Position-based model (PBM; Richardson et al., WWW'07; Craswell et al., WSDM'08): a document shown at rank k is
clicked iff it is examined (probability theta_k, the rank's alone) and found attractive (gamma_qd, the query-document
pair's alone): P(C = 1 | q, d, k) = theta_k gamma_qd. `estimate_examination` fits theta and gamma by the EM of
Wang et al., WSDM'18 ("Position Bias Estimation for Unbiased Learning to Rank in Personal Search", Sec. 4.1: the
E-step's posteriors of a non-click, P(E=1, R=0 | C=0) = theta (1 - gamma) / (1 - theta gamma) and
P(E=0, R=1 | C=0) = (1 - theta) gamma / (1 - theta gamma); the M-step's ratios), with one free gamma per pair
(their regression EM replaces it by a feature model; a pair seen often enough needs none). theta is identified by
the same pair shown at different ranks (the interventions of Agarwal et al., WSDM'19): a log whose ranker never
varies cannot separate rank from relevance, which `ExaminationCurve.pairs_at_several_ranks` reports
(`madr.clicks.harvesting` estimates the curve from those pairs alone and refuses a log without enough of them). Propensities
are reported relative to rank 1 (`propensity[k] = theta_k / theta_1`: what inverse-propensity weights need).
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

EPS = 1e-6


@dataclass
class ExaminationCurve:
    """Per rank 1..K: `propensity` (theta_k / theta_1), `theta`, impressions, clicks and the naive click-through
    rate; the fit's iterations and final log-likelihood; how many pairs were seen at more than one rank. `estimator`:
    "em" (this module) or "harvest" (`madr.clicks.harvesting`, whose `theta` is the propensity: only ratios are
    identified there, and whose `interventions` counts the harvested pairs per rank pair, {"k-k'": n}). `fallback`:
    why the "auto" estimator used EM instead of harvesting (None when it did not fall back). `click_noise`: the
    click-noise floor the log's judgments were weighted with (`madr.clicks.noise.ClickNoise.to_dict`), once known."""

    propensity: list[float]
    theta: list[float]
    impressions: list[int]
    clicks: list[int]
    ctr: list[float]
    iterations: int
    log_likelihood: float
    pairs: int
    pairs_at_several_ranks: int
    method: str = "PBM regression-free EM (Wang et al., WSDM'18)"
    truth: list[float] | None = field(default=None)
    estimator: str = "em"
    interventions: dict[str, int] | None = field(default=None)
    fallback: str | None = field(default=None)
    click_noise: dict[str, Any] | None = field(default=None)

    def at(self, rank: int) -> float:
        """The propensity of `rank` (1-based); ranks beyond the curve take its last value."""
        return self.propensity[min(max(rank, 1), len(self.propensity)) - 1]

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ExaminationCurve:
        return cls(**data)


def _encode_pairs(queries: np.ndarray, docs: np.ndarray) -> np.ndarray:
    keys = np.char.add(np.char.add(queries.astype(str), "\x1f"), docs.astype(str))
    return np.unique(keys, return_inverse=True)[1]


def estimate_examination(queries: Any, docs: Any, positions: Any, clicked: Any, max_rank: int = 10,
                         iterations: int = 200, tolerance: float = 1e-6) -> ExaminationCurve:
    """Fit the PBM by EM on impressions (module docstring); impressions beyond `max_rank` are left out."""
    positions = np.asarray(positions, dtype=np.int64)
    keep = (positions >= 1) & (positions <= max_rank)
    if not keep.any():
        raise ValueError(f"no impression at ranks 1..{max_rank}")
    k = positions[keep] - 1
    c = np.asarray(clicked, dtype=np.float64)[keep]
    pair = _encode_pairs(np.asarray(queries)[keep], np.asarray(docs)[keep])
    n_pairs = int(pair.max()) + 1
    shown = np.bincount(k, minlength=max_rank).astype(np.float64)
    clicks = np.bincount(k, weights=c, minlength=max_rank)
    ctr = clicks / np.maximum(shown, 1)
    theta = np.clip(ctr / max(ctr.max(), EPS), 0.05, 0.95)
    gamma = np.full(n_pairs, 0.5)
    pair_n = np.bincount(pair, minlength=n_pairs).astype(np.float64)
    previous, done, ll = -np.inf, 0, 0.0
    while done < iterations:
        done += 1
        t, g = theta[k], gamma[pair]
        denominator = np.maximum(1 - t * g, EPS)
        examined = c + (1 - c) * t * (1 - g) / denominator
        relevant = c + (1 - c) * (1 - t) * g / denominator
        theta = np.clip(np.bincount(k, weights=examined, minlength=max_rank) / np.maximum(shown, 1), EPS, 1 - EPS)
        gamma = np.clip(np.bincount(pair, weights=relevant, minlength=n_pairs) / pair_n, EPS, 1 - EPS)
        p = theta[k] * gamma[pair]
        ll = float(np.sum(c * np.log(p) + (1 - c) * np.log(1 - p)))
        if ll - previous < tolerance * abs(ll):
            break
        previous = ll
    ranks_per_pair = np.unique(np.stack([pair, k]), axis=1)[0]
    several = int(np.sum(np.bincount(ranks_per_pair, minlength=n_pairs) > 1))
    return ExaminationCurve(propensity=(theta / theta[0]).round(6).tolist(), theta=theta.round(6).tolist(),
                            impressions=shown.astype(int).tolist(), clicks=clicks.astype(int).tolist(),
                            ctr=ctr.round(6).tolist(), iterations=done, log_likelihood=round(ll, 3), pairs=n_pairs,
                            pairs_at_several_ranks=several)


def estimate_from_table(impressions: Any, max_rank: int = 10, iterations: int = 200) -> ExaminationCurve:
    """`estimate_examination` on an impressions table (`madr.clicks.collapse.IMPRESSION_SCHEMA`)."""
    cols = {n: impressions.column(n).to_numpy(zero_copy_only=False) for n in ("query", "doc_id", "position",
                                                                            "clicked")}
    return estimate_examination(cols["query"], cols["doc_id"], cols["position"], cols["clicked"], max_rank,
                                iterations)


def curve_error(curve: ExaminationCurve, truth: Any) -> float:
    """The largest absolute difference between the estimated and the true propensities (both relative to rank 1)."""
    truth = np.asarray(truth, dtype=np.float64)[: len(curve.propensity)]
    return float(np.max(np.abs(np.asarray(curve.propensity[: len(truth)]) - truth / truth[0])))


def write_curve(curve: ExaminationCurve, directory: str | Path, name: str = "examination") -> tuple[Path, Path]:
    """`<name>.json` (the curve: its estimator and, for harvesting, the interventions per rank pair) and
    `<name>.png` (estimated propensity, naive CTR relative to rank 1, and the truth when known) under `directory`."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out = Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    json_path, png_path = out / f"{name}.json", out / f"{name}.png"
    json_path.write_text(json.dumps(curve.to_dict(), indent=1))
    ranks = np.arange(1, len(curve.propensity) + 1)
    fig, ax = plt.subplots(figsize=(5, 3.5))
    label = "intervention harvesting" if curve.estimator == "harvest" else "PBM EM"
    ax.plot(ranks, curve.propensity, "o-", label=f"estimated ({label})")
    ctr = np.asarray(curve.ctr)
    ax.plot(ranks, ctr / max(ctr[0], EPS), "s--", alpha=0.6, label="click-through rate / CTR@1")
    if curve.truth is not None:
        truth = np.asarray(curve.truth[: len(ranks)])
        ax.plot(ranks[: len(truth)], truth / truth[0], "k:", label="true (simulated)")
    ax.set_xlabel("rank")
    ax.set_ylabel("examination relative to rank 1")
    ax.set_ylim(0, 1.1)
    ax.legend()
    title = f"{sum(curve.impressions)} impressions, {curve.pairs_at_several_ranks} pairs at several ranks"
    if curve.interventions is not None:
        title += f", {sum(curve.interventions.values())} harvested (pair, rank pair)s"
    ax.set_title(title, fontsize=9)
    fig.tight_layout()
    fig.savefig(png_path, dpi=120)
    plt.close(fig)
    return json_path, png_path
