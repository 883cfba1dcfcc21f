"""The lean sparse head from a config alone: `model.sparse_head: true` in an experiment gives a
model whose MLM decoder holds the catalog's word pieces only, in the in-process experiment (`run_experiment`) and
in the Ray training job's starting model (`pipelines.train.job`), and the saved model keeps those terms."""

from __future__ import annotations

from pathlib import Path

import torch

from madr.config import load_config
from madr.modeling.model import BiEncoder
from madr.modeling.tokenization import corpus_term_ids
from madr.recipes.aspects.experiment import (
    build_catalog_model,
    load_catalog,
    prepare_tokenizer,
    prepare_vocabularies,
    run_experiment,
)

CONFIG = Path(__file__).resolve().parents[4] / "configs" / "train_tiny.yaml"
TINY = {"hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 2, "intermediate_size": 64,
        "max_position_embeddings": 64}


def _config(out: Path, **overrides):
    base = {"output_dir": str(out), "data.synthetic_products": 200, "data.synthetic_queries": 100,
            "data.tokenizer_vocab_size": 1500, "model.backbone.tiny": TINY, "model.projection_dim": 16,
            "model.max_query_length": 16, "model.max_doc_length": 32, "model.sparse_head": True,
            "model.sparse_top_k": 16, "train.pretrain.steps": 0, "train.finetune.steps": 3,
            "train.finetune.batch_size": 8}
    return load_config(CONFIG, {**base, **overrides})


def _catalog_terms(cfg) -> tuple[list[int], set[int]]:
    catalog = load_catalog(cfg)
    tokenizer = prepare_tokenizer(cfg, catalog)
    pieces = corpus_term_ids(tokenizer, [catalog.product_text(p) for p in catalog.products])
    return pieces, set(pieces) - set(tokenizer.all_special_ids)


def test_a_sparse_head_model_keeps_the_catalogs_pieces_and_others_are_untouched(tmp_path):
    cfg = _config(tmp_path)
    catalog = load_catalog(cfg)
    tokenizer = prepare_tokenizer(cfg, catalog)
    vocab = prepare_vocabularies(cfg, catalog, tokenizer)
    _, kept = _catalog_terms(cfg)
    model = build_catalog_model(cfg.model, catalog, tokenizer, vocab)
    assert model.config.sparse_vocab_size == len(kept) < len(tokenizer)
    for tower in model.towers():
        assert set(tower.sparse_ids.tolist()) == kept
    with torch.no_grad():  # no weight outside the catalog's pieces, on a query that has other pieces
        q = model.eval().encode(*model.tokenize(["zzzz qqqq white nike socks"], "query").values(), "query")
    outside = torch.ones(len(tokenizer), dtype=torch.bool)
    outside[sorted(kept)] = False
    assert q.sparse is not None and float(q.sparse[0, outside].abs().sum()) == 0.0
    plain = build_catalog_model(_config(tmp_path, **{"model.sparse_head": False}).model, catalog, tokenizer, vocab)
    assert plain.config.sparse_vocab_size is None and not plain.config.has_sparse


def test_run_experiment_and_the_train_jobs_start_save_the_lean_head(tmp_path):
    from pipelines.train.job import _starting_model

    cfg = _config(tmp_path / "exp")
    _, kept = _catalog_terms(cfg)
    result = run_experiment(cfg, progress=False)
    trained = BiEncoder.load(result.model_dir)
    assert trained.config.sparse_vocab_size == len(kept)
    assert set(trained.query_tower.sparse_ids.tolist()) == kept
    job_cfg = _config(tmp_path / "job")
    start = BiEncoder.load(_starting_model(job_cfg, "finetune", load_catalog(job_cfg), tmp_path / "job" / "finetune"))
    assert start.config.sparse_vocab_size == len(kept)
    assert set(start.doc_tower.sparse_ids.tolist()) == kept
