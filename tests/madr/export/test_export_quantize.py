"""Int8 towers (`madr.export.quantize`): dynamic int8 quantisation of the Linear layers in torch
and in onnxruntime keeps the fp32 vectors' directions, and leaves the float model as it was.

Tiny random-init BERTs over the session tokenizer (no download), cosine models: each int8 vector against the
fp32 `LeanQueryEncoder`'s vector of the same text. Tolerance: cosine >= 0.999 for every text and >= 0.9995 on
average (measured on this model: >= 0.99999 in both backends; random-init weights are easy to round, real ones
less so: benchmarks/RESULTS.md, "Int8 multilingual-e5-small"); the vectors must also differ from fp32's, or
nothing was quantised.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from madr.config import BackboneConfig, ModelConfig
from madr.export.quantize import (
    Int8QueryEncoder,
    check_precision,
    count_int8_linears,
    cpu_has_int8_dot,
    int8_encoder,
    quantize_linear_int8,
)
from madr.modeling.model import BiEncoder, build_model
from madr.search.query_encoder import LeanQueryEncoder

TINY = {
    "hidden_size": 64,
    "num_hidden_layers": 2,
    "num_attention_heads": 2,
    "intermediate_size": 128,
    "max_position_embeddings": 64,
}
MIN_COSINE, MEAN_COSINE = 0.999, 0.9995


@pytest.fixture(scope="module")
def texts(catalog) -> list[str]:
    return [q.text for q in catalog.queries[:24]] + [catalog.product_text(p) for p in catalog.products[:8]]


@pytest.fixture(scope="module")
def model(tokenizer) -> BiEncoder:
    torch.manual_seed(0)
    cfg = ModelConfig(
        name="bibert",
        backbone=BackboneConfig(tiny=TINY),
        pooling="mean",
        max_query_length=24,
        max_doc_length=48,
    )
    return build_model(cfg, tokenizer).eval()


def cosines(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    a = a / np.linalg.norm(a, axis=1, keepdims=True)
    b = b / np.linalg.norm(b, axis=1, keepdims=True)
    return (a * b).sum(axis=1)


def assert_close_directions(got: np.ndarray, want: np.ndarray) -> None:
    cos = cosines(got, want)
    assert cos.min() >= MIN_COSINE and cos.mean() >= MEAN_COSINE, f"int8 vs fp32 cosine min {cos.min():.4f}"
    assert not np.allclose(got, want, atol=1e-6), (
        "the int8 vectors equal fp32 bit for bit: nothing was quantised"
    )


@pytest.mark.parametrize("side, per_channel", [("query", False), ("doc", False), ("query", True)])
def test_torch_int8_vectors_agree_with_fp32(model, texts, side, per_channel):
    want, _ = LeanQueryEncoder(model, side=side).encode(texts)
    encoder = Int8QueryEncoder(model, side=side, per_channel=per_channel)
    scheme = encoder.tower.backbone.encoder.layer[0].attention.self.query.weight().qscheme()
    assert scheme == (torch.per_channel_affine if per_channel else torch.per_tensor_affine)
    assert count_int8_linears(encoder.tower) == 2 * 6 + 1, (
        "Q, K, V, attention out, FFN in / out per layer, pooler"
    )
    for batch_size in (64, 1):
        got, _ = encoder.encode(texts, batch_size=batch_size)
        assert_close_directions(got, want)


def test_the_float_model_is_left_alone_and_shares_its_tables(model, texts):
    before, _ = LeanQueryEncoder(model).encode(texts)
    tower = quantize_linear_int8(model.query_tower)
    assert count_int8_linears(model.query_tower) == 0, "quantised the original in place"
    assert tower.word_embeddings.data_ptr() == model.query_tower.word_embeddings.data_ptr(), (
        "word table copied"
    )
    after, _ = LeanQueryEncoder(model).encode(texts)
    np.testing.assert_array_equal(after, before)


@pytest.mark.parametrize("per_channel", [False, True])
def test_onnx_int8_vectors_agree_with_fp32(model, texts, tmp_path, per_channel):
    pytest.importorskip("onnxruntime")
    pytest.importorskip("onnxscript")
    from madr.export.quantize import onnx_int8_encoder

    want, _ = LeanQueryEncoder(model).encode(texts)
    encoder = onnx_int8_encoder(model, "query", workdir=tmp_path, per_channel=per_channel)
    assert (tmp_path / "query.int8.onnx").stat().st_size < 0.8 * (tmp_path / "query.onnx").stat().st_size
    assert _largest_int8_weight(tmp_path / "query.int8.onnx") == (127 if cpu_has_int8_dot() else 64), \
        "7-bit weights exactly where onnxruntime's u8s8 kernels would saturate (no VNNI)"
    for batch_size in (64, 5, 1):
        got, _ = encoder.encode(texts, batch_size=batch_size)
        assert_close_directions(got, want)


def _largest_int8_weight(path) -> int:
    import onnx
    from onnx import numpy_helper

    graph = onnx.load(str(path)).graph
    return max(int(np.abs(numpy_helper.to_array(t).astype(np.int32)).max()) for t in graph.initializer
               if t.data_type == onnx.TensorProto.INT8 and len(t.dims) == 2)


def test_bad_settings_are_refused(model):
    with pytest.raises(ValueError, match="precision must be one of fp32, int8, got 'int4'"):
        check_precision("int4")
    with pytest.raises(ValueError, match="backend must be one of torch, onnx, got 'tensorrt'"):
        int8_encoder(model, "tensorrt")
    with pytest.raises(ValueError, match="term_ids"):
        int8_encoder(model, "torch", term_ids=[1, 2, 3])  # a dense model has no sparse rows to project
    with pytest.raises(ValueError, match="whole vocabulary"):
        int8_encoder(model, "onnx", term_ids=[1, 2, 3])
