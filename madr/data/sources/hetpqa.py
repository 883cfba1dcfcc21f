"""Real hetPQA evidence ranking (paper 002 Sec. 3 / Table 3) as `EvidenceRecord`s, split by question.

Reads `../shared/data/product_qa/hetpqa_evidence_ranking_dev.parquet` (qid, ASIN, qa_pair_id, question,
candidate, label "0"/"1", source in {OSP, bullet, Desc, attribute, CQA, review}, confidence) into the record
type `madr.recipes.pqa` trains and evaluates on. Only the public dev split of hetPQA was obtainable, so it is split
here BY QUESTION into train / dev (= validation) / test with a fixed seed; questions with the same text
(after lower-casing) always land in the same split. Split names are those `madr.recipes.pqa` expects.

Label corrections: paper 002 published `hybridpqa_evidence_ranking_test_set_correction.csv` (qid,
pos_to_neg_cids, neg_to_pos_cids; candidate ids joined by "|") for the hetPQA TEST split. `apply_corrections`
flips a label only where both the qid and the candidate id (`qa_pair_id`) match a record; on the dev file
none do (the test qids are another id range; 9 qid numbers coincide but none of their candidate ids), so it
reports the counts and changes nothing.

`read_epqa` reads ePQA (`epqa_dev.parquet`, label 2 = relevant, 1 = partly, 0 = not) as extra training
records: 2 -> positive, 0 -> negative, 1 dropped as ambiguous (so are rows with an empty candidate); every
record goes to the train split. `read_semipqa` reads semiPQA attribute ranking
(`semipqa_attribute_ranking_dev.parquet`: every candidate is one product attribute as JSON-like text,
label 0/1, no ASIN) the same way, source "attribute".
"""

from __future__ import annotations

import csv
import random
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

from madr.data.records import EVIDENCE_SOURCES, EvidenceRecord
from madr.data.sources.parquet_rows import read_rows

HETPQA_FILE = "hetpqa_evidence_ranking_dev.parquet"
CORRECTIONS_FILE = "hybridpqa_evidence_ranking_test_set_correction.csv"
EPQA_FILE = "epqa_dev.parquet"
SEMIPQA_FILE = "semipqa_attribute_ranking_dev.parquet"
SOURCE_MAP = {"osp": "osp", "bullet": "bullet", "desc": "description", "description": "description",
              "attribute": "attribute", "cqa": "cqa", "review": "review"}
HETPQA_COLUMNS = ("qid", "ASIN", "qa_pair_id", "question", "candidate", "label", "source")
EPQA_COLUMNS = ("qid", "question", "ASIN", "candidate", "source", "qa_pair_id", "label")
SEMIPQA_COLUMNS = ("qid", "qa_pair_id", "question", "candidate", "label")
SPLITS = ("train", "dev", "test")


@dataclass
class HetPQAConfig:
    """Where the real product-QA files are and how they are split (configs/real/hetpqa.yaml, `hetpqa:`).

    `fractions`: train / dev (validation) / test shares of the questions; `split_seed` fixes the shuffle.
    `epqa_extra` / `semipqa_extra`: add ePQA / semiPQA questions to the train split (optional extra
    training data; questions whose text is a dev or test question are left out)."""

    data_dir: str = "../shared/data/product_qa"
    fractions: list[float] = field(default_factory=lambda: [0.6, 0.2, 0.2])
    split_seed: int = 0
    apply_corrections: bool = True
    epqa_extra: bool = False
    semipqa_extra: bool = False

    def __post_init__(self) -> None:
        if len(self.fractions) != 3 or any(f <= 0 for f in self.fractions) or abs(sum(self.fractions) - 1) > 1e-6:
            raise ValueError(f"hetpqa.fractions must be three positive shares summing to 1, got {self.fractions}")


@dataclass
class CorrectionReport:
    """What `apply_corrections` matched: CSV rows, candidate ids listed, qids and (qid, id) pairs found."""

    rows: int = 0
    candidate_ids: int = 0
    qids_matched: int = 0
    flipped: int = 0


