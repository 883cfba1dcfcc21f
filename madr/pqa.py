"""Product-QA evidence ranking with the hybrid model (paper 002): training sampler, scoring, evaluation.

Training (paper 002 Sec. 4.3, Eq. 3-5): questions are the queries; each example pairs a question with one
of its positive evidences and one hard negative drawn from the same question's negative candidates,
besides the in-batch negatives. `PQASampler` has the `finetune_batch` / `pretrain_batch` interface of
`madr.training.CatalogSampler`, so `train_stage(model, sampler, stage, "finetune")` runs the hybrid
objective unchanged (an optional short MLM stage first grounds the MLM head of a backbone trained from
scratch, whose term weights would otherwise not point at the input tokens).

Evaluation is the paper's setting: each question's candidate evidences are re-ranked (Sec. 5: "we sorted
all the candidate information based on Equation 1") and scored with MAP, R-Prec, MRR@5, NDCG, Hit@5 and
P@1 (Sec. 6) for: BM25 on the tokenizer's wordpieces (row a of Table 3), the dense part alone
(lambda = 1), the sparse part alone (lambda = 0), the hybrid with lambda (and the score normalisation)
tuned on dev MRR@5, and the hybrid with the source-aware prior (Sec. 6.2: min-max normalised Eq. 1 score
times the source's hit-rate@5 measured on dev). Nothing is tuned on test.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import torch
from transformers import PreTrainedTokenizerBase

from madr.config import BackboneConfig, ModelConfig, StageConfig
from madr.data.records import EVIDENCE_SOURCES, EvidenceRecord
from madr.hybrid_search import normalise, source_prior_rerank, source_priors_from_validation
from madr.hybrid_searcher import EncodedTexts, HybridSearcher, encode_corpus, encode_hybrid
from madr.metrics import Qrels, Run, evaluate
from madr.model import BiEncoder, build_model
from madr.sparse import BM25Index
from madr.training import FinetuneExample, train_stage

PQA_METRICS = ("map", "r_precision", "mrr@5", "ndcg", "hit@5", "precision@1")
TUNE_METRIC = "mrr@5"
LAMBDA_GRID = tuple(round(0.05 * i, 2) for i in range(21))
NORMALISATIONS = ("none", "minmax")


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
    """A text with (empty) aspect annotations: the item type `madr.training.pretrain_step` reads."""

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
                    shared_towers: bool = True) -> BiEncoder:
    """A hybrid bi-encoder: a tiny BERT from scratch (`tiny` overrides its shape), or the pretrained
    `backbone` (a path or `pypi:<package>`). Paper 002 Fig. 2 draws two encoders of the same architecture;
    one shared tower (the default here) halves the parameters to learn from little data."""
    torch.manual_seed(seed)
    bb = BackboneConfig(name_or_path=backbone) if backbone else BackboneConfig(**({"tiny": tiny} if tiny else {}))
    cfg = ModelConfig(name="hybrid", backbone=bb, shared_towers=shared_towers, sparse_top_k=sparse_top_k,
                      max_query_length=max_query_length, max_doc_length=max_doc_length, similarity="dot")
    return build_model(cfg, tokenizer)


def train_pqa(model: BiEncoder, records: Sequence[EvidenceRecord], finetune: StageConfig,
              pretrain: StageConfig | None = None, seed: int = 0, progress: bool = False) -> dict[str, list[dict]]:
    """Optional MLM warm-up, then the hybrid objective (Eq. 5) on the train split; returns the histories."""
    sampler = PQASampler(records, "train", seed)
    history = {}
    if pretrain is not None and pretrain.steps > 0:
        history["pretrain"] = train_stage(model, sampler, pretrain, "pretrain", seed=seed, progress=progress)
    history["finetune"] = train_stage(model, sampler, finetune, "finetune", seed=seed, progress=progress)
    return history


# ---- scoring ----------------------------------------------------------------------------------------------------


@dataclass
class SplitScores:
    """Per question of one split: candidate ids, sources, labels and the dense / sparse / BM25 scores."""

    question_ids: list[str]
    evidence_ids: list[list[str]]
    sources: list[list[str]]
    dense: list[np.ndarray]
    sparse: list[np.ndarray]
    bm25: list[np.ndarray]
    qrels: Qrels

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
    searcher = HybridSearcher.build(encode_corpus(model, texts, batch_size=batch_size), model)
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
        bm25=[lexical[i, :n] for i, n in enumerate(sizes)], qrels=qrels_of(groups))


# ---- evaluation -------------------------------------------------------------------------------------------------


def metrics_of(scores: SplitScores, run: Run) -> dict[str, float]:
    return evaluate(run, scores.qrels, list(PQA_METRICS))


def tune_lambda(dev: SplitScores, normalisations: Sequence[str] = NORMALISATIONS,
                grid: Sequence[float] = LAMBDA_GRID) -> tuple[float, str, float]:
    """(lambda, normalisation, dev MRR@5) maximising dev MRR@5; ties keep the first in grid order."""
    best = (grid[0], normalisations[0], -1.0)
    for norm in normalisations:
        for lam in grid:
            value = evaluate(dev.run(dev.hybrid(lam, norm)), dev.qrels, TUNE_METRIC)[TUNE_METRIC]
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


@dataclass
class PQAReport:
    """Test metrics per method (Table 3 rows) and what was chosen on dev."""

    rows: dict[str, dict[str, float]]
    lam: float
    normalisation: str
    lam_minmax: float
    dev_mrr5: float
    priors: dict[str, float]
    dev_rows: dict[str, dict[str, float]] = field(default_factory=dict)


def evaluate_pqa(model: BiEncoder, records: Sequence[EvidenceRecord], batch_size: int = 128,
                 grid: Sequence[float] = LAMBDA_GRID) -> PQAReport:
    """BM25, dense only, sparse only, hybrid (lambda tuned on dev) and hybrid + source prior on test."""
    dev, test = score_split(model, records, "dev", batch_size), score_split(model, records, "test", batch_size)
    lam, norm, dev_mrr = tune_lambda(dev, grid=grid)
    lam_mm, _, _ = tune_lambda(dev, ("minmax",), grid)
    priors = source_priors_from_validation(dev.run(dev.hybrid(lam_mm, "minmax")), dev.qrels, dev.doc_source(), k=5)

    def rows(s: SplitScores) -> dict[str, dict[str, float]]:
        return {
            "BM25 (wordpieces)": metrics_of(s, s.run(s.bm25)),
            "Dense only (lambda=1)": metrics_of(s, s.run(s.dense)),
            "Sparse only (lambda=0)": metrics_of(s, s.run(s.sparse)),
            f"Hybrid (lambda={lam:g}, {norm}; dev-tuned)": metrics_of(s, s.run(s.hybrid(lam, norm))),
            f"Hybrid + source prior (lambda={lam_mm:g}, minmax)": metrics_of(s, s.run(source_aware_scores(s, lam_mm,
                                                                                                          priors))),
        }

    return PQAReport(rows(test), lam, norm, lam_mm, dev_mrr, priors, dev_rows=rows(dev))
