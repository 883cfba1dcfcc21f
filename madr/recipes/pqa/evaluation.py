"""Evaluating product-QA models in the paper's setting (paper 002 Sec. 5-6).

Each question's candidate evidences are re-ranked (Sec. 5: "we sorted all the candidate information based on
Equation 1") and scored with MAP, R-Prec, MRR@5, NDCG, Hit@5 and P@1 (Sec. 6) for: a random order, BM25 on
the tokenizer's wordpieces (row a of Table 3), the independently trained dense and sparse models and their
interpolation, the two halves of the joint model (lambda = 1 and 0, the ends of Fig. 4), the joint hybrid
with lambda and the score normalisation tuned on dev MRR@5, and the hybrid with the source-aware prior
(Sec. 6.2: min-max normalised Eq. 1 score times the source's hit-rate@5 measured on dev with the regular
ranking). Nothing is tuned on test.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from madr.data.records import EvidenceRecord
from madr.metrics import Run, evaluate
from madr.modeling.model import BiEncoder
from madr.recipes.pqa.scoring import SplitScores, score_split
from madr.search.params import NORMALISATIONS
from madr.search.score_fusion import source_prior_rerank, source_priors_from_validation

PQA_METRICS = ("map", "r_precision", "mrr@5", "ndcg", "hit@5", "precision@1")
TUNE_METRIC = "mrr@5"
LAMBDA_GRID = tuple(round(0.05 * i, 2) for i in range(21))
ROW_LABELS = {
    "random": "Random order",
    "bm25": "BM25 (wordpieces)",
    "dense_alone": "Dense, trained alone",
    "sparse_alone": "Sparse, trained alone",
    "fusion_alone": "Dense + sparse trained alone, interpolated",
    "dense_part": "Hybrid, dense part (lambda=1)",
    "sparse_part": "Hybrid, sparse part (lambda=0)",
    "hybrid": "Hybrid",
    "source_prior": "Hybrid + source prior",
}


def metrics_of(scores: SplitScores, run: Run) -> dict[str, float]:
    return evaluate(run, scores.qrels, list(PQA_METRICS))


def mrr5(scores: SplitScores, values: list[np.ndarray]) -> float:
    return evaluate(scores.run(values), scores.qrels, TUNE_METRIC)[TUNE_METRIC]


def tune_lambda(dev: SplitScores, normalisations: Sequence[str] = NORMALISATIONS,
                grid: Sequence[float] = LAMBDA_GRID) -> tuple[float, str, float]:
    """(lambda, normalisation, dev MRR@5) maximising dev MRR@5; ties keep the first in (normalisation,
    grid) order."""
    best = (grid[0], normalisations[0], -1.0)
    for norm in normalisations:
        for lam in grid:
            value = mrr5(dev, dev.hybrid(lam, norm))
            if value > best[2] + 1e-12:
                best = (float(lam), norm, value)
    return best


def _padded(rows: list[np.ndarray], fill: object, dtype: object) -> np.ndarray:
    out = np.full((len(rows), max(len(r) for r in rows)), fill, dtype=dtype)
    for i, r in enumerate(rows):
        out[i, : len(r)] = r
    return out


def source_aware_scores(scores: SplitScores, lam: float, priors: dict[str, float]) -> list[np.ndarray]:
    """Sec. 6.2: min-max normalised Eq. 1 score times the candidate's source prior (unknown source: 0)."""
    combined = _padded(scores.hybrid(lam, "minmax"), -np.inf, np.float64)
    sources = _padded([np.array(s, dtype=object) for s in scores.sources], None, object)
    weighted, cols = source_prior_rerank(combined, sources, priors, default_prior=0.0)
    out = []
    for i, n in enumerate(len(s) for s in scores.sources):
        row = np.empty(n)
        live = cols[i] >= 0
        row[cols[i][live]] = weighted[i][live]
        out.append(row)
    return out


def source_priors(dev: SplitScores, lam: float, k: int = 5) -> dict[str, float]:
    """Per-source hit-rate@k of the regular (min-max, Eq. 1) ranking at `lam` on dev: the Sec. 6.2 prior."""
    return source_priors_from_validation(dev.run(dev.hybrid(lam, "minmax")), dev.qrels, dev.doc_source(), k=k)


def tune_source_aware(dev: SplitScores, grid: Sequence[float] = LAMBDA_GRID,
                      k: int = 5) -> tuple[float, dict[str, float], float]:
    """(lambda, priors, dev MRR@5) of the source-aware ranking maximising dev MRR@5; the priors at each
    lambda come from that lambda's regular ranking (paper 002 Fig. 4, solid lines)."""
    best: tuple[float, dict[str, float], float] = (grid[0], {}, -1.0)
    for lam in grid:
        priors = source_priors(dev, lam, k)
        value = mrr5(dev, source_aware_scores(dev, lam, priors))
        if value > best[2] + 1e-12:
            best = (float(lam), priors, value)
    return best


