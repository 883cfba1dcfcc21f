"""The evaluation job on a local Ray: metrics of two runs (hybrid Flat index, dense IVF index) equal
madr.metrics computed directly from an in-process search; results table, sweep table and plot."""

from __future__ import annotations

import csv

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

from madr.metrics import evaluate
from madr.modeling.model import BiEncoder
from madr.search.params import SearchParams
from madr.search.sharded import ShardedIndex
from pipelines.encode.job import run_encode
from pipelines.evaluate.job import EvaluateConfig, run_evaluate, to_run
from pipelines.evaluate.searcher import DocKeys, SearchSpec, search_texts
from tests.pipelines.test_encode import encode_config, make_corpus, make_model

METRICS = ["recall@10", "recall@50", "ndcg@10", "mrr@10", "map@50", "p@1", "hit@5", "r_precision"]


@pytest.fixture(scope="module")
def setup(tmp_path_factory, tokenizer):
    base = tmp_path_factory.mktemp("eval")
    catalog, _ = make_corpus(base / "docs", n=1200)
    hybrid = make_model(base / "hybrid", tokenizer, "hybrid")
    bibert = make_model(base / "bibert", tokenizer, "bibert")
    run_encode(encode_config(base / "docs", base / "flat", hybrid, num_shards=2), local=True, log=lambda _: None)
    run_encode(encode_config(base / "docs", base / "ivf", bibert, num_shards=2, index_factory="IVF8,Flat"),
               local=True, log=lambda _: None)
    pq.write_table(pa.table({"query_id": [q.query_id for q in catalog.queries],
                             "text": [q.text for q in catalog.queries]}), base / "queries.parquet")
    pq.write_table(pa.table({"query_id": [j.query_id for j in catalog.judgments],
                             "product_id": [j.product_id for j in catalog.judgments],
                             "relevance": [j.relevance for j in catalog.judgments]}), base / "qrels.parquet")
    return base, catalog


def _direct(spec: SearchSpec, catalog, k: int) -> dict[str, float]:
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # as in the search actors, so the query vectors are bitwise the same
    try:
        model = BiEncoder.load(ShardedIndex.open(spec.index).manifest.model_dir).eval()
        index = ShardedIndex.open(spec.index)
        scores, ids = search_texts(model, index, [q.text for q in catalog.queries], k, spec)
    finally:
        torch.set_num_threads(threads)
    results = {q.query_id: (i, s) for q, i, s in zip(catalog.queries, ids, scores, strict=True)}
    run = to_run(results, DocKeys(spec.index, "product_id"))
    qrels: dict[str, dict[str, float]] = {}
    for j in catalog.judgments:
        qrels.setdefault(j.query_id, {})[j.product_id] = float(j.relevance)
    return evaluate(run, qrels, METRICS, relevance_threshold=2)


@pytest.mark.ray
def test_evaluation_job_matches_direct_metrics(ray_local, setup):
    base, catalog = setup
    runs = [SearchSpec(name="hybrid", index=str(base / "flat"), search=SearchParams(candidates=200)),
            SearchSpec(name="dense-ivf", index=str(base / "ivf"), search=SearchParams(nprobe=4))]
    cfg = EvaluateConfig(queries=str(base / "queries.parquet"), qrels=str(base / "qrels.parquet"), runs=runs,
                         output=str(base / "out"), doc_key="product_id", qrels_doc_column="product_id",
                         metrics=METRICS, k=50, relevance_threshold=2, sweep_metric="recall@10", batch_size=16)
    out = run_evaluate(cfg, log=lambda _: None)
    for row, spec in zip(out["results"], runs, strict=True):
        expected = _direct(spec, catalog, 50)
        got = {m: row[m] for m in METRICS}
        assert got == pytest.approx(expected, abs=1e-12), spec.name
    assert out["results"][0]["recall@50"] > 0  # the searched ids map back to product ids
    with open(base / "out" / "results.csv") as f:
        table = list(csv.DictReader(f))
    assert [r["run"] for r in table] == ["hybrid", "dense-ivf"]
    assert float(table[0]["ndcg@10"]) == pytest.approx(out["results"][0]["ndcg@10"], abs=1e-9)
    assert (base / "out" / "results.md").read_text().startswith("| run | index | queries | recall@10")
    sweep = [p for p in out["sweep"] if p["run"] == "dense-ivf"]
    assert [p["value"] for p in sweep] == [1, 2, 4, 8] and all(p["param"] == "nprobe" for p in sweep)
    assert all(p["ms_per_query"] > 0 for p in sweep)
    at4 = next(p for p in sweep if p["value"] == 4)  # the run's own setting: the table's value
    assert at4["recall@10"] == pytest.approx(out["results"][1]["recall@10"], abs=1e-12)
    png = base / "out" / "recall_latency.png"
    assert png.is_file() and png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_evaluate_config_errors(tmp_path):
    with pytest.raises(ValueError, match="run names must be unique"):
        EvaluateConfig(runs=[{"name": "a", "index": "x"}, {"name": "a", "index": "y"}])
    (tmp_path / "q.jsonl").write_text('{"query_id": "1", "text": "a"}\n{"query_id": "2"}\n')
    from pipelines.evaluate.io import read_queries

    with pytest.raises(ValueError, match=r"q\.jsonl: row 2, field 'text': missing"):
        read_queries(tmp_path / "q.jsonl")


def test_evaluate_cli_config(tmp_path):
    """Command-line flags over the YAML's ``evaluate:`` section; bad flags give an error, not a traceback."""
    from pathlib import Path

    from pipelines.evaluate.cli import build_parser, load_config, main

    yaml_path = Path(__file__).resolve().parents[2] / "configs" / "encode.yaml"
    cfg = load_config(build_parser().parse_args(["--config", str(yaml_path), "--k", "20"]))
    assert (cfg.k, cfg.runs[0].name, cfg.runs[0].search.nprobe, cfg.doc_key) == (20, "ivf", 16, "product_id")
    cfg = load_config(build_parser().parse_args(["--config", str(yaml_path), "--run", "a=/i/a", "--run", "b=/i/b"]))
    assert [(r.name, r.index) for r in cfg.runs] == [("a", "/i/a"), ("b", "/i/b")]
    with pytest.raises(ValueError, match="--run expects NAME=MANIFEST, got 'noequals'"):
        load_config(build_parser().parse_args(["--queries", "q", "--qrels", "r", "--run", "noequals"]))
    with pytest.raises(ValueError, match="need queries, qrels and at least one run"):
        load_config(build_parser().parse_args(["--run", "a=/i/a"]))
    assert main(["--queries", str(tmp_path / "q.parquet"), "--qrels", "r", "--run", "bad"]) == 1
