"""Readers of every source on small files in their public layouts: good rows arrive normalised, every bad
row is quarantined with its reason and origin, counts add up to the input, strict mode names the row."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from madr.data.quarantine import read_quarantine, read_summary
from madr.data.records import ClickRecord, EvidenceRecord, NLIRecord, ParallelRecord
from madr.data.validation import BadRow, Fields, StrictModeError
from pipelines.data.file_parts import plan_parts
from pipelines.data.readers import NoGoodRowsError, ingest, read_source
from pipelines.data.sources import SourceOptions, to_record


def write_lines(path: Path, lines: list[str | bytes]) -> Path:
    path.write_bytes(b"".join((x if isinstance(x, bytes) else x.encode("utf-8")) + b"\n" for x in lines))
    return path


def js(**row) -> str:
    return json.dumps(row)


def run(source: str, paths, tmp_path: Path, **kwargs):
    """Read `paths` fully; return (good rows, summary, quarantine rows)."""
    qdir = tmp_path / f"quarantine_{source}"
    ds = read_source(source, [str(p) for p in paths], quarantine_dir=str(qdir), **kwargs)
    rows = ds.take_all()
    return rows, read_summary(str(qdir), source), read_quarantine(str(qdir)).to_pylist()


def check(summary, bad, *, rows: int, good: int, skipped: dict, expected_bad: set, file: Path):
    """Counts add up, and the quarantine holds exactly the expected (row, reason, field) with its origin."""
    assert summary.rows == rows, f"rows read {summary.rows} != input rows {rows}"
    assert summary.good == good, f"good {summary.good} != {good}"
    assert dict(summary.skipped) == skipped, f"skipped {dict(summary.skipped)} != {skipped}"
    assert summary.balanced, f"counts do not add up: {summary.to_dict()}"
    got = {(b["row"], b["reason"], b["field"]) for b in bad}
    assert got == expected_bad, f"quarantine {sorted(got)} != expected {sorted(expected_bad)}"
    assert Counter(summary.quarantined) == Counter(r for _, r, _ in expected_bad), "per-reason counts"
    assert {b["file"] for b in bad} == {str(file)}, "origin file of every quarantined row"
    assert all(b["raw"] and b["detail"] for b in bad), "each quarantined row keeps its raw text and a detail"


@pytest.fixture(scope="module")
def ray_data(ray_local):
    ray_local.data.DataContext.get_current().enable_progress_bars = False
    return ray_local


# -- NLI ----------------------------------------------------------------------------------------------------
SNLI_LINES = [
    js(sentence1="A man plays.", sentence2="A person plays.", gold_label="entailment", pairID="1"),  # 1 good
    js(sentence1="A dog runs.", sentence2="The dog is fast.", gold_label="neutral", pairID="2"),  # 2 good
    js(sentence1="Kids sing.", sentence2="Kids are loud.", gold_label="-", pairID="3"),  # 3 no consensus
    "",  # 4 blank line
    '{"sentence1": "A man',  # 5 bad json
    js(sentence2="x", gold_label="neutral"),  # 6 missing sentence1
    js(sentence1=7, sentence2="x", gold_label="neutral"),  # 7 wrong type
    js(sentence1="   ", sentence2="x", gold_label="neutral"),  # 8 empty text
    b'{"sentence1": "caf\xe9", "sentence2": "x", "gold_label": "neutral"}',  # 9 invalid UTF-8
    js(sentence1="x" * 60, sentence2="x", gold_label="neutral"),  # 10 too long (max_chars=50)
    js(sentence1="x", sentence2="y", gold_label="maybe"),  # 11 unknown label
    '{"sentence1": "\\ud800", "sentence2": "y", "gold_label": "neutral"}',  # 12 lone surrogate
    "[1, 2]",  # 13 not an object
    js(sentence1="Two cats.", sentence2="No animals.", gold_label="contradiction") + "\r",  # 14 good, CRLF
]
SNLI_BAD = {(5, "bad_json", ""), (6, "missing_field", "sentence1"), (7, "wrong_type", "sentence1"),
            (8, "empty_text", "sentence1"), (9, "bad_utf8", ""), (10, "too_long", "sentence1"),
            (11, "unknown_label", "gold_label"), (12, "bad_utf8", "sentence1"), (13, "bad_json", "")}


def test_snli_jsonl_every_kind_of_bad_row(ray_data, tmp_path):
    path = write_lines(tmp_path / "snli_1.0_dev.jsonl", SNLI_LINES)
    rows, summary, bad = run("snli", [path], tmp_path, options=SourceOptions(max_chars=50), rows_per_block=4)
    check(summary, bad, rows=14, good=3, skipped={"no_consensus": 1, "blank_line": 1}, expected_bad=SNLI_BAD,
          file=path)
    records = sorted((to_record(r, "nli") for r in rows), key=lambda r: r.premise)
    assert records == [NLIRecord("A dog runs.", "The dog is fast.", "neutral"),
                       NLIRecord("A man plays.", "A person plays.", "entailment"),
                       NLIRecord("Two cats.", "No animals.", "contradiction")], records


SNLI_TSV_HEADER = ("gold_label\tsentence1_binary_parse\tsentence2_binary_parse\tsentence1_parse\tsentence2_parse\t"
                   "sentence1\tsentence2\tcaptionID\tpairID\tlabel1\tlabel2\tlabel3\tlabel4\tlabel5")


def snli_tsv(label: str, s1: str, s2: str) -> str:
    return "\t".join([label, "( x )", "( y )", "(ROOT x)", "(ROOT y)", s1, s2, "c.jpg#0", "c.jpg#0r1e",
                      label, label, label, label, label])


def test_snli_tsv_counts_the_header_as_line_one(ray_data, tmp_path):
    path = write_lines(tmp_path / "snli_1.0_dev.txt", [
        SNLI_TSV_HEADER,
        snli_tsv("entailment", "A man sleeps.", "A person rests."),  # 2 good
        snli_tsv("contradiction", "A man sleeps.", "A man runs."),  # 3 good
        "entailment\tonly\tthree",  # 4 wrong column count
        snli_tsv("-", "A man sleeps.", "He dreams."),  # 5 no consensus
        snli_tsv("neutral", "A man sleeps.", " "),  # 6 empty sentence2
        snli_tsv("unsure", "A man sleeps.", "He dreams."),  # 7 unknown label
    ])
    rows, summary, bad = run("snli", [path], tmp_path)
    check(summary, bad, rows=6, good=2, skipped={"no_consensus": 1}, file=path,
          expected_bad={(4, "bad_columns", ""), (6, "empty_text", "sentence2"), (7, "unknown_label", "gold_label")})
    assert sorted(r["label"] for r in rows) == ["contradiction", "entailment"]


def test_mnli_qnli_xnli_layouts(ray_data, tmp_path):
    mnli = write_lines(tmp_path / "multinli_dev_matched.jsonl", [
        js(sentence1="The cat sat.", sentence2="A cat sits.", gold_label="entailment", genre="fiction"),  # 1
        js(sentence1="The cat sat.", sentence2="A dog sits.", gold_label="neutral", genre=3),  # 2 wrong type
        js(sentence1="The cat sat.", sentence2="A cat sits.", gold_label="-", genre="fiction"),  # 3 skipped
    ])
    rows, summary, bad = run("mnli", [mnli], tmp_path)
    check(summary, bad, rows=3, good=1, skipped={"no_consensus": 1}, file=mnli,
          expected_bad={(2, "wrong_type", "genre")})
    assert rows == [{"premise": "The cat sat.", "hypothesis": "A cat sits.", "label": "entailment",
                     "language": "en"}]

    qnli = write_lines(tmp_path / "qnli_dev.tsv", [
        "index\tquestion\tsentence\tlabel",
        "0\tWhat is red?\tA rose is red.\tentailment",  # 2
        "1\tWhat is red?\tThe sky is blue.\tnot_entailment",  # 3 -> neutral
        "2\tWhat is red?\tA tomato.\tmaybe",  # 4 unknown label
        "3\t\tA tomato.\tentailment",  # 5 empty question
    ])
    rows, summary, bad = run("qnli", [qnli], tmp_path)
    check(summary, bad, rows=4, good=2, skipped={}, file=qnli,
          expected_bad={(4, "unknown_label", "label"), (5, "empty_text", "question")})
    assert sorted((r["hypothesis"], r["label"]) for r in rows) == [("A rose is red.", "entailment"),
                                                                    ("The sky is blue.", "neutral")]

    xnli = write_lines(tmp_path / "xnli.de.jsonl", [
        js(premise="Er kam.", hypothesis="Er ging.", label=2),  # 1 contradiction, language from file name
        js(premise="Er kam.", hypothesis="Er war da.", label="0"),  # 2 entailment
        js(premise="Il vint.", hypothesis="Il partit.", label="neutral", language="fr"),  # 3 own language
        js(premise="Er kam.", hypothesis="Er ging.", label=5),  # 4 unknown label
        js(premise="Er kam.", hypothesis="Er ging.", label=True),  # 5 a boolean is no NLI label
        js(premise="Er kam.", hypothesis=["Er ging."], label=1),  # 6 wrong type
    ])
    rows, summary, bad = run("xnli", [xnli], tmp_path)
    check(summary, bad, rows=6, good=3, skipped={}, file=xnli,
          expected_bad={(4, "unknown_label", "label"), (5, "unknown_label", "label"), (6, "wrong_type", "hypothesis")})
    assert sorted((r["hypothesis"], r["label"], r["language"]) for r in rows) == [
        ("Er ging.", "contradiction", "de"), ("Er war da.", "entailment", "de"), ("Il partit.", "neutral", "fr")]


# -- parallel -----------------------------------------------------------------------------------------------
def test_wikimatrix_tsv_threshold_and_english_target(ray_data, tmp_path):
    path = write_lines(tmp_path / "WikiMatrix.en-de.tsv", [
        "1.2\tThe house.\tDas Haus.",  # 1 good: English is column 2, so it becomes the target
        "1.01\tLow.\tNiedrig.",  # 2 below 1.04
        "abc\tX.\tY.",  # 3 score not a number
        "1.3\tOnly two",  # 4 wrong column count
        "1.5\t\tLeer.",  # 5 empty sentence
        b"1.5\tBad \xff\tByte.",  # 6 invalid UTF-8
        "1.1\t" + "x" * 60 + "\tLang.",  # 7 too long
        "1.06\tYes.\tJa.",  # 8 good
        "nan\tA.\tB.",  # 9 score not finite
    ])
    rows, summary, bad = run("wikimatrix", [path], tmp_path, options=SourceOptions(max_chars=50))
    check(summary, bad, rows=9, good=2, skipped={"below_threshold": 1}, file=path,
          expected_bad={(3, "wrong_type", "score"), (4, "bad_columns", ""), (5, "empty_text", "sentence1"),
                        (6, "bad_utf8", ""), (7, "too_long", "sentence1"), (9, "bad_value", "score")})
    records = sorted((to_record(r, "parallel") for r in rows), key=lambda r: r.source)
    assert records == [ParallelRecord("Das Haus.", "The house.", "de", "en", 1.2),
                       ParallelRecord("Ja.", "Yes.", "de", "en", 1.06)], records


def test_tatoeba_layout(ray_data, tmp_path):
    path = write_lines(tmp_path / "tatoeba.jsonl", [
        js(lang="afr", text="Haar Engels is uitstekend.", text_eng="Her English is excellent."),  # 1
        js(lang="deu", text="", text_eng="Nothing."),  # 2 empty text
        js(text="Hallo.", text_eng="Hello."),  # 3 missing lang
    ])
    rows, summary, bad = run("tatoeba", [path], tmp_path)
    check(summary, bad, rows=3, good=1, skipped={}, file=path,
          expected_bad={(2, "empty_text", "text"), (3, "missing_field", "lang")})
    assert to_record(rows[0], "parallel") == ParallelRecord("Haar Engels is uitstekend.",
                                                            "Her English is excellent.", "afr", "eng")


# -- click logs ---------------------------------------------------------------------------------------------
def test_click_log_jsonl(ray_data, tmp_path):
    path = write_lines(tmp_path / "clicks.jsonl", [
        js(query="rote schuhe", title="Roter Schuh", description="Schön", clicked=True, position=1,
           language="de", query_id=7, doc_id="d1"),  # 1 good, flat document columns
        js(query="blue hat", fields={"title": "Hat", "url": "http://x"}, clicks=0, impressions=3,
           position=4),  # 2 good, a fields object
        js(query="lamp", ad_title="Lamp", label="Good"),  # 3 good, relevance label as a click stand-in
        js(query="x", title="T", clicked=True, position=0),  # 4 position must be >= 1
        js(query="x", title="T", clicked="yes"),  # 5 unknown clicked value
        js(query="x", title="", description=" ", clicked=False),  # 6 no document text
        js(title="T", clicked=False),  # 7 missing query
        js(query="x", title="T", clicks=5, impressions=2),  # 8 more clicks than impressions
        js(query="x", title="T", clicked=False, position="3"),  # 9 position as a string
        js(query="x", title="T"),  # 10 no click signal
        js(query="x", title="T", label="Meh"),  # 11 unknown label
    ])
    rows, summary, bad = run("clicks", [path], tmp_path)
    check(summary, bad, rows=11, good=3, skipped={}, file=path,
          expected_bad={(4, "bad_value", "position"), (5, "unknown_label", "clicked"), (6, "empty_text", "fields"),
                        (7, "missing_field", "query"), (8, "bad_value", "clicks"), (9, "wrong_type", "position"),
                        (10, "missing_field", "clicked"), (11, "unknown_label", "label")})
    records = {r.query: r for r in (to_record(row, "click") for row in rows)}
    assert records["rote schuhe"] == ClickRecord("rote schuhe", {"title": "Roter Schuh", "description": "Schön"},
                                                 True, 1, 1, 1, "de", "7", "d1", None), records["rote schuhe"]
    assert records["blue hat"] == ClickRecord("blue hat", {"title": "Hat", "url": "http://x"}, False, 4, 3, 0)
    assert records["lamp"] == ClickRecord("lamp", {"title": "Lamp"}, True, None, 1, 1, relevance=1)


def test_click_log_parquet_layout(ray_data, tmp_path):
    path = tmp_path / "qadsm_de.parquet"
    pq.write_table(pa.table({"query": ["lampe", None, "tisch"], "ad_title": ["Lampen", "Stuhl", "Tisch"],
                             "ad_description": ["Günstig", "", "Holz"], "label": ["Good", "Bad", "Bad"]}), path)
    rows, summary, bad = run("clicks", [path], tmp_path, options=SourceOptions(language="de"))
    check(summary, bad, rows=3, good=2, skipped={}, file=path, expected_bad={(1, "missing_field", "query")})
    assert sorted((r["query"], r["clicked"], r["language"], dict(r["fields"])["title"]) for r in rows) == [
        ("lampe", True, "de", "Lampen"), ("tisch", False, "de", "Tisch")]


# -- aspect corpora (ESCI) and product-QA evidence (hetPQA) -------------------------------------------------
def test_esci_parquet(ray_data, tmp_path):
    path = tmp_path / "esci_sample.parquet"
    pq.write_table(pa.table({
        "query_id": ["1", "1", "2", "2", "3", "3", "4"],
        "query": ["red chair", "red chair", "lamp", "lamp", None, "desk", "desk"],
        "product_id": ["B1", "B2", "B3", "B4", "B5", "B6", None],
        "product_locale": ["us"] * 7,
        "esci_label": ["E", "S", "X", "E", "E", "C", "I"],
        "product_title": ["Acme Red Chair", "Blue Chair", "Lamp", "", "Desk", "Desk", "Desk"],
        "product_description": ["", "Soft", "", "", "", "d" * 200, ""],
        "product_bullet_point": ["Strong legs", None, "", "", "", "", ""],
        "product_brand": ["Acme", None, "", "", "", "", ""],
        "product_color": ["Red", "", "", "", "", "", ""],
    }), path)
    rows, summary, bad = run("esci", [path], tmp_path, options=SourceOptions(max_chars=100))
    check(summary, bad, rows=7, good=2, skipped={}, file=path,
          expected_bad={(2, "unknown_label", "esci_label"), (3, "empty_text", "product_title"),
                        (4, "missing_field", "query"), (5, "too_long", "product_description"),
                        (6, "missing_field", "product_id")})
    by_id = {r["product_id"]: r for r in rows}
    assert by_id["B1"] == {"query_id": "1", "query": "red chair", "product_id": "B1", "title": "Acme Red Chair",
                           "description": "Strong legs", "esci": "E", "relevance": 3, "language": "en",
                           "brand": ["Acme"], "color": ["Red"], "category": []}, by_id["B1"]
    assert (by_id["B2"]["brand"], by_id["B2"]["color"], by_id["B2"]["esci"]) == ([], [], "S")


def test_hetpqa_parquet(ray_data, tmp_path):
    path = tmp_path / "hetpqa_evidence_ranking_dev.parquet"
    pq.write_table(pa.table({
        "qid": ["q1", "q1", "q2", "q2", "q3", "q3"], "ASIN": ["A1"] * 6,
        "qa_pair_id": ["p1", "p2", "p3", "p4", "p5", "p6"],
        "question": ["is it blue?", "is it blue?", "size?", "size?", "weight?", None],
        "candidate": ["Color: blue", "Great phone", "XL", "", "2 kg", "light"],
        "label": ["1", "0", "1", "0", "2", "1"],
        "source": ["Desc", "OSP", "blog", "bullet", "attribute", "review"],
        "confidence": ["high", "low", "high", "high", "high", "high"],
    }), path)
    rows, summary, bad = run("hetpqa", [path], tmp_path, options=SourceOptions(split="dev"))
    check(summary, bad, rows=6, good=2, skipped={}, file=path,
          expected_bad={(2, "unknown_label", "source"), (3, "empty_text", "candidate"), (4, "unknown_label", "label"),
                        (5, "missing_field", "question")})
    records = sorted((to_record(r, "evidence") for r in rows), key=lambda r: r.evidence_id)
    assert records == [
        EvidenceRecord("q1", "is it blue?", "p1", "Color: blue", "description", 1, "A1", "dev", {"confidence": "high"}),
        EvidenceRecord("q1", "is it blue?", "p2", "Great phone", "osp", 0, "A1", "dev", {"confidence": "low"}),
    ], records


def test_epqa_graded_and_semipqa_attribute_layouts(ray_data, tmp_path):
    epqa = tmp_path / "epqa_dev.parquet"
    pq.write_table(pa.table({
        "qid": ["18", "18", "18", "19", "19"], "question": ["will it fit?"] * 4 + [""],
        "ASIN": ["B1"] * 5, "candidate": ["order the right #", "it fits model 240337103", "nice", "x", "y"],
        "source": ["cqa", "cqa", "review", "bullet", "description"], "qa_pair_id": ["140", "141", "142", "143", "144"],
        "title": ["Crisper Pan"] * 5, "label": ["1", "2", "0", "3", "2"], "answer": ["maybe", "yes", "", "", ""],
    }), epqa)
    rows, summary, bad = run("epqa", [epqa], tmp_path)
    check(summary, bad, rows=5, good=3, skipped={}, file=epqa,
          expected_bad={(3, "unknown_label", "label"), (4, "empty_text", "question")})
    by_id = {r["evidence_id"]: to_record(r, "evidence") for r in rows}
    assert [by_id[i].label for i in ("140", "141", "142")] == [0, 1, 0], "label 1 iff grade 2 (answers)"
    assert by_id["141"].extra == {"title": "Crisper Pan", "answer": "yes", "grade": "2"}, by_id["141"].extra

    semi = tmp_path / "semipqa_attribute_ranking_dev.parquet"
    pq.write_table(pa.table({
        "qid": ["366", "366", "367"], "qa_pair_id": ["6465", "6467", "6470"],
        "question": ["age range?", "age range?", "size?"],
        "candidate": ['age_range_description:  { value:"little kid" }', "batteries_included:  { value:false }", ""],
        "label": ["1", "0", "1"],
    }), semi)
    rows, summary, bad = run("semipqa", [semi], tmp_path)
    check(summary, bad, rows=3, good=2, skipped={}, file=semi, expected_bad={(2, "empty_text", "candidate")})
    assert sorted((r["evidence_id"], r["source"], r["label"]) for r in rows) == [("6465", "attribute", 1),
                                                                                 ("6467", "attribute", 0)]


def test_esci_judgments_label_or_rating(ray_data, tmp_path):
    judged = tmp_path / "esci_us_judgments.parquet"
    pq.write_table(pa.table({"query": ["t towels", "t towels", "lamp", "lamp", None],
                             "product_id": ["B07", "B08", "B09", "", "B10"],
                             "rating": [100.0, 10.0, 1.0, 0.0, 100.0]}), judged)
    rows, summary, bad = run("esci_judgments", [judged], tmp_path)
    check(summary, bad, rows=5, good=3, skipped={}, file=judged,
          expected_bad={(3, "empty_text", "product_id"), (4, "missing_field", "query")})
    assert sorted((r["product_id"], r["esci"], r["relevance"]) for r in rows) == [
        ("B07", "E", 3), ("B08", "S", 2), ("B09", "C", 1)]
    examples = tmp_path / "esci_examples.parquet"
    pq.write_table(pa.table({"query": ["desk", "desk"], "query_id": ["7", "7"], "product_id": ["B1", "B2"],
                             "product_locale": ["es", "us"], "esci_label": ["I", "Q"]}), examples)
    (tmp_path / "second").mkdir()
    rows, summary, bad = run("esci_judgments", [examples], tmp_path / "second")  # its own quarantine
    check(summary, bad, rows=2, good=1, skipped={}, file=examples, expected_bad={(1, "unknown_label", "esci_label")})
    assert rows == [{"query_id": "7", "query": "desk", "product_id": "B1", "esci": "I", "relevance": 0,
                     "language": "es"}]


# -- streaming origins, strict mode, plan errors ------------------------------------------------------------
def test_split_ranges_keep_exact_line_numbers(ray_data, tmp_path):
    """A file read as 5+ byte ranges: every good row keeps its line, every bad row its line."""
    lines, bad_lines = [], set()
    for i in range(1, 601):
        if i % 97 == 0:
            lines.append('{"sentence1": ')
            bad_lines.add(i)
        else:
            lines.append(js(sentence1=f"premise {i}", sentence2=f"hypothesis {i}", gold_label="neutral"))
    path = write_lines(tmp_path / "big.jsonl", lines)
    assert len(plan_parts("snli", str(path), split_bytes=8_000)) >= 5, "the file must be split"
    rows, summary, bad = run("snli", [path], tmp_path, split_bytes=8_000, rows_per_block=50, with_origin=True)
    check(summary, bad, rows=600, good=600 - len(bad_lines), skipped={}, file=path,
          expected_bad={(i, "bad_json", "") for i in bad_lines})
    assert sorted(r["_row"] for r in rows) == [i for i in range(1, 601) if i not in bad_lines], "good-row lines"
    assert all(r["premise"] == f"premise {r['_row']}" for r in rows), "a row's content matches its line number"


def test_auto_split_plans_parts_per_cpu(tmp_path, monkeypatch):
    """split_bytes="auto": ~AUTO_PARTS_PER_CPU parts per CPU for a large local line file (contiguous, on line
    boundaries, first line numbers right), row-group parts for Parquet, whole files on a remote-style
    filesystem (the scan would download the file) and under two minimum parts."""
    import pyarrow.fs as pafs

    from pipelines.data import file_parts
    from pipelines.data.cli import split_bytes

    assert file_parts.auto_split_bytes(10 << 20, cpus=2) == 4 << 20, "at least AUTO_MIN_PART_BYTES"
    assert file_parts.auto_split_bytes(1 << 30, cpus=2) == 128 << 20, "1 GiB on 2 CPUs: 8 parts"
    assert file_parts.auto_split_bytes(1 << 40, cpus=2) == file_parts.AUTO_MAX_PART_BYTES
    assert file_parts.auto_split_bytes(7 << 20, cpus=64) is None, "under two minimum parts: whole"
    monkeypatch.setattr(file_parts, "AUTO_MIN_PART_BYTES", 2_000)
    monkeypatch.setattr(file_parts, "cluster_cpus", lambda: 2)
    lines = [js(sentence1=f"premise {i}", sentence2="h", gold_label="neutral") for i in range(1, 1001)]
    path = write_lines(tmp_path / "big.jsonl", lines)
    size = path.stat().st_size
    parts = plan_parts("snli", str(path), split_bytes="auto")
    assert len(parts) == 2 * file_parts.AUTO_PARTS_PER_CPU, [p.size for p in parts]
    assert [p.start for p in parts[1:]] == [p.end for p in parts[:-1]] and parts[-1].end == size
    data = path.read_bytes()
    for part in parts:  # each part starts on a line boundary, at the line number it claims
        assert part.start == 0 or data[part.start - 1:part.start] == b"\n"
        assert data[:part.start].count(b"\n") + 1 == part.first_row
    assert len(plan_parts("snli", str(path), split_bytes=None)) == 1
    remote = pafs.SubTreeFileSystem(str(tmp_path), pafs.LocalFileSystem())
    assert len(plan_parts("snli", "big.jsonl", filesystem=remote, split_bytes="auto")) == 1
    assert len(plan_parts("snli", "big.jsonl", filesystem=remote, split_bytes=size // 3)) >= 3, "explicit: split"
    table = pa.table({"sentence1": [f"p {i}" for i in range(4000)], "sentence2": ["h"] * 4000,
                      "gold_label": ["neutral"] * 4000})
    pq.write_table(table, tmp_path / "snli.parquet", row_group_size=500)
    groups = plan_parts("snli", str(tmp_path / "snli.parquet"), split_bytes="auto")
    assert len(groups) > 1 and [g.first_row for g in groups] == sorted({g.first_row for g in groups})
    assert sum(len(g.row_groups) for g in groups) == 8
    with pytest.raises(ValueError, match="split_bytes must be"):
        plan_parts("snli", str(path), split_bytes="half")
    assert (split_bytes("auto"), split_bytes("0"), split_bytes("1.5")) == ("auto", None, 3 << 19)
    with pytest.raises(ValueError, match="--split-mb"):
        split_bytes("lots")


def test_strict_mode_names_file_row_and_field(ray_data, tmp_path):
    path = write_lines(tmp_path / "strict.jsonl", [SNLI_LINES[0], SNLI_LINES[5], SNLI_LINES[6]])
    with pytest.raises(StrictModeError, match=r"strict\.jsonl: line 2: field 'sentence1': missing_field"):
        ingest("snli", str(path), str(tmp_path / "out"), strict=True)
    clean = write_lines(tmp_path / "clean.jsonl", [SNLI_LINES[0], SNLI_LINES[1]])
    summary = ingest("snli", str(clean), str(tmp_path / "clean_out"), strict=True)
    assert (summary.rows, summary.good, summary.balanced) == (2, 2, True), summary.to_dict()
    written = pq.read_table(tmp_path / "clean_out")
    assert written.num_rows == 2 and written.schema.names == ["premise", "hypothesis", "label", "language"]


def test_bom_is_skipped_duplicates_counted_and_an_all_bad_file_fails_loudly(ray_data, tmp_path):
    """A UTF-8 BOM made a JSONL file's first row bad_json and stuck to a TSV's first header (every
    row then failed missing_field while the summary said "balanced"); duplicate rows passed unflagged."""
    bom = b"\xef\xbb\xbf"
    jsonl = write_lines(tmp_path / "bom.jsonl", [bom + SNLI_LINES[0].encode(), SNLI_LINES[1], SNLI_LINES[0],
                                                 SNLI_LINES[1], SNLI_LINES[0]])
    summary = ingest("snli", str(jsonl), str(tmp_path / "out_jsonl"))
    assert (summary.rows, summary.good, summary.num_quarantined) == (5, 5, 0), summary.to_dict()
    assert summary.duplicates == 3 and "3 duplicate good rows" in summary.format(), summary.to_dict()
    tsv = write_lines(tmp_path / "bom.txt", [bom + SNLI_TSV_HEADER.encode(),
                                             snli_tsv("entailment", "A man sleeps.", "A person rests."),
                                             snli_tsv("neutral", "A man sleeps.", "He dreams.")])
    summary = ingest("snli", str(tsv), str(tmp_path / "out_tsv"))
    assert (summary.rows, summary.good, summary.num_quarantined, summary.duplicates) == (2, 2, 0, 0), \
        summary.to_dict()
    wrong = write_lines(tmp_path / "wrong_layout.jsonl", [js(question="a", answer="b", rating=3)] * 3)
    with pytest.raises(NoGoodRowsError, match=r"wrong_layout\.jsonl: all 3 rows quarantined.*missing_field 3"):
        ingest("snli", [str(jsonl), str(wrong)], str(tmp_path / "out_wrong"))
    written = json.loads((tmp_path / "out_wrong.quarantine" / "summary.json").read_text())
    assert written["files"][str(wrong)]["quarantined"] == 3 and written["duplicates"] == 3, written


def test_plan_errors_are_clear(tmp_path):
    with pytest.raises(ValueError, match="unknown source 'nope'"):
        plan_parts("nope", str(tmp_path))
    with pytest.raises(ValueError, match="no such file"):
        plan_parts("snli", str(tmp_path / "missing.jsonl"))
    (tmp_path / "x.parquet").write_bytes(b"not parquet")
    with pytest.raises(ValueError, match="not a readable parquet file"):
        plan_parts("snli", str(tmp_path / "x.parquet"))
    write_lines(tmp_path / "w.jsonl", ["{}"])
    with pytest.raises(ValueError, match="reads tsv, not jsonl"):
        plan_parts("wikimatrix", str(tmp_path / "w.jsonl"))


def test_fields_accessors_without_ray():
    f = Fields({"a": " x ", "n": 3.0, "s": "", "l": ["red", " ", "blue"]}, max_chars=5)
    assert (f.text(("a",)), f.integer(("n",)), f.values(("l",))) == (" x ", 3, ["red", "blue"])
    assert f.text(("s",), required=False) is None and f.text(("s",), allow_empty=True) == ""
    for call, reason in [(lambda: f.text(("zz", "yy")), "missing_field"), (lambda: f.integer(("a",)), "wrong_type"),
                         (lambda: f.choice(("a",), {"y": 1}), "unknown_label"), (lambda: f.text(("s",)), "empty_text")]:
        with pytest.raises(BadRow) as err:
            call()
        assert err.value.reason == reason, (err.value, reason)
    tsv = Fields({"n": "12", "e": ""}, max_chars=5, typed=False)
    assert (tsv.integer(("n",)), tsv.integer(("e",))) == (12, None), "TSV numbers parse from text"