def lambda_sweep(dev: SplitScores, test: SplitScores, grid: Sequence[float] = LAMBDA_GRID,
                 normalisations: Sequence[str] = NORMALISATIONS, k: int = 5) -> dict[str, list[float]]:
    """Test MRR@5 over the lambda grid (paper 002 Fig. 4) per normalisation, and "source_prior" with the
    priors measured on dev at each lambda."""
    out = {"lambda": [float(x) for x in grid]}
    for norm in normalisations:
        out[norm] = [mrr5(test, test.hybrid(lam, norm)) for lam in grid]
    out["source_prior"] = [mrr5(test, source_aware_scores(test, lam, source_priors(dev, lam, k))) for lam in grid]
    return out


@dataclass
class PQAReport:
    """Test (and dev) metrics per method key of `ROW_LABELS`, what was chosen on dev, and the sweep."""

    rows: dict[str, dict[str, float]]
    lam: float
    normalisation: str
    lam_source: float
    dev_mrr5: float
    priors: dict[str, float]
    dev_rows: dict[str, dict[str, float]] = field(default_factory=dict)
    fusion: tuple[float, str] | None = None
    sparsity: dict[str, dict[str, float]] = field(default_factory=dict)
    sweep: dict[str, list[float]] = field(default_factory=dict)

    def label(self, key: str) -> str:
        """Row label with what was chosen on dev."""
        if key == "hybrid":
            return f"Hybrid (lambda={self.lam:g}, {self.normalisation}; dev-tuned)"
        if key == "source_prior":
            return f"Hybrid + source prior (lambda={self.lam_source:g}, minmax; dev-tuned)"
        if key == "fusion_alone" and self.fusion is not None:
            return f"{ROW_LABELS[key]} (lambda={self.fusion[0]:g}, {self.fusion[1]}; dev-tuned)"
        return ROW_LABELS[key]


def _random_scores(scores: SplitScores, seed: int = 0) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [rng.random(len(ids)) for ids in scores.evidence_ids]


def evaluate_pqa(model: BiEncoder, records: Sequence[EvidenceRecord], batch_size: int = 128,
                 grid: Sequence[float] = LAMBDA_GRID, normalisations: Sequence[str] = NORMALISATIONS,
                 dense_model: BiEncoder | None = None, sparse_model: BiEncoder | None = None,
                 prior_k: int = 5, sweep: bool = False) -> PQAReport:
    """Every row of `ROW_LABELS` on test (the "alone" rows need `dense_model` / `sparse_model`), with
    lambda, normalisation and source priors chosen on dev; `sweep=True` adds `lambda_sweep`."""
    dev, test = score_split(model, records, "dev", batch_size), score_split(model, records, "test", batch_size)
    lam, norm, dev_mrr = tune_lambda(dev, normalisations, grid)
    lam_src, priors, _ = tune_source_aware(dev, grid, prior_k)
    alone = {name: (score_split(m, records, "dev", batch_size), score_split(m, records, "test", batch_size))
             for name, m in (("dense", dense_model), ("sparse", sparse_model)) if m is not None}
    fusion = None
    if len(alone) == 2:
        fused_dev = dev.combine(alone["dense"][0], alone["sparse"][0])
        fusion = tune_lambda(fused_dev, normalisations, grid)[:2]

    def rows(s: SplitScores, which: int) -> dict[str, dict[str, float]]:
        out = {"random": metrics_of(s, s.run(_random_scores(s))), "bm25": metrics_of(s, s.run(s.bm25))}
        if "dense" in alone:
            d = alone["dense"][which]
            out["dense_alone"] = metrics_of(d, d.run(d.dense))
        if "sparse" in alone:
            sp = alone["sparse"][which]
            out["sparse_alone"] = metrics_of(sp, sp.run(sp.sparse))
        if fusion is not None:
            f = s.combine(alone["dense"][which], alone["sparse"][which])
            out["fusion_alone"] = metrics_of(f, f.run(f.hybrid(*fusion)))
        out["dense_part"] = metrics_of(s, s.run(s.dense))
        out["sparse_part"] = metrics_of(s, s.run(s.sparse))
        out["hybrid"] = metrics_of(s, s.run(s.hybrid(lam, norm)))
        out["source_prior"] = metrics_of(s, s.run(source_aware_scores(s, lam_src, priors)))
        return out

    sparsity = {"hybrid": {"query_nnz": test.query_nnz, "doc_nnz": test.doc_nnz}}
    if "sparse" in alone:
        sparsity["sparse_alone"] = {"query_nnz": alone["sparse"][1].query_nnz, "doc_nnz": alone["sparse"][1].doc_nnz}
    return PQAReport(rows(test, 1), lam, norm, lam_src, dev_mrr, priors, dev_rows=rows(dev, 0), fusion=fusion,
                     sparsity=sparsity, sweep=lambda_sweep(dev, test, grid, normalisations, prior_k) if sweep else {})
