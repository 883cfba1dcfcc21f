"""The README's main job at a small size: a `ray start --head` cluster on loopback, every stage submitted to
it through the job API (`ray job submit`), the Serve app deployed with `serve deploy`, and sample queries
answered over real HTTP. The same code path and recipe as `make demo` (configs/demo.yaml: BiBERT fine-tuned with
BM25-mined negatives, no pretraining, a BM25 part fused as tuned on dev, the untrained encoder as a reference),
with a tiny random backbone and a few steps."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow.parquet as pq
import pytest
import yaml

from madr.index import Manifest
from pipelines import demo
from pipelines.jobs.local_cluster import free_port

ROOT = Path(__file__).resolve().parents[2]
# e2e: `make test` leaves it out (2+ minutes); .ci/run runs it as its own required step (`pytest -m e2e`)
pytestmark = [pytest.mark.ray, pytest.mark.slow, pytest.mark.e2e]
STAGES = ("data", "finetune", "aspects", "encode", "tune", "baseline", "evaluate")  # pretrain: not in the recipe


def tiny_experiment(out: Path) -> dict:
    step = {"steps": 12, "batch_size": 16, "learning_rate": 1.0e-3, "log_every": 4, "validate_every": 0,
            "checkpoint_every": 0}
    return {"name": "e2e", "output_dir": str(out),
            "data": {"synthetic_products": 300, "synthetic_queries": 120, "seed": 0, "languages": ["en", "de"]},
            "model": {"name": "bibert", "backbone": {"name_or_path": None}, "shared_towers": True, "pooling": "mean",
                      "text_prefixes": {"query": "query: ", "doc": "passage: "}, "similarity": "cosine",
                      "max_query_length": 16, "max_doc_length": 32},
            "train": {"pretrain": {"steps": 0},
                      "finetune": {**step, "aspect_weight": 0.0, "negatives": "mined", "mined_depth": 30,
                                   "freeze_word_embeddings": True, "freeze_layers": 1},
                      "aspects": {"epochs": 3}},
            "distributed": {"backend": "ddp", "num_workers": 2, "cpus_per_worker": 0.5, "max_failures": 0,
                            "runtime_env": {"env_vars": {"TOKENIZERS_PARALLELISM": "false"}}},  # + the job's env
            "index": {"num_shards": 2, "index_factory": "Flat", "lexical": "bm25", "model_stage": "aspects"},
            "tune": {"lambda_step": 0.25}, "eval": {"references": ["bm25", "dense", "untrained"]}}


def test_demo_flow_submits_every_stage_and_answers_over_http(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(ROOT)  # jobs on a same-host cluster run in this checkout
    config = tmp_path / "e2e.yaml"
    config.write_text(yaml.safe_dump(tiny_experiment(tmp_path / "out")))

    assert demo.run_demo(str(config), port=free_port(), num_cpus=2) == 0
    out = capsys.readouterr().out

    for stage in STAGES:  # each stage ran as a Ray job and recorded it
        marker = json.loads((tmp_path / "out" / "_stages" / f"{stage}.done.json").read_text())
        assert marker["ray_job"] and marker["ray_job"].startswith(f"madr-{stage}-"), stage
        assert f"[madr.jobs] {stage}: {marker['ray_job']} SUCCEEDED" in out
    assert "[madr.jobs] deploy: {'madr': 'RUNNING'}" in out
    skipped = json.loads((tmp_path / "out" / "_stages" / "pretrain.done.json").read_text())
    assert skipped["skipped"] and skipped["ray_job"] is None, "a stage the recipe leaves out submits no job"
    assert "[madr.jobs] pretrain: not in this recipe (train.pretrain.steps is 0)" in out

    data = tmp_path / "out" / "data"
    assert json.loads((data / "catalog" / "prepared.json").read_text())["counts"]["products"] == 300
    manifest = Manifest.load(tmp_path / "out" / "index" / "manifest.json")
    assert manifest.num_docs == 300 and len(manifest.shards) == 2
    assert Path(manifest.model_dir).resolve() == (tmp_path / "out" / "aspects" / "model").resolve()
    assert manifest.aspects is not None and manifest.aspects["calibrated"]  # the recipe's model explains
    results = (tmp_path / "out" / "evaluation" / "results.md").read_text()
    assert results.startswith("| run | index | queries | recall@10") and results in out
    assert [line.split(" | ")[0] for line in results.splitlines()[2:]] == [
        "| bibert", "| bm25", "| bibert-dense", "| untrained+bm25"]
    chosen = json.loads((tmp_path / "out" / "tune" / "fusion.json").read_text())
    assert manifest.fusion == (chosen["lam"], chosen["normalisation"]), "the tune stage's choice is what is served"
    assert len(chosen["grid"]) == 5 * 2 and (tmp_path / "out" / "tune" / "fusion.png").is_file()
    baseline = Manifest.load(tmp_path / "out" / "baseline" / "index" / "manifest.json")  # the untrained reference
    assert Path(baseline.model_dir).resolve() == (tmp_path / "out" / "baseline" / "model").resolve()
    assert baseline.num_docs == 300 and baseline.has_lexical
    assert baseline.fusion == tuple(json.loads((tmp_path / "out" / "baseline" / "tune" / "fusion.json").read_text())[k]
                                    for k in ("lam", "normalisation")), "its own fusion, tuned on dev"

    queries = pq.read_table(data / "eval" / "queries.parquet").to_pylist()
    languages = sorted({q["language"] for q in queries})
    assert languages == ["de", "en"]
    for q in (next(q for q in queries if q["language"] == lang) for lang in languages):
        request = f"/search  {json.dumps({'query': q['text'], 'k': 3}, ensure_ascii=False)}"
        assert request in out, f"no HTTP answer for {q['text']!r}"
    titles = set(pq.read_table(data / "catalog" / "products.parquet").column("title").to_pylist())
    hits = [line for line in out.splitlines() if line.startswith("  1. ")]
    assert len(hits) == len(languages)  # a first hit for every sample query, a product of the corpus
    assert all(line.split("  ")[2] in titles for line in hits), hits
    assert "/explain  query" in out and '"bm25"' in out, "the explanation has the BM25 part's score and pieces"
