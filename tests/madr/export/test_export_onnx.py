"""ONNX export of the query tower: onnxruntime gives the lean torch encoder's outputs.

Tiny random-init BERTs over the session tokenizer (no download). The reference is
`madr.search.query_encoder.LeanQueryEncoder` (what Serve encodes queries with; itself tested equal to
`encode_queries`): dense vectors to 1e-5, and for the hybrid model (paper 002) the same top-k term ids and
weights (1e-5), with batch sizes and lengths other than the ones the graph was exported with. The served
configuration (hybrid, max pooling, top-k) is exported as `export_onnx` does by default; the others skip the
exporter's graph optimiser (`optimize=False`, half the export time; onnxruntime optimises on load either way).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from madr.config import BackboneConfig, ModelConfig
from madr.modeling.model import BiEncoder, build_model
from madr.search.query_encoder import LeanQueryEncoder

pytest.importorskip("onnxruntime")
pytest.importorskip("onnxscript")
from madr.export.onnx import OnnxQueryEncoder, export_onnx  # noqa: E402

TINY = {"hidden_size": 32, "num_hidden_layers": 1, "num_attention_heads": 2, "intermediate_size": 64,
        "max_position_embeddings": 64}


@pytest.fixture(scope="module")
def queries(catalog) -> list[str]:
    qs = [q.text for q in catalog.queries[:30]]
    return qs + [qs[0], "oak", catalog.product_text(catalog.products[0])]  # a duplicate, one word, a truncated one


def tiny(tokenizer, name: str, seed: int = 0, **kw) -> BiEncoder:
    torch.manual_seed(seed)
    cfg = ModelConfig(name=name, backbone=BackboneConfig(tiny=TINY), max_query_length=24, max_doc_length=48, **kw)
    return build_model(cfg, tokenizer).eval()


def assert_same_encoding(model: BiEncoder, path, queries: list[str]) -> None:
    lean, onnx = LeanQueryEncoder(model), OnnxQueryEncoder(model, path)
    for batch_size in (64, 5, 1):
        want_dense, want_sparse = lean.encode(queries, batch_size=batch_size)
        got_dense, got_sparse = onnx.encode(queries, batch_size=batch_size)
        np.testing.assert_allclose(got_dense, want_dense, rtol=0, atol=1e-5, err_msg=f"dense, batch {batch_size}")
        if want_sparse is None:
            assert got_sparse is None
            continue
        assert np.array_equal(got_sparse.indptr, want_sparse.indptr), f"terms per query differ, batch {batch_size}"
        assert np.array_equal(got_sparse.indices, want_sparse.indices), f"top-k term ids differ, batch {batch_size}"
        np.testing.assert_allclose(got_sparse.values, want_sparse.values, rtol=1e-5, atol=1e-5,
                                   err_msg=f"term weights differ, batch {batch_size}")


@pytest.fixture(scope="module")
def dense_graph(tokenizer, tmp_path_factory) -> tuple[BiEncoder, object]:
    """A projected cosine BiBERT and its exported query tower (exported once: an export takes seconds)."""
    model = tiny(tokenizer, "bibert", projection_dim=16)
    return model, export_onnx(model, tmp_path_factory.mktemp("onnx") / "q.onnx", optimize=False)


def test_dense_query_tower(dense_graph, queries):
    assert_same_encoding(*dense_graph, queries)


@pytest.mark.parametrize("pooling, top_k", [("max", 16), ("sum", None)])
def test_hybrid_query_tower_dense_and_sparse(tokenizer, queries, tmp_path, pooling, top_k):
    model = tiny(tokenizer, "hybrid", sparse_pooling=pooling, sparse_top_k=top_k)
    assert_same_encoding(model, export_onnx(model, tmp_path / "q.onnx", optimize=top_k is not None), queries)
    if top_k is not None:
        _, sparse = OnnxQueryEncoder(model, tmp_path / "q.onnx").encode(queries)
        assert np.diff(sparse.indptr).max() == top_k, "the top-k cut did not bind: a weak test"


@pytest.mark.parametrize("name", ["mpbert", "mural"])
def test_aspect_model_query_towers(tokenizer, vocabularies, queries, tmp_path, name):
    """The aspect heads export too: MpBERT (its first-K pooling stays right for texts shorter than K: "oak") and
    MURAL (aspect tokens inserted into the input embeddings). MADRAL and DSSM were checked the same way by hand."""
    torch.manual_seed(0)
    cfg = ModelConfig(name=name, backbone=BackboneConfig(tiny=TINY), max_query_length=24, max_doc_length=48)
    model = build_model(cfg, tokenizer, vocabularies).eval()
    assert_same_encoding(model, export_onnx(model, tmp_path / "q.onnx", optimize=False), queries)


def test_madral_with_a_lean_sparse_head(tokenizer, vocabularies, catalog, queries, tmp_path):
    """MADRAL's unit-length vector and the top-k of a lean sparse head (its decoder rows only; the
    graph maps them back to vocabulary ids)."""
    from madr.modeling.tokenization import corpus_term_ids

    torch.manual_seed(0)
    cfg = ModelConfig(name="madral", backbone=BackboneConfig(tiny=TINY), aspects=catalog.aspect_names,
                      max_query_length=24, max_doc_length=48, sparse_head=True, sparse_top_k=8)
    model = build_model(cfg, tokenizer, vocabularies)
    model.restrict_sparse_terms(corpus_term_ids(tokenizer, [catalog.product_text(p) for p in catalog.products[:200]]))
    assert_same_encoding(model.eval(), export_onnx(model, tmp_path / "q.onnx", optimize=False), queries)


def test_a_graph_of_another_model_kind_is_refused(tokenizer, dense_graph):
    with pytest.raises(ValueError, match="outputs.*hybrid"):
        OnnxQueryEncoder(tiny(tokenizer, "hybrid"), dense_graph[1])
