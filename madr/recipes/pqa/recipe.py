"""Product-QA evidence ranking with the hybrid model (paper 002): config, sampler, training, scoring, evaluation.

Training (paper 002 Sec. 4.3, Eq. 3-5): questions are the queries; each example pairs a question with one
of its positive evidences and one hard negative drawn from the same question's negative candidates,
besides the in-batch negatives. `representation` picks the loss terms of Eq. 5: "hybrid" (L_dense +
L_sparse + lambda_q FLOPS(q) + lambda_d FLOPS(p), the joint model), "dense" (L_dense only: the
independently trained dense encoder of Table 3 row c) or "sparse" (L_sparse + FLOPS: row e, which "does
not incorporate semantic matching in computing the loss and the score", Sec. 5). All three use the same
architecture (hybrid head on the same backbone) and the same loop, so only the loss differs. An optional
short MLM stage first grounds the MLM head of a backbone trained from scratch.

Evaluation is the paper's setting: each question's candidate evidences are re-ranked (Sec. 5: "we sorted
all the candidate information based on Equation 1") and scored with MAP, R-Prec, MRR@5, NDCG, Hit@5 and
P@1 (Sec. 6) for: a random order, BM25 on the tokenizer's wordpieces (row a of Table 3), the independently
trained dense and sparse models and their interpolation, the two halves of the joint model (lambda = 1
and 0, the ends of Fig. 4), the joint hybrid with lambda and the score normalisation tuned on dev MRR@5,
and the hybrid with the source-aware prior (Sec. 6.2: min-max normalised Eq. 1 score times the source's
hit-rate@5 measured on dev with the regular ranking). Nothing is tuned on test.
"""

from __future__ import annotations

import dataclasses
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from transformers import PreTrainedTokenizerBase

from madr.config import BackboneConfig, ModelConfig, StageConfig, load_dataclass
from madr.data.records import EVIDENCE_SOURCES, EvidenceRecord
from madr.metrics import Qrels, Run, evaluate
from madr.modeling.model import BiEncoder, build_model
from madr.modeling.outputs import TowerOutput
from madr.search.hybrid import EncodedTexts, HybridSearcher, encode_corpus, encode_hybrid
from madr.search.params import NORMALISATIONS
from madr.search.score_fusion import normalise, source_prior_rerank, source_priors_from_validation
from madr.search.sparse import BM25Index
from madr.training.loop import FinetuneExample, Optimisation, finetune_batches, run_steps, train_stage
from madr.training.objectives import LossParts, hybrid_loss

PQA_METRICS = ("map", "r_precision", "mrr@5", "ndcg", "hit@5", "precision@1")
TUNE_METRIC = "mrr@5"
LAMBDA_GRID = tuple(round(0.05 * i, 2) for i in range(21))
REPRESENTATIONS = ("hybrid", "dense", "sparse")
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


# ---- config ------------------------------------------------------------------------------------------------


def _hybrid_model_config() -> ModelConfig:
    return ModelConfig(name="hybrid", shared_towers=True, similarity="dot", sparse_top_k=256, max_query_length=32,
                       max_doc_length=48)


@dataclass
class PQADataConfig:
    """`madr.data.synthetic.pqa.generate_pqa` arguments and the WordPiece size for a from-scratch backbone."""

    products: int = 300
    questions: int = 1500
    seed: int = 0
    tokenizer_vocab_size: int = 3000


@dataclass
class PQAEvalConfig:
    """Lambda grid step, normalisations tried on dev, the prior's hit-rate cutoff, encoding batch size."""

    lambda_step: float = 0.05
    normalisations: list[str] = field(default_factory=lambda: list(NORMALISATIONS))
    prior_k: int = 5
    batch_size: int = 128

    def __post_init__(self) -> None:
        if not 0 < self.lambda_step <= 1:
            raise ValueError(f"eval.lambda_step must be in (0, 1], got {self.lambda_step}")
        bad = [n for n in self.normalisations if n not in NORMALISATIONS]
        if bad or not self.normalisations:
            raise ValueError(f"eval.normalisations: {bad or 'empty'}; choose from {', '.join(NORMALISATIONS)}")

    @property
    def grid(self) -> tuple[float, ...]:
        n = round(1 / self.lambda_step)
        return tuple(round(min(1.0, i * self.lambda_step), 6) for i in range(n + 1))


