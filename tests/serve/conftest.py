"""A tiny hybrid model and a 3-shard index of the session catalog, written to disk like the encode job does:
what the serving tests deploy. Random-init tiny BERT (no download); 400 products, Flat shards + sparse.

Serve's controller kills an HTTP proxy that is not ready within 5 s of its start (then 10 s, ...); on a busy
2-core machine a proxy can take longer than that, and `serve.start` fails before a test begins. The serving
tests give it a minute (set before the session's Ray starts; its processes inherit the environment)."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest
import torch
from serve_helpers import ID_OFFSET, ID_STEP, TINY, docs_table

from madr.config import BackboneConfig, ModelConfig

os.environ.setdefault("RAY_SERVE_PROXY_READY_CHECK_TIMEOUT_S", "60")


@pytest.fixture(scope="session")
def served_index(catalog, tokenizer, tmp_path_factory) -> dict:
    """{model, model_dir, manifest, ids, docs (pa.Table), queries}: the saved model and its 3-shard index."""
    from madr.index import build_index
    from madr.modeling.model import BiEncoder, build_model
    from madr.search.hybrid import encode_corpus

    root: Path = tmp_path_factory.mktemp("served")
    torch.manual_seed(0)
    cfg = ModelConfig(name="hybrid", backbone=BackboneConfig(tiny=TINY), sparse_top_k=24, max_query_length=24,
                      max_doc_length=48, hybrid_lambda=0.4)
    build_model(cfg, tokenizer).save(root / "model")
    model = BiEncoder.load(root / "model").eval()
    ids = np.arange(len(catalog.products), dtype=np.int64) * ID_STEP + ID_OFFSET
    corpus = encode_corpus(model, [catalog.product_text(p) for p in catalog.products], ids, batch_size=128)
    docs = docs_table(catalog, ids)
    manifest = build_index(corpus.dense, ids, root / "index", num_shards=3, index_factory="Flat",
                           sparse=corpus.sparse, hybrid_lambda=cfg.hybrid_lambda, model_dir=str(root / "model"), docs=docs)
    queries = [q.text for q in catalog.queries[:12]]
    return {"model": model, "model_dir": root / "model", "manifest": Path(manifest), "ids": ids, "docs": docs,
            "queries": queries}
