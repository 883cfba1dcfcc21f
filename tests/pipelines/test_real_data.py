"""The real public samples in ../shared/data read through the readers without errors; row counts are the
ones ../shared/data/README.md gives (verified there with pandas)."""

from __future__ import annotations

from collections import Counter

import pyarrow.parquet as pq
import pytest

from madr.data.quarantine import read_quarantine
from pipelines.data.readers import ingest
from pipelines.data.sources import SourceOptions

# (source, files under ../shared/data, options, README rows, expected skipped)
REAL = {
    "snli": ("snli", ["nli/snli_dev_subset.parquet"], SourceOptions(), 1289, {"no_consensus": 16}),
    "xnli_de": ("xnli", ["nli/xglue_xnli_de_train.parquet", "nli/xglue_xnli_de_dev.parquet"], SourceOptions(),
                2245 + 250, {}),
    "hetpqa": ("hetpqa", ["product_qa/hetpqa_evidence_ranking_dev.parquet"], SourceOptions(split="dev"), 2731, {}),
    "esci": ("esci", ["esci/esci_sample_with_product_text_grandi9.parquet"], SourceOptions(), 485, {}),
    "esci_exact100": ("esci", ["esci/esci_exact_sample100_with_product_text.parquet"],
                      SourceOptions(default_label="E"), 100, {}),
    "tatoeba": ("tatoeba", ["parallel/tatoeba_parallel_dev.parquet"], SourceOptions(), 62194, {}),
    "qadsm_de": ("clicks", ["query_relevance/xglue_qadsm_de_train.parquet", "query_relevance/xglue_qadsm_de_dev.parquet"],
                 SourceOptions(language="de"), 9000 + 1000, {}),
    "qam_de": ("clicks", ["query_relevance/xglue_qam_de_train.parquet", "query_relevance/xglue_qam_de_dev.parquet"],
               SourceOptions(language="de"), 9000 + 1000, {}),
    "epqa": ("epqa", ["product_qa/epqa_dev.parquet"], SourceOptions(split="dev"), 9770, {}),  # + 1 empty candidate
    "semipqa": ("semipqa", ["product_qa/semipqa_attribute_ranking_dev.parquet"], SourceOptions(split="dev"), 13242, {}),
    "esci_judgments": ("esci_judgments", ["esci/esci_us_judgments.parquet",
                                          "esci/esci_examples_sample5000_E_only.parquet"], SourceOptions(), 6678 + 5000, {}),
}

# the real files' genuinely bad rows: (row, reason, field)
QUARANTINED = {"epqa": {(8786, "empty_text", "candidate")}}  # qid 7870 "hello usa version?": candidate ""


@pytest.mark.parametrize("name", list(REAL))
def test_real_file_reads_without_errors(name, shared_data, ray_local, tmp_path):
    ray_local.data.DataContext.get_current().enable_progress_bars = False
    source, files, options, rows, skipped = REAL[name]
    summary = ingest(source, [str(shared_data / f) for f in files], str(tmp_path / "out"), options=options)
    bad = read_quarantine(str(tmp_path / "out.quarantine")).to_pylist()
    expected_bad = QUARANTINED.get(name, set())
    assert {(b["row"], b["reason"], b["field"]) for b in bad} == expected_bad, f"{name}: quarantined {bad[:3]}"
    assert summary.rows == rows, f"{name}: read {summary.rows} rows, README says {rows}"
    assert dict(summary.skipped) == skipped and summary.balanced, summary.to_dict()
    assert summary.good == rows - sum(skipped.values()) - len(expected_bad)
    assert len(summary.files) == len(files), summary.files


