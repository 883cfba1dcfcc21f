"""Evidence records of product-QA as training and evaluation inputs: candidates grouped by question, their
qrels, and the seeded sampler of training examples (question, positive, hard negative)."""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass, field

from madr.data.records import EVIDENCE_SOURCES, EvidenceRecord
from madr.metrics import Qrels
from madr.training.loop import FinetuneExample


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