def _text(path: Path, i: int, row: dict[str, object], name: str) -> str:
    value = row[name]
    if value is None or not str(value).strip():
        raise ValueError(f"{path}: row {i}: field {name!r} is empty")
    return str(value)


def _source(path: Path, i: int, value: object) -> str:
    key = str(value).strip().lower()
    if key not in SOURCE_MAP:
        raise ValueError(f"{path}: row {i}: field 'source' is {value!r}, not one of {sorted(SOURCE_MAP)}")
    return SOURCE_MAP[key]


def _label(path: Path, i: int, value: object, allowed: Sequence[int]) -> int:
    try:
        label = int(str(value).strip())
    except ValueError:
        label = -1
    if label not in allowed:
        raise ValueError(f"{path}: row {i}: field 'label' is {value!r}, expected one of {list(allowed)}")
    return label


def read_hetpqa(path: str | Path) -> list[EvidenceRecord]:
    """Every row of the hetPQA evidence-ranking parquet as an `EvidenceRecord` (split "train" until
    `split_by_question`); the raw source and confidence go to `extra`. Bad rows raise naming row and field."""
    path = Path(path)
    out, seen = [], set()
    for i, row in enumerate(read_rows(path, HETPQA_COLUMNS)):
        qid, eid = _text(path, i, row, "qid"), _text(path, i, row, "qa_pair_id")
        if (qid, eid) in seen:
            raise ValueError(f"{path}: row {i}: field 'qa_pair_id' {eid!r} repeats within question {qid!r}")
        seen.add((qid, eid))
        out.append(EvidenceRecord(
            question_id=qid, question=_text(path, i, row, "question"), evidence_id=eid,
            evidence=_text(path, i, row, "candidate"), source=_source(path, i, row["source"]),
            label=_label(path, i, row["label"], (0, 1)), product_id=str(row["ASIN"] or ""),
            extra={"raw_source": str(row["source"]), "confidence": str(row.get("confidence") or "")}))
    return out


def split_by_question(records: Sequence[EvidenceRecord], fractions: Sequence[float] = (0.6, 0.2, 0.2),
                      seed: int = 0) -> list[EvidenceRecord]:
    """Copies of `records` with `split` in train / dev / test, assigned per question (questions sharing a
    lower-cased text share a split), shuffled with `seed` and cut at the cumulative `fractions`."""
    keys = sorted({r.question.strip().lower() for r in records})
    random.Random(seed).shuffle(keys)
    n_train = round(fractions[0] * len(keys))
    n_dev = round(fractions[1] * len(keys))
    split_of = {k: ("train" if i < n_train else "dev" if i < n_train + n_dev else "test") for i, k in enumerate(keys)}
    return [replace(r, split=split_of[r.question.strip().lower()]) for r in records]


def _cids(value: str | None) -> list[str]:
    return [c.strip() for c in (value or "").split("|") if c.strip()]


def apply_corrections(records: Sequence[EvidenceRecord], path: str | Path) -> tuple[list[EvidenceRecord],
                                                                                    CorrectionReport]:
    """Paper 002's published label corrections: flip to 0 the (qid, cid) pairs of `pos_to_neg_cids` and to
    1 those of `neg_to_pos_cids` where both ids match a record; returns the records and what matched."""
    path = Path(path)
    report, flips = CorrectionReport(), {}
    with path.open(newline="") as f:
        for i, row in enumerate(csv.DictReader(f)):
            for name in ("qid", "pos_to_neg_cids", "neg_to_pos_cids"):
                if name not in row:
                    raise ValueError(f"{path}: row {i}: missing field {name!r}")
            report.rows += 1
            for col, label in (("pos_to_neg_cids", 0), ("neg_to_pos_cids", 1)):
                for cid in _cids(row[col]):
                    report.candidate_ids += 1
                    flips[(row["qid"].strip(), cid)] = label
    qids = {q for q, _ in flips}
    report.qids_matched = len(qids & {r.question_id for r in records})
    out = []
    for r in records:
        label = flips.get((r.question_id, r.evidence_id))
        if label is not None:
            report.flipped += int(label != r.label)
            r = replace(r, label=label)
        out.append(r)
    return out, report