@dataclass
class PQAConfig:
    """One synthetic product-QA experiment (`configs/pqa_synthetic.yaml`): data, model, training, evaluation.

    `representations`: which models to train (each once per seed): "hybrid" is required, "dense" and
    "sparse" are the independently trained single-representation baselines. `pretrain` (MLM warm-up) is
    skipped when None or 0 steps.
    """

    name: str = "pqa_synthetic"
    data: PQADataConfig = field(default_factory=PQADataConfig)
    model: ModelConfig = field(default_factory=_hybrid_model_config)
    pretrain: StageConfig | None = None
    finetune: StageConfig = field(default_factory=lambda: StageConfig(steps=300, batch_size=32, learning_rate=5e-4))
    representations: list[str] = field(default_factory=lambda: list(REPRESENTATIONS))
    seeds: list[int] = field(default_factory=lambda: [0])
    eval: PQAEvalConfig = field(default_factory=PQAEvalConfig)

    def __post_init__(self) -> None:
        if not self.model.has_sparse:
            raise ValueError(f"model.name must be 'hybrid' for product-QA evidence ranking, got {self.model.name!r}")
        bad = [r for r in self.representations if r not in REPRESENTATIONS]
        if bad or "hybrid" not in self.representations:
            raise ValueError(f"representations must include 'hybrid' and be among {REPRESENTATIONS}, got "
                             f"{self.representations}")
        if not self.seeds:
            raise ValueError("seeds is empty; give at least one seed")


def load_pqa_config(path: str | Path | None = None, overrides: dict[str, Any] | None = None) -> PQAConfig:
    """Load a PQA experiment YAML (defaults when None), then dotted overrides like `{"finetune.steps": 50}`.
    Unknown keys are errors naming their path (`madr.config.from_dict`)."""
    return load_dataclass(PQAConfig, path, overrides)


# ---- data ----------------------------------------------------------------------------------------------------


def group_questions(records: Sequence[EvidenceRecord], split: str | None = None) -> dict[str, list[EvidenceRecord]]:
    """question id -> its candidate records (in record order), for one split or all; checks consistency."""
    groups: dict[str, list[EvidenceRecord]] = {}
    for i, r in enumerate(records):
        if r.source not in EVIDENCE_SOURCES:
            raise ValueError(f"record {i} (evidence {r.evidence_id!r}): field 'source' is {r.source!r}, not one "
                             f"of {EVIDENCE_SOURCES}")
        if r.label not in (0, 1):
            raise ValueError(f"record {i} (evidence {r.evidence_id!r}): field 'label' must be 0 or 1, got {r.label!r}")
        if split is None or r.split == split:
            first = groups.setdefault(r.question_id, [r])[0]
            if first is not r and (first.question != r.question or first.split != r.split):
                raise ValueError(f"record {i}: question {r.question_id!r} has another text or split than "
                                 f"its first record")
            if first is not r:
                groups[r.question_id].append(r)
    return groups


def qrels_of(groups: dict[str, list[EvidenceRecord]]) -> Qrels:
    """Binary qrels of the questions with at least one positive (paper 002 Sec. 6 evaluates only those)."""
    return {q: {r.evidence_id: float(r.label) for r in rs} for q, rs in groups.items() if any(r.label for r in rs)}


@dataclass
class PQAText:
    """A text with (empty) aspect annotations: the item type `madr.training.loop.pretrain_step` reads."""

    text: str
    aspects: dict[str, list[str]] = field(default_factory=dict)


class _TextCatalog:
    """What `pretrain_step` asks of `sampler.catalog`: the text of a document item."""

    @staticmethod
    def product_text(item: PQAText) -> str:
        return item.text


class PQASampler:
    """Seeded training examples from evidence records of one split.

    `finetune_batch(size)`: distinct questions that have a positive and a negative; each with one random
    positive evidence and one random negative candidate of the same question (the hard negative); a
    question whose drawn positive text is already in the batch is skipped, so no in-batch negative is a
    copy of a positive. `pretrain_batch(size)`: random questions and random evidences (MLM warm-up).
    """

    def __init__(self, records: Sequence[EvidenceRecord], split: str = "train", seed: int = 0) -> None:
        self.rng = random.Random(seed)
        groups = group_questions(records, split)
        self.questions = [rs[0].question for rs in groups.values()]
        self.evidences = sorted({r.evidence for rs in groups.values() for r in rs})
        self.pos = {q: [r.evidence for r in rs if r.label == 1] for q, rs in groups.items()}
        self.neg = {q: [r.evidence for r in rs if r.label == 0] for q, rs in groups.items()}
        self.text = {q: rs[0].question for q, rs in groups.items()}
        self.train_ids = [q for q in groups if self.pos[q] and self.neg[q]]
        if not self.train_ids:
            raise ValueError(f"no {split} question has both a positive and a negative evidence")
        self.catalog = _TextCatalog()

    def finetune_batch(self, size: int) -> list[FinetuneExample]:
        out, seen = [], set()
        for q in self.rng.sample(self.train_ids, min(size, len(self.train_ids))):
            pos = self.rng.choice(self.pos[q])
            if pos in seen:
                continue
            seen.add(pos)
            out.append(FinetuneExample(self.text[q], {}, pos, {}, self.rng.choice(self.neg[q]), {}, 0.0))
        return out

    def pretrain_batch(self, size: int) -> tuple[list[PQAText], list[PQAText]]:
        qs = self.rng.sample(self.questions, min(size, len(self.questions)))
        ds = self.rng.sample(self.evidences, min(size, len(self.evidences)))
        return [PQAText(t) for t in qs], [PQAText(t) for t in ds]


