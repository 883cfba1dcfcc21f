"""madr.data.beir / madr.data.trec qrels in: a catalog written in the BEIR layout reads back as the same
catalog (local path, file:// URI, a SubTreeFileSystem); malformed lines and judgments naming unknown ids are
counted, named (file, line, field) and written to the quarantine, never dropped silently."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow.fs as pafs
import pytest

from madr.data.beir import esci_of_grade, read_beir
from madr.data.quarantine import NoGoodRowsError, read_quarantine, read_summary
from tests.beir_layout import write_beir


def _judgments(catalog) -> set[tuple[str, str, int]]:
    return {(j.query_id, j.product_id, j.relevance) for j in catalog.judgments}


@pytest.fixture(scope="module")
def beir_dir(catalog, tmp_path_factory) -> Path:
    return write_beir(catalog, tmp_path_factory.mktemp("beir") / "synthetic")


@pytest.mark.parametrize("how", ["path", "file_uri", "subtree"])
def test_catalog_round_trips_through_the_beir_layout(catalog, beir_dir, how) -> None:
    if how == "path":
        read = read_beir(str(beir_dir), aspect_names=catalog.aspect_names)
    elif how == "file_uri":
        read = read_beir(beir_dir.as_uri(), aspect_names=catalog.aspect_names)
    else:
        fs = pafs.SubTreeFileSystem(str(beir_dir.parent), pafs.LocalFileSystem())
        read = read_beir(beir_dir.name, filesystem=fs, aspect_names=catalog.aspect_names)
    got = read.catalog
    judged = {j.query_id for j in catalog.judgments}
    assert got.products == catalog.products, "products (ids, titles, descriptions, aspects) must round-trip"
    assert got.queries == [q for q in catalog.queries if q.query_id in judged], "queries keep split and aspects"
    assert _judgments(got) == _judgments(catalog)
    assert all(j.esci == esci_of_grade(j.relevance) for j in got.judgments)
    summary = read.summary
    assert summary.num_quarantined == 0 and summary.balanced, summary.format()
    assert summary.skipped.get("unjudged", 0) == len(catalog.queries) - len(judged)


def test_esci_stand_in_of_a_grade() -> None:
    assert [esci_of_grade(g) for g in range(5)] == ["I", "C", "S", "E", "E"]


def _write(directory: Path, corpus: list[str], queries: list[str], qrels: dict[str, list[str]]) -> Path:
    (directory / "qrels").mkdir(parents=True)
    (directory / "corpus.jsonl").write_text("\n".join(corpus) + "\n")
    (directory / "queries.jsonl").write_text("\n".join(queries) + "\n")
    for split, lines in qrels.items():
        (directory / "qrels" / f"{split}.tsv").write_text("\n".join(["query-id\tcorpus-id\tscore", *lines]) + "\n")
    return directory


def test_bad_lines_and_unknown_ids_are_quarantined_with_file_line_and_field(tmp_path) -> None:
    corpus = ['{"_id": "d1", "title": "red shoe", "text": "a running shoe"}',
              '{"_id": "d2", "title": "", "text": "blue hat"}',  # no title: its text becomes the title
              "{not json",                                      # line 3
              '{"title": "no id", "text": "x"}',                # line 4
              '{"_id": "d1", "title": "again", "text": ""}',    # line 5: duplicate id
              '{"_id": "d3", "title": " ", "text": ""}']        # line 6: nothing to encode
    queries = ['{"_id": "q1", "text": "shoe"}', '{"_id": "q2", "text": "hat"}', '{"_id": "q3", "text": "sock"}',
               '{"_id": "q4"}']                                 # line 4: no text
    qrels = {"train": ["q2\td2\t1"],
             "test": ["q1\td1\t2",
                      "q1\td9\t1",     # line 3: unknown document
                      "q7\td1\t1",     # line 4: unknown query
                      "q1\td1\t1",     # line 5: pair judged twice
                      "q1\td2\tx",     # line 6: grade not an integer
                      "q1\td2\t7",     # line 7: grade out of range
                      "q2\td1\t1",     # line 8: q2 is a train query
                      "q1\td2"]}       # line 9: two columns
    root = _write(tmp_path / "bad", corpus, queries, qrels)
    read = read_beir(root.as_uri())
    catalog = read.catalog
    assert [(p.product_id, p.title, p.description) for p in catalog.products] == [
        ("d1", "red shoe", "a running shoe"), ("d2", "blue hat", "")]
    assert [(q.query_id, q.split) for q in catalog.queries] == [("q1", "test"), ("q2", "train")]
    assert _judgments(catalog) == {("q1", "d1", 2), ("q2", "d2", 1)}

    qdir = tmp_path / "quarantine"
    summary = read.write_quarantine(str(qdir))
    assert summary.balanced and summary.rows == 6 + 4 + 1 + 8, summary.format()
    assert summary.skipped == {"unjudged": 1}, "q3 has no judgment: counted, not lost"
    bad = read_quarantine(str(qdir)).to_pylist()
    got = {(Path(r["file"]).name, r["row"], r["reason"], r["field"]) for r in bad}
    assert got == {
        ("corpus.jsonl", 3, "bad_json", ""), ("corpus.jsonl", 4, "missing_field", "_id"),
        ("corpus.jsonl", 5, "duplicate_id", "_id"), ("corpus.jsonl", 6, "empty_text", "text"),
        ("queries.jsonl", 4, "missing_field", "text"),
        ("test.tsv", 3, "unknown_id", "corpus-id"), ("test.tsv", 4, "unknown_id", "query-id"),
        ("test.tsv", 5, "duplicate_id", "corpus-id"), ("test.tsv", 6, "wrong_type", "score"),
        ("test.tsv", 7, "bad_value", "score"), ("test.tsv", 8, "bad_value", "query-id"),
        ("test.tsv", 9, "bad_columns", ""),
    }, bad
    assert all(r["file"].startswith("file://") for r in bad), "rows name the file as it was given"
    assert next(r for r in bad if r["row"] == 4 and r["reason"] == "unknown_id")["raw"] == "q7\td1\t1"
    assert json.loads((qdir / "summary.json").read_text())["quarantined"]["unknown_id"] == 2
    assert read_summary(str(qdir), "beir").to_dict() == summary.to_dict()


def test_trec_qrels_stand_in_for_a_split(tmp_path) -> None:
    root = _write(tmp_path / "b", ['{"_id": "d1", "text": "a"}', '{"_id": "d2", "text": "b"}'],
                  ['{"_id": "q1", "text": "x"}', '{"_id": "q2", "text": "y"}'], {"test": ["q1\td1\t1"]})
    trec = tmp_path / "test.qrels"
    trec.write_text("q1 0 d2 1\nq2\t0\td1  2\nq2 0 d7 1\nq1 0 d1\n")
    read = read_beir(str(root), qrels={"test": trec.as_uri()})
    assert _judgments(read.catalog) == {("q1", "d2", 1), ("q2", "d1", 2)}, "TREC lines replace qrels/test.tsv"
    bad = [b for f in read.files for b in f.bad]
    assert [(b["row"], b["reason"], b["field"]) for b in bad] == [(3, "unknown_id", "docid"), (4, "bad_columns", "")]
    with pytest.raises(ValueError, match="unknown split"):
        read_beir(str(root), qrels={"validation": str(trec)})


def test_wrong_layout_fails_naming_the_file(tmp_path) -> None:
    root = _write(tmp_path / "c", ['{"id": "d1", "contents": "a"}'], ['{"_id": "q1", "text": "x"}'], {})
    with pytest.raises(ValueError, match=r"qrels: no qrels file of split"):
        read_beir(str(root))
    (root / "qrels" / "test.tsv").write_text("query-id\tcorpus-id\tscore\nq1\td1\t1\n")
    read = read_beir(str(root))  # every corpus line lacks _id, so the judgment names an unknown document
    assert read.catalog.products == [] and read.summary.quarantined == {"missing_field": 1, "unknown_id": 1}
    with pytest.raises(NoGoodRowsError, match=r"corpus\.jsonl: all 1 rows quarantined"):
        read.write_quarantine(str(tmp_path / "q"))
    with pytest.raises(ValueError, match="BEIR directory not found"):
        read_beir(str(tmp_path / "missing"))