def test_real_rows_are_normalised(shared_data, ray_local, tmp_path):
    """Spot checks of normalised values: XNLI's language from the file name, hetPQA's source names, the
    QADSM click stand-in's fields and labels, ESCI aspects as lists."""
    xnli = pq.read_table(shared_data / "nli/xglue_xnli_de_dev.parquet").slice(0, 1).to_pylist()[0]
    ingest("xnli", str(shared_data / "nli/xglue_xnli_de_dev.parquet"), str(tmp_path / "x"))
    first = pq.read_table(tmp_path / "x").to_pylist()
    assert {r["language"] for r in first} == {"de"}
    assert any(r["premise"] == xnli["premise"] and r["label"] == xnli["label"] for r in first)

    ingest("hetpqa", str(shared_data / "product_qa/hetpqa_evidence_ranking_dev.parquet"), str(tmp_path / "h"))
    rows = pq.read_table(tmp_path / "h").to_pylist()
    assert {r["source"] for r in rows} == {"osp", "bullet", "description", "attribute", "cqa", "review"}
    assert sum(r["label"] for r in rows) == 648, "hetPQA dev has 648 positive candidates"

    ingest("clicks", str(shared_data / "query_relevance/xglue_qadsm_de_dev.parquet"), str(tmp_path / "c"),
           options=SourceOptions(language="de"))
    rows = pq.read_table(tmp_path / "c").to_pylist()
    assert all(dict(r["fields"]).keys() == {"title", "description"} for r in rows)
    assert {r["relevance"] for r in rows} == {0, 1} and all(r["clicked"] == bool(r["relevance"]) for r in rows)

    ingest("esci", str(shared_data / "esci/esci_sample_with_product_text_grandi9.parquet"), str(tmp_path / "e"))
    rows = pq.read_table(tmp_path / "e").to_pylist()
    assert sum(1 for r in rows if r["brand"]) == 485 - 39, "39 of the 485 products have no brand"
    assert sum(1 for r in rows if r["color"]) == 485 - 137, "137 have no colour"


def test_real_graded_and_judged_labels(shared_data, ray_local, tmp_path):
    """ePQA grades (README: 0/1/2) become label = grade 2; the ESCI-S ratings 100/10/1/0 become E/S/C/I with
    the README's counts (3,389 / 1,898 / 305 / 1,086)."""
    ray_local.data.DataContext.get_current().enable_progress_bars = False
    ingest("epqa", str(shared_data / "product_qa/epqa_dev.parquet"), str(tmp_path / "p"))
    rows = pq.read_table(tmp_path / "p").to_pylist()
    grades = Counter(dict(r["extra"])["grade"] for r in rows)
    assert grades == {"0": 6415 - 1, "1": 1042, "2": 2313}, grades  # one grade-0 row has no candidate text
    assert sum(r["label"] for r in rows) == 2313 and {r["source"] for r in rows} == {
        "cqa", "bullet", "attribute", "review", "description"}
    ingest("esci_judgments", str(shared_data / "esci/esci_us_judgments.parquet"), str(tmp_path / "j"))
    judged = Counter(pq.read_table(tmp_path / "j").column("esci").to_pylist())
    assert judged == {"E": 3389, "S": 1898, "C": 305, "I": 1086}, judged


def test_real_esci_aspect_statistics(shared_data, ray_local, tmp_path):
    """Paper 000 Table 3 / paper 001 Table 2 statistics on the real ESCI sample, through ingest -> Parquet ->
    the Ray vocabulary job: coverage = the README's brand / colour gaps (39 and 137 of 485 rows)."""
    from madr.modeling.aspect_vocabulary import build_vocabularies
    from pipelines.data.stats import aspect_stats
    from pipelines.data.vocab_job import build_vocabularies_ray

    ray_local.data.DataContext.get_current().enable_progress_bars = False
    ingest("esci", str(shared_data / "esci/esci_sample_with_product_text_grandi9.parquet"), str(tmp_path / "e"))
    items = ray_local.data.read_parquet(str(tmp_path / "e"))
    vocabs = build_vocabularies_ray(items, ["brand", "color"], ["phrase", "word"])
    stats = aspect_stats({"item": items}, ["brand", "color"], vocabs)
    assert stats.documents == {"item": 485}
    assert stats.coverage["item"] == pytest.approx({"brand": (485 - 39) / 485, "color": (485 - 137) / 485})
    rows = pq.read_table(tmp_path / "e", columns=["brand", "color"]).to_pylist()
    expected = build_vocabularies(rows, ["brand", "color"], ["phrase", "word"])  # the in-process builder
    assert stats.vocab_sizes == {a: {g: len(expected.get(a, g)) for g in ("phrase", "word")} for a in ("brand", "color")}
    assert stats.vocab_sizes["brand"]["phrase"] > 100, stats.vocab_sizes  # 50 queries' products: many brands
