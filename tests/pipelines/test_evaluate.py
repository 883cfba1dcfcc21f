"""The evaluation job on a local Ray: metrics of two runs (hybrid Flat index, dense IVF index) equal
madr.metrics computed directly from an in-process search; results table, sweep table and plot; the TREC run
files it writes, read by ranx with its qrels file, give the same numbers; a BEIR directory and a TREC qrels
file as inputs give the same metrics as the Parquet tables, their bad lines quarantined (those two evaluated in
this process: `local=True` and `--local` give the Ray job's numbers)."""

from __future__ import annotations

import csv
import dataclasses

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

from madr.data.quarantine import read_quarantine
from madr.data.schema import Catalog
from madr.evaluate_config import EvaluateConfig
from madr.metrics import evaluate
from madr.modeling.model import BiEncoder
from madr.search.params import SearchParams
from madr.search.sharded import ShardedIndex
from pipelines.encode.job import run_encode
from pipelines.evaluate.job import run_evaluate, to_run
from pipelines.evaluate.searcher import DocKeys, SearchSpec, search_texts
from tests.beir_layout import write_beir
from tests.pipelines.test_encode import encode_config, make_corpus, make_model
from tests.ranx_oracle import interpreted_ranx

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


def _runs(base) -> list[SearchSpec]:
    return [SearchSpec(name="hybrid", index=str(base / "flat"), search=SearchParams(candidates=200)),
            SearchSpec(name="dense-ivf", index=str(base / "ivf"), search=SearchParams(nprobe=4))]


def _config(base, out: str, runs: list[SearchSpec] | None = None, **inputs) -> EvaluateConfig:
    inputs = inputs or {"queries": str(base / "queries.parquet"), "qrels": str(base / "qrels.parquet")}
    return EvaluateConfig(**inputs, runs=runs or _runs(base), output=str(base / out), doc_key="product_id",
                          qrels_doc_column="product_id", metrics=METRICS, k=50, relevance_threshold=2,
                          sweep_metric="recall@10", batch_size=16, executor="actors")


@pytest.fixture(scope="module")
def evaluated(ray_local, setup):
    base, _ = setup
    return run_evaluate(_config(base, "out"), log=lambda _: None)


@pytest.mark.ray
def test_evaluation_job_matches_direct_metrics(evaluated, setup):
    base, catalog = setup
    runs, out = _runs(base), evaluated
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
    # the first run against the other, per query: the means are the table's, the tests madr.significance's
    comparisons = {c["metric"]: c for c in out["comparisons"]}
    assert set(comparisons) == set(METRICS) and all(c["reference"] == "dense-ivf" for c in comparisons.values())
    for metric, c in comparisons.items():
        first, other = out["results"]
        assert (c["run_mean"], c["reference_mean"]) == pytest.approx((first[metric], other[metric]), abs=1e-12)
        assert c["diff"] == pytest.approx(c["run_mean"] - c["reference_mean"], abs=1e-12)
        assert 0 < c["p_randomisation"] <= 1 and c["n"] > 0
    assert (base / "out" / "comparisons.md").read_text().startswith("| run | reference | metric | run_mean")


# ranx names of the METRICS (ndcg with 2^rel - 1 gains is ranx's "burges" ndcg; binary metrics at grade >= 2,
# ranx's "-l2"; ranx's ndcg at level 1 keeps every positive grade, as madr's ndcg does)
RANX = {"recall@10": "recall@10-l2", "recall@50": "recall@50-l2", "ndcg@10": "ndcg_burges@10",
        "mrr@10": "mrr@10-l2", "map@50": "map@50-l2", "p@1": "precision@1-l2", "hit@5": "hit_rate@5-l2",
        "r_precision": "r-precision-l2"}


@pytest.mark.ray
def test_trec_run_files_read_by_ranx_reproduce_the_metrics(evaluated, setup):
    base, _ = setup
    for row in evaluated["results"]:
        path = evaluated["run_files"][row["run"]]
        assert path == str(base / "out" / f"{row['run']}.trec")
        lines = [line.split() for line in open(path)]
        assert all(len(cells) == 6 and cells[1] == "Q0" and cells[5] == row["run"] for cells in lines)
        with interpreted_ranx() as ranx:  # tests/ranx_oracle.py
            qrels = ranx.Qrels.from_file(str(base / "out" / "qrels.trec"), kind="trec")
            run = ranx.Run.from_file(path, kind="trec")
            theirs = ranx.evaluate(qrels, run, list(RANX.values()))
        got = {m: row[m] for m in METRICS}
        assert got == pytest.approx({m: float(theirs[RANX[m]]) for m in METRICS}, abs=1e-9), row["run"]


