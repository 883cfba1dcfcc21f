"""The multilingual evaluate stage scores the query tower the Serve app builds (`serve.encoder_backend` /
`encoder_precision`) on the held-out click pairs and through the index, paired with the fp32 tower on the same
items, so the recipe's int8 serving choice is measured where it is made."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from madr.index.build import build_index
from madr.index.encode import encode_documents, encode_queries
from madr.recipes.multitask.config import load_multitask_config
from madr.recipes.multitask.data import build_data
from madr.recipes.multitask.encoders import build_encoder, build_tokenizer
from madr.recipes.multitask.evaluation import click_pair_scores, encoder_metrics
from madr.search.params import SearchParams
from madr.search.sharded import ShardedIndex
from madr.significance import paired_auc_bootstrap
from pipelines.multitask.encode import candidates
from pipelines.multitask.evaluate import served_tower

TINY = {"hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 2, "intermediate_size": 64,
        "max_position_embeddings": 64, "hidden_dropout_prob": 0.0, "attention_probs_dropout_prob": 0.0}
SMALL = {"data": {"click_queries": 40, "click_products": 120, "nli_train": 100, "nli_eval": 60,
                  "parallel_train": 100, "parallel_eval": 120, "parallel_languages": ["de", "ru"]},
         "model": {"backbone": {"tiny": TINY}, "doc_layers": 2, "projection_dim": 16, "max_doc_length": 24,
                   "tokenizer_vocab_size": 600}}


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    torch.manual_seed(0)
    cfg = load_multitask_config(None, {**SMALL, "output_dir": str(tmp_path_factory.mktemp("mt"))})
    data = build_data(cfg)
    model = build_encoder(cfg, build_tokenizer(cfg, data, tmp_path_factory.mktemp("tok")), cfg.seed).eval()
    texts = candidates(data)
    docs, _ = encode_documents(model, texts)
    index = ShardedIndex.open(build_index(docs, np.arange(len(texts)), tmp_path_factory.mktemp("index"), 2))
    params = SearchParams(k=5)
    fp32_ids = index.search(encode_queries(model, [r.source for r in data.parallel_eval])[0], params)[1]
    return cfg, data, model, index, params, fp32_ids


@pytest.mark.parametrize("backend", ["torch", "onnx"])
def test_the_int8_tower_is_scored_against_fp32_on_the_same_pairs_and_sentences(tiny, backend):
    cfg, data, model, index, params, fp32_ids = tiny
    out = served_tower(model, index, params, fp32_ids, data, cfg, backend, "int8", 1)
    assert (out["encoder_backend"], out["encoder_precision"]) == (backend, "int8")
    fp32 = encoder_metrics(model, data, cfg)
    auc = out["click_auc_minus_fp32"]
    assert auc["n"] == len(data.clicks_eval)
    assert auc["diff"] == pytest.approx(out["click"]["click_auc"] - fp32["click_auc"], abs=1e-12), \
        "the paired difference is the served tower's click AUC minus the fp32 tower's"
    assert auc["low"] <= auc["diff"] <= auc["high"]
    assert out["index_top1_minus_fp32"]["n"] == len(data.parallel_eval), "one paired item per held-out sentence"
    for k in cfg.eval.ndcg_at:
        assert out[f"ndcg@{k}_minus_fp32"]["n"] == fp32["click_queries_ranked"]
    assert out["index"]["index_xling_top1"] == pytest.approx(
        np.mean([v for key, v in out["index"].items() if key.startswith("index_xling_top1_")]))


def test_the_fp32_torch_tower_differs_from_the_model_by_nothing(tiny):
    cfg, data, model, index, params, fp32_ids = tiny
    out = served_tower(model, index, params, fp32_ids, data, cfg, "torch", "fp32", 1)
    assert abs(out["click_auc_minus_fp32"]["diff"]) < 1e-3
    assert abs(out["index_top1_minus_fp32"]["diff"]) < 0.02


def test_given_query_vectors_replace_the_models_query_tower(tiny):
    cfg, data, model, *_ = tiny
    clicks, order = data.clicks_eval, cfg.tasks.click.field_order
    own = click_pair_scores(model, clicks, order, 32)
    vectors = encode_queries(model, [r.query for r in clicks])[0]
    assert np.allclose(click_pair_scores(model, clicks, order, 32, query_vectors=vectors), own, atol=1e-5)
    flipped = click_pair_scores(model, clicks, order, 32, query_vectors=-vectors)
    assert np.allclose(flipped, -own, atol=1e-5), "the given vectors, not the model's, score the pairs"


def test_paired_auc_bootstrap_by_hand():
    labels = np.array([i % 2 for i in range(40)], float)
    same = paired_auc_bootstrap(labels, labels, labels > 0, draws=200)
    assert same["diff"] == 0.0 and same["p_bootstrap"] == 1.0
    better = paired_auc_bootstrap(labels, -labels, labels > 0, draws=200)
    assert better["diff"] == pytest.approx(1.0) and better["low"] > 0.9 and better["p_bootstrap"] < 0.01
