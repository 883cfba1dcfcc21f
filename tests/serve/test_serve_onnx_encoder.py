"""Serving the query tower through onnxruntime (`ServeSettings.encoder_backend: onnx`), without
Ray: the in-process backend and the Ray deployment build the same ONNX encoder (`serve.backend.query_encoder`),
and the served answers (ids and scores of every query, the vectors they came from) equal the torch backend's."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

from madr.search.params import SearchParams
from serve.backend import LocalBackend, query_encoder
from serve.config import ServeSettings

pytest.importorskip("onnxruntime")
pytest.importorskip("onnxscript")
from madr.export.onnx import OnnxQueryEncoder  # noqa: E402


@pytest.fixture(scope="module")
def backends(served_index) -> dict[str, LocalBackend]:
    return {"torch": LocalBackend(served_index["manifest"]),
            "onnx": LocalBackend(served_index["manifest"], encoder_backend="onnx")}


def test_onnx_backend_serves_the_same_answers(backends, served_index):
    assert isinstance(backends["onnx"].encoder, OnnxQueryEncoder)
    assert not isinstance(backends["torch"].encoder, OnnxQueryEncoder)
    for q in served_index["queries"]:
        got, want = (asyncio.run(backends[b].encode(q)) for b in ("onnx", "torch"))
        np.testing.assert_allclose(got.dense, want.dense, rtol=0, atol=1e-5, err_msg=q)
        assert np.array_equal(got.sparse.indices, want.sparse.indices), f"{q}: term ids differ"
        np.testing.assert_allclose(got.sparse.values, want.sparse.values, rtol=1e-5, atol=1e-5, err_msg=q)
        (got_s, got_ids), (want_s, want_ids) = (asyncio.run(backends[b].search(e, SearchParams(k=10)))
                                                for b, e in (("onnx", got), ("torch", want)))
        assert np.array_equal(got_ids, want_ids), f"{q}: served ids differ"
        np.testing.assert_allclose(got_s, want_s, rtol=1e-5, atol=1e-5, err_msg=f"{q}: served scores differ")


def test_settings_and_deployment_construction(backends, served_index, tmp_path):
    assert ServeSettings().encoder_backend == "torch", "onnx must be opt-in"
    with pytest.raises(ValueError, match="encoder_backend must be one of"):
        ServeSettings(encoder_backend="tensorrt")
    with pytest.raises(ValueError, match="encoder_index_vocabulary needs the torch encoder"):
        ServeSettings(encoder_backend="onnx", encoder_index_vocabulary=True)
    with pytest.raises(ValueError, match="whole vocabulary"):  # what the Ray QueryEncoder would be asked
        query_encoder(backends["torch"].model, served_index["manifest"], backend="onnx")