def _catalog_all_in_test(catalog: Catalog) -> Catalog:
    """The same catalog with every query in the test split (the Parquet tables evaluate all of them)."""
    queries = [dataclasses.replace(q, split="test") for q in catalog.queries]
    return Catalog(catalog.products, queries, catalog.judgments, catalog.aspect_names)


@pytest.mark.ray
def test_beir_directory_and_trec_qrels_give_the_parquet_metrics(evaluated, setup):
    base, catalog = setup
    beir = write_beir(_catalog_all_in_test(catalog), base / "beir")
    with open(beir / "qrels" / "test.tsv", "a") as f:
        f.write(f"nosuchquery\t{catalog.products[0].product_id}\t2\n"  # named, counted, quarantined
                f"{catalog.queries[0].query_id}\tnosuchdoc\t1\n")
    expected = {r["run"]: {m: r[m] for m in METRICS} for r in evaluated["results"][:1]}
    hybrid = _runs(base)[:1]
    # in this process (local=True): the Ray job's numbers (`expected`) from another input format and path
    by_beir = run_evaluate(dataclasses.replace(_config(base, "out_beir", hybrid, beir=beir.as_uri()), plot=False),
                           log=lambda _: None, local=True)
    assert {r["run"]: {m: r[m] for m in METRICS} for r in by_beir["results"]} == expected
    bad = read_quarantine(str(base / "out_beir" / "quarantine")).to_pylist()
    assert [(r["row"], r["reason"], r["field"]) for r in bad] == [
        (len(catalog.judgments) + 2, "unknown_id", "query-id"), (len(catalog.judgments) + 3, "unknown_id", "corpus-id")]
    assert by_beir["validation"]["quarantined"] == {"unknown_id": 2}
    # a second run that differs only in the aspect stage: its own results, the first run's sweep (timed once)
    again = dataclasses.replace(hybrid[0], name="hybrid-again", search=hybrid[0].search.replace(aspect_weight=0.0))
    logged: list[str] = []
    by_trec = run_evaluate(dataclasses.replace(
        _config(base, "out_trec", [*hybrid, again], queries=str(base / "queries.parquet"),
                qrels=str(base / "out" / "qrels.trec")),
        plot=False), log=logged.append, local=True)
    got = {r["run"]: {m: r[m] for m in METRICS} for r in by_trec["results"]}
    assert got == {**expected, "hybrid-again": expected["hybrid"]}
    assert {p["run"] for p in by_trec["sweep"]} == {"hybrid"} and "  sweep: as run hybrid's" in "\n".join(logged)


@pytest.mark.ray
def test_queries_that_fit_one_batch_are_searched_in_the_driver_with_the_ray_jobs_numbers(evaluated, setup):
    base, _ = setup
    logged: list[str] = []
    one_batch = run_evaluate(dataclasses.replace(_config(base, "out_one_batch"), batch_size=100_000, plot=False),
                             log=logged.append)
    assert one_batch["results"] == evaluated["results"]
    n = pq.read_table(base / "queries.parquet").num_rows
    assert [line for line in logged if line.startswith("run ")] == [
        f"run {spec.name}: searching {n} queries in {spec.index} in this process" for spec in _runs(base)]


@pytest.mark.ray
def test_on_a_one_node_cluster_auto_searches_in_the_driver_with_every_cpu(evaluated, setup, ray_local):
    import ray

    base, _ = setup
    assert sum(1 for node in ray.nodes() if node["Alive"]) == 1
    cpus = int(ray.cluster_resources()["CPU"])
    logged: list[str] = []
    auto = run_evaluate(dataclasses.replace(_config(base, "out_auto"), executor="auto", plot=False),
                        log=logged.append)
    n = pq.read_table(base / "queries.parquet").num_rows
    where = " in this process" + (f" ({cpus} torch threads)" if cpus > 1 else "")
    assert [line for line in logged if line.startswith("run ")] == [
        f"run {spec.name}: searching {n} queries in {spec.index}{where}" for spec in _runs(base)]
    for got, ray_job in zip(auto["results"], evaluated["results"], strict=True):  # the actor pool's numbers
        assert {m: got[m] for m in METRICS} == pytest.approx({m: ray_job[m] for m in METRICS}, abs=1e-6)
    own = {p["value"]: p["recall@10"] for p in auto["sweep"] if p["run"] == "dense-ivf"}
    assert own[4] == pytest.approx(auto["results"][1]["recall@10"], abs=1e-12)  # its sweep encodes as it searched
    with pytest.raises(ValueError, match="evaluate.executor"):
        dataclasses.replace(_config(base, "x"), executor="threads")