# ---- model and training ---------------------------------------------------------------------------------------


def build_pqa_model(tokenizer: PreTrainedTokenizerBase, backbone: str | None = None,
                    tiny: dict[str, int] | None = None, sparse_top_k: int | None = 256,
                    max_query_length: int = 32, max_doc_length: int = 64, seed: int = 0,
                    shared_towers: bool = True, sparse_pooling: str = "max") -> BiEncoder:
    """A hybrid bi-encoder: a tiny BERT from scratch (`tiny` overrides its shape), or the pretrained
    `backbone` (a path or `pypi:<package>`). Paper 002 Fig. 2 draws two encoders of the same architecture;
    one shared tower (the default here) halves the parameters to learn from little data."""
    bb = BackboneConfig(name_or_path=backbone) if backbone else BackboneConfig(**({"tiny": tiny} if tiny else {}))
    cfg = ModelConfig(name="hybrid", backbone=bb, shared_towers=shared_towers, sparse_top_k=sparse_top_k,
                      sparse_pooling=sparse_pooling, max_query_length=max_query_length,
                      max_doc_length=max_doc_length, similarity="dot")
    return pqa_model(cfg, tokenizer, seed)


def pqa_model(cfg: ModelConfig, tokenizer: PreTrainedTokenizerBase, seed: int = 0) -> BiEncoder:
    """`build_model(cfg)` with the weights drawn under `torch.manual_seed(seed)`; `cfg.name` must be hybrid."""
    if not cfg.has_sparse:
        raise ValueError(f"product-QA models are hybrid (model.name=hybrid), got {cfg.name!r}")
    torch.manual_seed(seed)
    return build_model(cfg, tokenizer)


def representation_loss(q: TowerOutput, p: TowerOutput, n: TowerOutput | None, stage: StageConfig, step: int,
                        representation: str = "hybrid") -> LossParts:
    """The terms of paper 002 Eq. 5 that train one representation (`madr.losses.HybridLoss`).

    hybrid: L_dense + L_sparse + lambda_q FLOPS(q) + lambda_d FLOPS(p); dense: L_dense, Eq. 3 on the CLS dot
    products; sparse: L_sparse + the two FLOPS terms. The contrastive terms use in-batch plus hard negatives
    and temperature `stage.sparse_temperature`.
    """
    if representation not in REPRESENTATIONS:
        raise ValueError(f"representation must be one of {REPRESENTATIONS}, got {representation!r}")
    terms = ("dense", "sparse") if representation == "hybrid" else (representation,)
    return hybrid_loss(q, p, n, stage, step, terms)


def train_representation(model: BiEncoder, sampler: PQASampler, stage: StageConfig, representation: str = "hybrid",
                         seed: int = 0, on_step: Callable[[int, dict[str, float]], None] | None = None) -> list[dict]:
    """`stage.steps` steps of `madr.training.loop.Optimisation.for_stage` (AdamW, the stage's warm-up and
    decay, gradient clipping at 1.0) on `representation_loss`, one hard negative per question; returns the
    history."""
    torch.manual_seed(seed)
    params = [p for p in model.parameters() if p.requires_grad]

    def step_fn(step: int) -> LossParts:
        qb, pb, nb, _ = finetune_batches(model, sampler.finetune_batch(stage.batch_size))
        q = model.encode(qb.input_ids, qb.attention_mask, "query")
        p = model.encode(pb.input_ids, pb.attention_mask, "doc")
        n = model.encode(nb.input_ids, nb.attention_mask, "doc") if stage.hard_negatives > 0 else None
        return representation_loss(q, p, n, stage, step, representation)

    model.train()
    history = run_steps(Optimisation.for_stage(params, stage), stage.steps, step_fn, on_step)
    model.eval()
    return history


def train_pqa(model: BiEncoder, records: Sequence[EvidenceRecord], finetune: StageConfig,
              pretrain: StageConfig | None = None, seed: int = 0, progress: bool = False,
              representation: str = "hybrid") -> dict[str, list[dict]]:
    """Optional MLM warm-up (`madr.training.loop.train_stage`), then `representation`'s loss on the train split."""
    sampler = PQASampler(records, "train", seed)
    history = {}
    if pretrain is not None and pretrain.steps > 0:
        history["pretrain"] = train_stage(model, sampler, pretrain, "pretrain", seed=seed, progress=progress)
    history["finetune"] = train_representation(model, sampler, finetune, representation, seed)
    return history


