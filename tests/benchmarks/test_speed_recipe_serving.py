"""benchmarks.speed.recipe_serving at tiny scale: a pipeline run's layout made by hand (a tiny mean-pooled BiBERT with
e5 prefixes and shared towers as the fine-tuned model, the encode job's index with a BM25 part over a tokenizer of
its own, the tune stage's fusion recorded, test queries), scaled to 2,000 documents, served by the deploy stage's
Serve app of the co-located config on the replica's own port (the reported setup: one replica, so the quickest to
start) and the hand-built FastAPI peer, one level of 0.5 s: the JSON has both apps' numbers and the top-10 agreement
check. A multilingual run (the data stage's sets, its index of held-out English candidates, no BM25 part) is served
the same way, dense alone on both sides, under the queries of its held-out click pairs."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]
TINY = {"hidden_size": 32, "num_hidden_layers": 1, "num_attention_heads": 2, "intermediate_size": 64,
        "max_position_embeddings": 64}
LAM, NORMALISATION = 0.4, "zscore"


def make_run(catalog, tokenizer, run: Path) -> Path:
    """`run` laid out as the product-search pipeline leaves it: finetune/model, index/ (2 Flat shards + BM25,
    fusion recorded), data/eval/queries.parquet."""
    from madr.config import BackboneConfig, ModelConfig
    from madr.encode_config import EncodeConfig
    from madr.index.manifest import record_fusion
    from madr.modeling.model import build_model
    from madr.modeling.tokenization import train_wordpiece_tokenizer
    from pipelines.encode.job import run_encode

    torch.manual_seed(0)
    cfg = ModelConfig(name="bibert", pooling="mean", backbone=BackboneConfig(tiny=TINY), shared_towers=True,
                      similarity="cosine", max_query_length=24, max_doc_length=48,
                      text_prefixes={"query": "query: ", "doc": "passage: "})
    build_model(cfg, tokenizer).save(run / "finetune" / "model")
    products = catalog.products
    ids = np.arange(len(products), dtype=np.int64) * 3 + 5
    texts = [catalog.product_text(p) for p in products]
    (run / "data" / "corpus").mkdir(parents=True)
    pq.write_table(pa.table({"doc_id": ids, "product_id": [f"p{i}" for i in ids.tolist()], "text": texts,
                             "title": [p.title for p in products]}), run / "data" / "corpus" / "docs.parquet")
    train_wordpiece_tokenizer(texts, vocab_size=300, out_dir=str(run / "lexical_tok"))
    run_encode(EncodeConfig(input=[str(run / "data" / "corpus")], output=str(run / "index"),
                            model_dir=str(run / "finetune" / "model"), text_columns=["text"],
                            display_columns=["title"], external_id_column="product_id", num_shards=2,
                            rows_per_read=100, lexical="bm25", lexical_tokenizer=str(run / "lexical_tok")),
               log=lambda _: None, local=True)
    record_fusion(run / "index" / "manifest.json", LAM, NORMALISATION)
    (run / "data" / "eval").mkdir(parents=True)
    queries = catalog.queries[:60]
    pq.write_table(pa.table({"query_id": [f"q{i}" for i in range(len(queries))], "text": [q.text for q in queries]}),
                   run / "data" / "eval" / "queries.parquet")
    return run


@pytest.mark.slow
def test_recipe_serving_smoke(catalog, tokenizer, tmp_path):
    run = make_run(catalog, tokenizer, tmp_path / "run")
    cmd = [sys.executable, "-m", "benchmarks.speed.recipe_serving", "--run", str(run), "--docs", "2000",
           "--serve-config", "serve/serve_config_colocated.yaml", "--direct-ingress", "--duration", "0.5",
           "--warmup", "0.2", "--concurrency", "2", "--check-queries", "10", "--peer-threads", "1",
           "--cache", str(tmp_path / "cache"), "--out-dir", str(tmp_path), "--tag", "smoke"]
    done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-5000:]
    result = json.loads((tmp_path / "results" / "smoke.json").read_text())
    assert result["docs"] == 2000 and result["index"]["real_docs"] == len(catalog.products)
    assert (result["index"]["fusion_lambda"], result["index"]["normalisation"]) == (LAM, NORMALISATION)
    assert (result["topology"], result["ingress"]) == ("colocated", "direct")  # the config's, the replica's port
    for app in ("madr", "peer"):
        r = result["results"][app]["2"]
        assert r["n"] > 0 and r["errors"] == 0 and r["qps"] > 0 and r["p50_ms"] <= r["p99_ms"]
        assert set(r["inside_p50_ms"]) == {"encode", "search", "docs"}
        a = result["agreement"][app]
        assert a["queries"] == 10 and a["overlap"] >= 0.9, a
    assert result["agreement"]["madr"]["identical"] == 1.0  # served = offline
    assert set(result["ratios"]["2"]) == {"p50", "p99", "qps"}


def make_multilingual_run(run: Path) -> Path:
    """`run` as the multilingual pipeline leaves it (configs/multilingual.yaml): the data stage's sets and untrained
    encoder, the encode job's index of the held-out English candidates through that encoder; its config file with
    the fp32 torch query tower (so the served top 10 is the offline one)."""
    import yaml

    from pipelines.multitask.config import load_pipeline_config
    from pipelines.multitask.data import read_data_stage
    from pipelines.multitask.encode import run_index
    from pipelines.multitask.run import data_stage

    data = yaml.safe_load((ROOT / "configs" / "multilingual.yaml").read_text())
    data.update(output_dir=str(run), serve={"encoder_backend": "torch", "encoder_precision": "fp32"})
    config = run.parent / "multilingual.yaml"
    run.mkdir(parents=True)
    config.write_text(yaml.safe_dump(data))
    cfg = load_pipeline_config(config)
    data_stage(cfg, log=lambda _: None)
    stage = read_data_stage(cfg)
    run_index(stage.init_model, stage.sets, cfg.index, cfg.output_dir, log=lambda _: None, local=True)
    return config


@pytest.mark.slow
def test_multilingual_recipe_serving_smoke(tmp_path):
    config = make_multilingual_run(tmp_path / "run")
    cmd = [sys.executable, "-m", "benchmarks.speed.recipe_serving", "--run", str(tmp_path / "run"), "--config",
           str(config), "--docs", "2000", "--serve-config", "serve/serve_config_colocated.yaml", "--direct-ingress",
           "--duration", "0.5", "--warmup", "0.2", "--concurrency", "2", "--check-queries", "10",
           "--cache", str(tmp_path / "cache"), "--out-dir", str(tmp_path), "--tag", "smoke"]
    done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-5000:]
    result = json.loads((tmp_path / "results" / "smoke.json").read_text())
    assert result["docs"] == 2000 and 0 < result["index"]["real_docs"] < 2000
    assert result["index"]["fusion_lambda"] is None, "no BM25 part: dense alone on both sides"
    for app in ("madr", "peer"):
        r = result["results"][app]["2"]
        assert r["n"] > 0 and r["errors"] == 0 and r["qps"] > 0
        assert result["agreement"][app]["overlap"] >= 0.9, result["agreement"][app]
    assert result["agreement"]["madr"]["identical"] == 1.0  # served = offline