def test_an_int8_run_scores_the_int8_query_tower_the_serve_app_would_use(setup):
    """`encoder_precision: int8` on a run: the job encodes its queries with the int8 query tower
    (`madr.export.quantize.Int8QueryEncoder`, what a Serve app with `encoder_precision: int8` builds), so its
    metrics are those of the served int8 configuration: the direct int8 search's (in batches of the job's
    `batch_size`: dynamic quantisation scales a batch's activations together), close to fp32's, not equal."""
    from madr.export.quantize import int8_encoder

    base, catalog = setup
    fp32 = _runs(base)[0]
    int8 = dataclasses.replace(fp32, name="hybrid-int8", encoder_precision="int8")
    got = run_evaluate(dataclasses.replace(_config(base, "out_int8", [int8]), plot=False), log=lambda _: None,
                       local=True)["results"][0]
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        model = BiEncoder.load(ShardedIndex.open(int8.index).manifest.model_dir).eval()
        texts = [q.text for q in catalog.queries]
        encoder, index = int8_encoder(model), ShardedIndex.open(int8.index)
        parts = [search_texts(model, index, texts[a:a + 16], 50, int8, encoder)  # the job's batches (`_config`)
                 for a in range(0, len(texts), 16)]
        scores, ids = (np.concatenate([p[i] for p in parts]) for i in (0, 1))
        _, fp32_ids = search_texts(model, ShardedIndex.open(fp32.index), texts, 50, fp32)
    finally:
        torch.set_num_threads(threads)
    assert (ids != fp32_ids).any(), "the int8 tower is in use: some list differs from fp32's"
    assert (ids[:, :10] == fp32_ids[:, :10]).mean() > 0.5, "and stays close to it"
    results = {q.query_id: (i, s) for q, i, s in zip(catalog.queries, ids, scores, strict=True)}
    qrels: dict[str, dict[str, float]] = {}
    for j in catalog.judgments:
        qrels.setdefault(j.query_id, {})[j.product_id] = float(j.relevance)
    direct = evaluate(to_run(results, DocKeys(int8.index, "product_id")), qrels, ["recall@10", "mrr@10"],
                      relevance_threshold=2)
    assert got["recall@10"] == pytest.approx(direct["recall@10"]) and got["mrr@10"] == pytest.approx(direct["mrr@10"])
    with pytest.raises(ValueError, match="encoder_precision must be one of fp32, int8, got 'fp16'"):
        SearchSpec(index="x", encoder_precision="fp16")


def test_runs_sharing_a_model_encode_each_batch_of_queries_once_with_the_direct_numbers(setup, monkeypatch):
    """A run and its dense reference on one index (and both their sweeps) take the first run's query vectors
    (`query_vectors`); each run's metrics are still those of its own direct search."""
    import madr.index
    from pipelines.evaluate import searcher

    base, catalog = setup
    real, encoded = madr.index.encode_queries, []
    monkeypatch.setattr(madr.index, "encode_queries", lambda model, texts: encoded.append(len(texts)) or
                        real(model, texts))
    searcher._VECTORS.clear()
    runs = [SearchSpec(name="hybrid", index=str(base / "flat"), search=SearchParams(candidates=200)),
            SearchSpec(name="hybrid-dense", index=str(base / "flat"), search=SearchParams(candidates=200, lam=1.0))]
    out = run_evaluate(dataclasses.replace(_config(base, "out_shared", runs), plot=False), log=lambda _: None,
                       local=True)
    assert sum(encoded) == len(catalog.queries) and max(encoded) == 16  # once, in the job's batches
    assert len({p["run"] for p in out["sweep"]}) == 2  # a hybrid index: the two lams are two sweeps
    for row, spec in zip(out["results"], runs, strict=True):
        assert {m: row[m] for m in METRICS} == pytest.approx(_direct(spec, catalog, 50), abs=1e-12), spec.name
    assert out["results"][0]["recall@10"] != out["results"][1]["recall@10"]
    vectors = next(iter(searcher._VECTORS.values()))[0]
    with pytest.raises(ValueError, match="read-only"):
        vectors[0, 0] = 1.0  # a search cannot change what the next run reads


