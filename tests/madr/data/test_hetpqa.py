"""Real hetPQA loader (madr.data.sources.hetpqa): rows, labels, sources, the by-question split, corrections, errors."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from madr.data.sources.hetpqa import (
    CORRECTIONS_FILE,
    HETPQA_FILE,
    SEMIPQA_FILE,
    HetPQAConfig,
    apply_corrections,
    load_hetpqa,
    read_hetpqa,
    read_semipqa,
    split_by_question,
)


@pytest.fixture(scope="module")
def hetpqa(shared_data: Path):
    return load_hetpqa(HetPQAConfig(data_dir=str(shared_data / "product_qa")))


def test_rows_labels_and_sources_are_read(hetpqa) -> None:
    records, summary = hetpqa
    assert len(records) == 2731 == summary["rows"]
    assert len({r.question_id for r in records}) == 509
    assert Counter(r.label for r in records) == {0: 2083, 1: 648}
    raw = Counter(r.extra["raw_source"] for r in records)
    assert raw == {"OSP": 524, "bullet": 516, "Desc": 496, "attribute": 490, "CQA": 490, "review": 215}
    assert Counter(r.source for r in records)["description"] == 496
    first = records[0]
    assert (first.question_id, first.evidence_id, first.question, first.product_id) == (
        "28492", "80005", "it works with ipad air?", "B0072BKZOQ")
    assert first.label == 0 and first.source == "attribute"


def test_split_is_by_question_and_sized(hetpqa) -> None:
    records, summary = hetpqa
    split_of: dict[str, set[str]] = {}
    for r in records:
        split_of.setdefault(r.question_id, set()).add(r.split)
        split_of.setdefault("text:" + r.question.strip().lower(), set()).add(r.split)
    assert all(len(s) == 1 for s in split_of.values())
    groups = {s: {r.question_id for r in records if r.split == s} for s in ("train", "dev", "test")}
    assert sum(map(len, groups.values())) == 509
    assert 290 <= len(groups["train"]) <= 320 and 90 <= len(groups["dev"]) <= 112
    assert summary["test_questions"] == len(groups["test"])
    again = split_by_question(read_hetpqa(Path(summary["file"])), seed=0)
    assert [r.split for r in again] == [r.split for r in records]
    other = split_by_question(records, seed=1)
    assert [r.split for r in other] != [r.split for r in records]


def test_corrections_match_nothing_on_dev_but_flip_matching_pairs(hetpqa, shared_data: Path) -> None:
    records, summary = hetpqa
    assert summary["corrections"]["rows"] == 893 and summary["corrections"]["flipped"] == 0
    path = shared_data / "product_qa" / CORRECTIONS_FILE
    first = next(line for i, line in enumerate(path.read_text().splitlines()) if i == 1)
    qid, pos_to_neg = first.split(",")[:2]
    cid = pos_to_neg.split("|")[0]
    fake = [records[0].__class__(qid, "q", cid, "e", "bullet", 1, split="test")]
    fixed, report = apply_corrections(fake, path)
    assert fixed[0].label == 0 and report.flipped == 1 and report.qids_matched == 1


def test_bad_label_names_file_row_and_field(tmp_path: Path) -> None:
    rows = {"qid": ["1", "1"], "ASIN": ["A", "A"], "qa_pair_id": ["7", "8"], "question": ["q", "q"],
            "candidate": ["c", "d"], "label": ["1", "yes"], "source": ["CQA", "Desc"]}
    path = tmp_path / HETPQA_FILE
    pq.write_table(pa.table(rows), path)
    with pytest.raises(ValueError, match=r"row 1: field 'label' is 'yes'"):
        read_hetpqa(path)
    rows["label"] = ["1", "0"]
    rows["source"] = ["CQA", "forum"]
    pq.write_table(pa.table(rows), path)
    with pytest.raises(ValueError, match=r"hetpqa_evidence_ranking_dev.parquet: row 1: field 'source'"):
        read_hetpqa(path)


def test_epqa_and_semipqa_join_train_only_and_never_a_held_out_question(shared_data: Path) -> None:
    records, summary = load_hetpqa(HetPQAConfig(data_dir=str(shared_data / "product_qa"), epqa_extra=True,
                                                semipqa_extra=True))
    het = [r for r in records if ":" not in r.question_id]
    assert len(het) == 2731
    held = {r.question.strip().lower() for r in het if r.split != "train"}
    for name in ("epqa", "semipqa"):
        extra = [r for r in records if r.question_id.startswith(name + ":")]
        assert len(extra) == summary[f"{name}_train_rows"] > 0
        assert len({r.question_id for r in extra}) == summary[f"{name}_train_questions"]
        assert all(r.split == "train" and r.question.strip().lower() not in held for r in extra)
        assert {r.label for r in extra} == {0, 1}
    semi = [r for r in records if r.question_id.startswith("semipqa:")]
    assert {r.source for r in semi} == {"attribute"}
    assert len(semi) == 13242 and sum(r.label for r in semi) == 867  # no semiPQA text is a held-out question


def test_an_extra_question_with_a_held_out_text_is_left_out(hetpqa, shared_data: Path, tmp_path: Path) -> None:
    records, _ = hetpqa
    test_question = next(r.question for r in records if r.split == "test")
    for name in (HETPQA_FILE, CORRECTIONS_FILE):
        (tmp_path / name).symlink_to(shared_data / "product_qa" / name)
    pq.write_table(pa.table({"qid": ["1", "2"], "qa_pair_id": ["7", "8"], "question": [test_question.upper(), "new?"],
                             "candidate": ['brand: { value:"x" }'] * 2, "label": ["1", "1"]}), tmp_path / SEMIPQA_FILE)
    with_extra, summary = load_hetpqa(HetPQAConfig(data_dir=str(tmp_path), semipqa_extra=True))
    assert [r.question for r in with_extra[len(records):]] == ["new?"] and summary["semipqa_train_questions"] == 1


def test_bad_semipqa_label_names_file_row_and_field(tmp_path: Path) -> None:
    path = tmp_path / SEMIPQA_FILE
    pq.write_table(pa.table({"qid": ["1", "1"], "qa_pair_id": ["7", "8"], "question": ["q", "q"],
                             "candidate": ['brand: { value:"x" }', ""], "label": ["1", "0"]}), path)
    with pytest.raises(ValueError, match=r"semipqa_attribute_ranking_dev.parquet: row 1: field 'candidate' is empty"):
        read_semipqa(path)
