"""The data stage and the evaluation job on BEIR directories: `data.beir_dir` prepares the run's catalog,
split files and quarantine; the real Home Depot data written in the BEIR layout gives the catalog path's
catalog and, through `pipelines.evaluate --beir` (in this process), the catalog path's metrics."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from madr.config import DataConfig, load_config
from madr.data.beir import read_beir
from madr.data.quarantine import read_quarantine
from madr.data.schema import Catalog
from madr.evaluate_config import DEFAULT_METRICS, EvaluateConfig
from madr.layout import RunLayout, prepared_catalog
from madr.recipes.aspects.experiment import load_catalog
from pipelines.data.prepare import corpus_table, prepare, source_catalog, write_split
from pipelines.encode.job import run_encode
from pipelines.evaluate.job import run_evaluate
from pipelines.evaluate.searcher import SearchSpec
from tests.beir_layout import write_beir
from tests.pipelines.test_encode import encode_config, make_model


def _config(output: Path, **data):
    overrides = {"output_dir": str(output), "model.name": "bibert", "data.tokenizer_vocab_size": 800,
                 "eval.split": "test", **{f"data.{k}": v for k, v in data.items()}}
    return load_config(None, overrides)


def _judgments(catalog: Catalog) -> list[tuple[str, str, int]]:
    return sorted((j.query_id, j.product_id, j.relevance) for j in catalog.judgments)


def test_data_config_names_one_source():
    with pytest.raises(ValueError, match="catalog_dir and data.beir_dir are both set"):
        DataConfig(catalog_dir="a", beir_dir="b")
    with pytest.raises(ValueError, match="data.qrels needs data.beir_dir"):
        DataConfig(qrels={"test": "q.trec"})


@pytest.mark.ray
def test_data_stage_prepares_a_beir_directory_with_its_quarantine(ray_local, catalog, tmp_path):
    beir = write_beir(catalog, tmp_path / "beir")
    (beir / "qrels" / "train.tsv").unlink()  # many BEIR sets ship test qrels only
    with open(beir / "corpus.jsonl", "a") as f:
        f.write('{"title": "a document without _id", "text": ""}\n')
    trec = tmp_path / "test.qrels"  # the test judgments as a TREC file, one naming an unknown document
    trec.write_text("".join(f"{q} 0 {d} {r}\n" for q, d, r in (line.split("\t") for line in
                    (beir / "qrels" / "test.tsv").read_text().splitlines()[1:])) + "nosuchquery 0 nosuchdoc 1\n")
    cfg = _config(tmp_path / "run", beir_dir=beir.as_uri(), qrels={"test": str(trec)})
    summary = prepare(cfg, log=lambda *_: None)
    layout = RunLayout.of(cfg)

    assert summary["origin"].startswith(f"BEIR directory {beir.as_uri()}, test qrels {trec}")
    test_queries = [q for q in catalog.queries_in("test") if q.query_id in {j.query_id for j in catalog.judgments}]
    assert summary["counts"]["eval_queries"] == len(test_queries) == summary["counts"]["queries"]
    assert summary["counts"]["products"] == len(catalog.products), "every document is in the corpus"
    assert pq.read_table(layout.queries("eval")).column("query_id").to_pylist() == [q.query_id for q in test_queries]
    assert pq.read_table(layout.queries("train")).num_rows == 0, "no train qrels: an empty train split, no error"
    qsummary = json.loads((layout.quarantine / "summary.json").read_text())
    assert qsummary["quarantined"] == {"missing_field": 1, "unknown_id": 1} and qsummary["balanced"]
    assert qsummary["skipped"]["unjudged"] == len(catalog.queries) - len(test_queries)
    bad = {(Path(r["file"]).name, r["row"], r["field"]) for r in read_quarantine(str(layout.quarantine)).to_pylist()}
    n_test = sum(1 for j in catalog.judgments if j.query_id in {q.query_id for q in test_queries})
    assert bad == {("corpus.jsonl", len(catalog.products) + 1, "_id"), ("test.qrels", n_test + 1, "qid")}
    assert prepared_catalog(cfg) is not None
    direct = read_beir(str(beir), qrels={"test": str(trec)}, aspect_names=cfg.model.aspects).catalog
    assert load_catalog(cfg).products == direct.products, "the training stages read the prepared catalog"


@pytest.mark.slow
def test_homedepot_in_the_beir_layout_gives_the_catalog_paths_metrics(shared_data, tokenizer, tmp_path):
    from madr.data.sources.homedepot import ASPECTS, homedepot_catalog

    rows = pq.read_table(shared_data / "product_search" / "homedepot_relevance_dev.parquet").slice(0, 8000)
    pq.write_table(rows, tmp_path / "homedepot.parquet")  # its first 8,000 judgments: 1/6 of the file, 2x faster
    home = homedepot_catalog(tmp_path / "homedepot.parquet")
    home.write(tmp_path / "catalog")
    beir = write_beir(home, tmp_path / "beir")
    aspects = {"model.aspects": list(ASPECTS)}
    by_catalog, _ = source_catalog(load_config(None, {"output_dir": str(tmp_path / "a"), **aspects,
                                                      "data.catalog_dir": str(tmp_path / "catalog")}))
    by_beir, origin = source_catalog(load_config(None, {"output_dir": str(tmp_path / "b"), **aspects,
                                                        "data.beir_dir": beir.as_uri()}), log=lambda *_: None)
    assert origin == f"BEIR directory {beir.as_uri()}"
    assert by_beir.products == by_catalog.products, "ids, titles, descriptions and aspects"
    assert by_beir.queries == by_catalog.queries, "ids, texts, splits, languages and aspects"
    assert _judgments(by_beir) == _judgments(by_catalog)
    assert corpus_table(_products_table(by_beir, tmp_path / "pb"), list(ASPECTS)).equals(
        corpus_table(_products_table(by_catalog, tmp_path / "pc"), list(ASPECTS)))

    # the catalog path's evaluation split and corpus -> one index; evaluated from the catalog path's tables
    # and straight from the BEIR directory
    by_catalog.write(tmp_path / "prepared")
    write_split(tmp_path / "prepared", "test", tmp_path / "eval" / "queries.parquet", tmp_path / "eval" / "qrels.parquet")
    (tmp_path / "corpus").mkdir()
    pq.write_table(corpus_table(pq.read_table(tmp_path / "prepared" / "products.parquet"), list(ASPECTS)),
                   tmp_path / "corpus" / "part-0.parquet")
    model = make_model(tmp_path / "model", tokenizer, "bibert")
    run_encode(encode_config(tmp_path / "corpus", tmp_path / "index", model), local=True, log=lambda _: None)
    common = {"runs": [SearchSpec(name="bibert", index=str(tmp_path / "index"))], "doc_key": "product_id",
              "qrels_doc_column": "product_id", "metrics": DEFAULT_METRICS, "relevance_threshold": 3, "plot": False}
    catalog_path = run_evaluate(EvaluateConfig(queries=str(tmp_path / "eval" / "queries.parquet"),
                                               qrels=str(tmp_path / "eval" / "qrels.parquet"),
                                               output=str(tmp_path / "out_catalog"), **common), log=lambda _: None,
                               local=True)
    beir_path = run_evaluate(EvaluateConfig(beir=beir.as_uri(), split="test", output=str(tmp_path / "out_beir"),
                                            **common), log=lambda _: None, local=True)
    ours, theirs = catalog_path["results"][0], beir_path["results"][0]
    assert ours["queries"] == theirs["queries"] == len(by_catalog.qrels("test"))
    assert {m: theirs[m] for m in DEFAULT_METRICS} == {m: ours[m] for m in DEFAULT_METRICS}
    assert ours["recall@100"] > 0, "the searched ids map back to Home Depot product ids"
    assert beir_path["validation"]["quarantined"] == {} and beir_path["validation"]["balanced"]
    assert (tmp_path / "out_beir" / "bibert.trec").read_text() == (tmp_path / "out_catalog" / "bibert.trec").read_text()


def _products_table(catalog: Catalog, directory: Path):
    catalog.write(directory)
    return pq.read_table(directory / "products.parquet")
