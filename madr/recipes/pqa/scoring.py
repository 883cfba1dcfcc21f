"""Scoring one split of product-QA: every candidate of every question with the model's dense and sparse
scores (paper 002 Eq. 1's two parts) and with BM25 on the tokenizer's wordpieces."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from transformers import PreTrainedTokenizerBase

from madr.data.records import EvidenceRecord
from madr.metrics import Qrels, Run
from madr.modeling.model import BiEncoder
from madr.recipes.pqa.data import group_questions, qrels_of
from madr.search.hybrid import EncodedTexts, HybridSearcher, encode_corpus, encode_hybrid
from madr.search.score_fusion import normalise
from madr.search.sparse import BM25Index


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