def read_epqa(path: str | Path) -> list[EvidenceRecord]:
    """ePQA rows as train records (label 2 -> 1, 0 -> 0, 1 and empty candidates dropped); ids prefixed "epqa:" so they never
    collide with hetPQA ids."""
    path = Path(path)
    out = []
    for i, row in enumerate(read_rows(path, EPQA_COLUMNS)):
        label = _label(path, i, row["label"], (0, 1, 2))
        if label == 1 or not str(row["candidate"] or "").strip():
            continue
        out.append(EvidenceRecord(
            question_id="epqa:" + _text(path, i, row, "qid"), question=_text(path, i, row, "question"),
            evidence_id="epqa:" + _text(path, i, row, "qa_pair_id"), evidence=_text(path, i, row, "candidate"),
            source=_source(path, i, row["source"]), label=int(label == 2), product_id=str(row["ASIN"] or ""),
            split="train", extra={"raw_source": str(row["source"])}))
    return out


def read_semipqa(path: str | Path) -> list[EvidenceRecord]:
    """semiPQA rows as train records (source "attribute", label 0/1); ids prefixed "semipqa:"."""
    path = Path(path)
    return [EvidenceRecord(
        question_id="semipqa:" + _text(path, i, row, "qid"), question=_text(path, i, row, "question"),
        evidence_id="semipqa:" + _text(path, i, row, "qa_pair_id"), evidence=_text(path, i, row, "candidate"),
        source="attribute", label=_label(path, i, row["label"], (0, 1)), split="train")
        for i, row in enumerate(read_rows(path, SEMIPQA_COLUMNS))]


def _extra_training(cfg: HetPQAConfig, root: Path, held: set[str]) -> tuple[list[EvidenceRecord], dict[str, int]]:
    """The ePQA / semiPQA train records `cfg` asks for, minus questions whose text is in `held`, and counts."""
    out: list[EvidenceRecord] = []
    counts: dict[str, int] = {}
    for name, wanted, reader, file in (("epqa", cfg.epqa_extra, read_epqa, EPQA_FILE),
                                       ("semipqa", cfg.semipqa_extra, read_semipqa, SEMIPQA_FILE)):
        if not wanted:
            continue
        extra = [r for r in reader(root / file) if r.question.strip().lower() not in held]
        counts[f"{name}_train_rows"] = len(extra)
        counts[f"{name}_train_questions"] = len({r.question_id for r in extra})
        out += extra
    return out, counts


def load_hetpqa(cfg: HetPQAConfig | None = None) -> tuple[list[EvidenceRecord], dict[str, object]]:
    """hetPQA records split by question (+ corrections, + ePQA / semiPQA train records when asked) and a
    summary (files, rows, questions per split, correction counts). Extra questions that share a text with a
    hetPQA dev/test question are dropped, so no test question is trained on."""
    cfg = cfg or HetPQAConfig()
    root = Path(cfg.data_dir)
    records = split_by_question(read_hetpqa(root / HETPQA_FILE), cfg.fractions, cfg.split_seed)
    summary: dict[str, object] = {"file": str(root / HETPQA_FILE), "rows": len(records)}
    if cfg.apply_corrections:
        records, report = apply_corrections(records, root / CORRECTIONS_FILE)
        summary["corrections"] = vars(report)
    for s in SPLITS:
        qs = {r.question_id for r in records if r.split == s}
        summary[f"{s}_questions"] = len(qs)
        summary[f"{s}_questions_with_positive"] = len({r.question_id for r in records if r.split == s and r.label})
    extra, counts = _extra_training(cfg, root, {r.question.strip().lower() for r in records if r.split != "train"})
    summary.update(counts)
    records = records + extra
    assert all(r.source in EVIDENCE_SOURCES for r in records)
    return records, summary