def test_doc_keys_map_ids_by_array_or_dict_alike(setup):
    base, _ = setup
    keys = DocKeys(str(base / "flat"), "product_id")
    assert keys._dense is not None
    known = sorted(keys._to_key)
    ids = np.array([known[5], known[0], known[17], known[5]])
    by_dict = [keys._to_key[int(i)] for i in ids]
    assert keys.keys(ids) == by_dict
    absent = next(i for i in range(known[-1]) if i not in keys._to_key)
    assert keys.keys(np.array([known[0], absent, 10**9])) == [by_dict[1], str(absent), str(10**9)]
    keys._dense = None
    assert keys.keys(ids) == by_dict


def test_an_onnx_run_scores_the_onnx_query_tower_the_serve_app_would_use(setup):
    """`encoder_backend: onnx` on a run: the job encodes its queries in onnxruntime, with the encoder a Serve app
    with the same `encoder_backend` / `encoder_precision` builds (`build_query_encoder`): fp32 scores as torch
    does; int8 (onnxruntime's dynamic quantisation) runs too, so its quality can be read beside fp32's."""
    from madr.export.onnx import OnnxQueryEncoder
    from pipelines.evaluate.searcher import query_encoder

    base, _ = setup
    fp32 = _runs(base)[0]
    runs = [fp32, dataclasses.replace(fp32, name="onnx", encoder_backend="onnx"),
            dataclasses.replace(fp32, name="onnx-int8", encoder_backend="onnx", encoder_precision="int8")]
    got = {r["run"]: r for r in run_evaluate(dataclasses.replace(_config(base, "out_onnx", runs), plot=False),
                                             log=lambda _: None, local=True)["results"]}
    for metric in ("recall@10", "mrr@10"):
        assert got["onnx"][metric] == pytest.approx(got[fp32.name][metric], abs=0.01), (metric, got)
        assert 0 < got["onnx-int8"][metric] <= 1
    model = BiEncoder.load(ShardedIndex.open(fp32.index).manifest.model_dir).eval()
    assert query_encoder(model, "torch", "fp32") is None  # the model's own towers
    assert isinstance(query_encoder(model, "onnx", "int8"), OnnxQueryEncoder)
    with pytest.raises(ValueError, match="encoder_backend must be one of torch, onnx, got 'tensorrt'"):
        SearchSpec(index="x", encoder_backend="tensorrt")


def test_evaluate_config_errors(tmp_path):
    with pytest.raises(ValueError, match="run names must be unique"):
        EvaluateConfig(runs=[{"name": "a", "index": "x"}, {"name": "a", "index": "y"}])
    (tmp_path / "q.jsonl").write_text('{"query_id": "1", "text": "a"}\n{"query_id": "2"}\n')
    from pipelines.evaluate.io import read_queries

    with pytest.raises(ValueError, match=r"q\.jsonl: row 2, field 'text': missing"):
        read_queries(tmp_path / "q.jsonl")


def test_evaluate_cli_local_run(setup, evaluated, tmp_path):
    """`--local`: the command line searches in this process (no Ray) and gives the Ray job's numbers."""
    from pipelines.evaluate.cli import main

    base, _ = setup
    (tmp_path / "eval.yaml").write_text(
        "evaluate:\n  qrels_doc_column: product_id\n  relevance_threshold: 2\n"
        f"  runs: [{{name: dense-ivf, index: {base / 'ivf'}, search: {{nprobe: 4}}}}]\n")
    argv = ["--config", str(tmp_path / "eval.yaml"), "--queries", str(base / "queries.parquet"),
            "--qrels", str(base / "qrels.parquet"), "--doc-key", "product_id",
            "--output", str(tmp_path / "out"), "--k", "50", "--metrics", *METRICS, "--local"]
    assert main(argv) == 0
    with open(tmp_path / "out" / "results.csv") as f:
        row = next(csv.DictReader(f))
    job = next(r for r in evaluated["results"] if r["run"] == "dense-ivf")
    assert row["run"] == "dense-ivf" and float(row["recall@50"]) == pytest.approx(job["recall@50"])
    assert (tmp_path / "out" / "dense-ivf.trec").is_file()


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
