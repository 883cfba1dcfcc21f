"""Record types of the multi-task sources (paper 004 Sec. III-A) and of product-QA evidence (paper 002), and
`MultilingualData`, the multi-task sources' train / held-out sets together.

Readers (pipelines/, Ray Data) and generators (madr.data.synthetic_*) both produce these; the task
definitions in `madr.recipes.multitask.tasks` consume them.
"""

from __future__ import annotations

from dataclasses import dataclass, field

NLI_LABELS = ("entailment", "neutral", "contradiction")
EVIDENCE_SOURCES = ("attribute", "bullet", "cqa", "description", "osp", "review")


@dataclass
class ClickRecord:
    """One (query, document) impression from a click log.

    `fields` holds the document's text fields (title, description, url, ...). `position` is the
    1-based rank the old ranker showed it at: clicks are biased toward small positions, which is the
    bias paper 004 trains away from.

    From a raw click log (`madr.recipes.multitask.click_log`): `weight` is the clicked pair's debiasing
    weight in the triplet loss (clipped inverse propensity, 1 without debiasing) and `negatives` the
    documents (id -> text) its query's users skipped above a click, extra negatives of that query.
    """

    query: str
    fields: dict[str, str]
    clicked: bool
    position: int | None = None
    impressions: int = 1
    clicks: int = 0
    language: str = "en"
    query_id: str = ""
    doc_id: str = ""
    relevance: int | None = None  # ground truth where known (synthetic data), never used for training
    weight: float = 1.0
    negatives: dict[str, str] = field(default_factory=dict)


@dataclass
class NLIRecord:
    """SNLI / MNLI / QNLI / XNLI pair; label in NLI_LABELS (QNLI's not_entailment maps to neutral)."""

    premise: str
    hypothesis: str
    label: str
    language: str = "en"


@dataclass
class ParallelRecord:
    """A translation pair (WikiMatrix / Tatoeba style); `target` is the English side when there is one."""

    source: str
    target: str
    source_lang: str
    target_lang: str = "en"
    score: float | None = None


@dataclass
class EvidenceRecord:
    """Product-QA evidence ranking (hetPQA layout, paper 002): a question and one candidate evidence."""

    question_id: str
    question: str
    evidence_id: str
    evidence: str
    source: str  # one of EVIDENCE_SOURCES
    label: int  # 1 = the evidence answers the question
    product_id: str = ""
    split: str = "train"
    extra: dict[str, str] = field(default_factory=dict)


@dataclass
class MultilingualData:
    """Training records per task and the held-out evaluation sets of the multi-task encoder (paper 004 Sec. III-A):
    click log, NLI and translation pairs; synthetic (`madr.recipes.multitask.data.build_data`) or real
    (`madr.data.sources.real_multilingual.load_real_multilingual`)."""

    clicks_train: list[ClickRecord]
    clicks_eval: list[ClickRecord]
    nli_train: list[NLIRecord]
    nli_eval: list[NLIRecord]
    parallel_train: list[ParallelRecord]
    parallel_eval: list[ParallelRecord]

    def sizes(self) -> dict[str, int]:
        return {
            "click_impressions_train": len(self.clicks_train),
            "clicked_pairs_train": sum(r.clicked for r in self.clicks_train),
            "click_queries_eval": len({r.query_id for r in self.clicks_eval}),
            "click_candidates_eval": len(self.clicks_eval),
            "nli_train": len(self.nli_train),
            "nli_train_usable": sum(r.label != "contradiction" for r in self.nli_train),
            "nli_eval": len(self.nli_eval),
            "parallel_train_kept": len(self.parallel_train),
            "parallel_eval": len(self.parallel_eval),
        }