# ---- scoring ----------------------------------------------------------------------------------------------------


@dataclass
class SplitScores:
    """Per question of one split: candidate ids, sources, labels and the dense / sparse / BM25 scores.

    `query_nnz` / `doc_nnz`: mean non-zero terms of the split's query / evidence sparse vectors."""

    question_ids: list[str]
    evidence_ids: list[list[str]]
    sources: list[list[str]]
    dense: list[np.ndarray]
    sparse: list[np.ndarray]
    bm25: list[np.ndarray]
    qrels: Qrels
    query_nnz: float = 0.0
    doc_nnz: float = 0.0

    def run(self, scores: list[np.ndarray]) -> Run:
        return {q: dict(zip(ids, map(float, s), strict=True))
                for q, ids, s in zip(self.question_ids, self.evidence_ids, scores, strict=True)}

    def hybrid(self, lam: float, normalisation: str = "none") -> list[np.ndarray]:
        """Paper 002 Eq. 1 per question, each part normalised over the question's candidates."""
        return [lam * normalise(d, normalisation) + (1 - lam) * normalise(s, normalisation)
                for d, s in zip(self.dense, self.sparse, strict=True)]

    def doc_source(self) -> dict[str, str]:
        return {e: s for ids, srcs in zip(self.evidence_ids, self.sources, strict=True)
                for e, s in zip(ids, srcs, strict=True)}

    def combine(self, dense_from: SplitScores, sparse_from: SplitScores) -> SplitScores:
        """These questions with the dense scores of `dense_from` and the sparse scores of `sparse_from`
        (two independently trained models scored on the same split)."""
        for other in (dense_from, sparse_from):
            if other.question_ids != self.question_ids or other.evidence_ids != self.evidence_ids:
                raise ValueError("combine: the scores come from different questions or candidates")
        return dataclasses.replace(self, dense=dense_from.dense, sparse=sparse_from.sparse,
                                   query_nnz=sparse_from.query_nnz, doc_nnz=sparse_from.doc_nnz)


def wordpieces(tokenizer: PreTrainedTokenizerBase, texts: Sequence[str]) -> list[list[str]]:
    """The tokenizer's wordpieces of each text (BM25 on wordpiece tokens, paper 004 Sec. VI-D)."""
    return [tokenizer.tokenize(t) for t in texts]


def score_split(model: BiEncoder, records: Sequence[EvidenceRecord], split: str, batch_size: int = 128,
                tokenizer: PreTrainedTokenizerBase | None = None) -> SplitScores:
    """Encode the split's questions and unique evidence texts once, then score every candidate exactly
    (`HybridSearcher.score`) and with BM25 fitted on the split's evidence pool."""
    groups = group_questions(records, split)
    if not groups:
        raise ValueError(f"no records in split {split!r}")
    tokenizer = tokenizer or model.tokenizer
    texts = sorted({r.evidence for rs in groups.values() for r in rs})
    row = {t: i for i, t in enumerate(texts)}
    questions = [rs[0].question for rs in groups.values()]
    width = max(len(rs) for rs in groups.values())
    ids = np.full((len(groups), width), -1, dtype=np.int64)
    for qi, rs in enumerate(groups.values()):
        ids[qi, : len(rs)] = [row[r.evidence] for r in rs]
    corpus = encode_corpus(model, texts, batch_size=batch_size)
    searcher = HybridSearcher.build(corpus, model)
    q_enc: EncodedTexts = encode_hybrid(model, questions, "query", batch_size)
    dense, sparse = searcher.score(q_enc, ids)
    bm25 = BM25Index().fit(wordpieces(tokenizer, texts))
    assert bm25.index is not None
    lexical = bm25.index.score(bm25.encode_queries(wordpieces(tokenizer, questions)), ids).astype(np.float64)
    sizes = [len(rs) for rs in groups.values()]
    return SplitScores(
        question_ids=list(groups), evidence_ids=[[r.evidence_id for r in rs] for rs in groups.values()],
        sources=[[r.source for r in rs] for rs in groups.values()],
        dense=[dense[i, :n] for i, n in enumerate(sizes)], sparse=[sparse[i, :n] for i, n in enumerate(sizes)],
        bm25=[lexical[i, :n] for i, n in enumerate(sizes)], qrels=qrels_of(groups),
        query_nnz=q_enc.sparse.nnz / max(len(q_enc), 1), doc_nnz=corpus.sparse.nnz / max(len(corpus), 1))


# ---- evaluation -------------------------------------------------------------------------------------------------


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
