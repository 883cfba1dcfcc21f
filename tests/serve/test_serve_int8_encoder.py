"""Serving an int8 query tower (`ServeSettings.encoder_precision: int8`), without Ray: the in-process
backend builds the int8 encoder of either backend (`serve.backend.query_encoder`, what the Ray deployment calls
too) and serves what fp32 serves, on the tiny hybrid index of `served_index`:

- dense vectors: cosine >= 0.999 to fp32's, and the dense-only answers (lam = 1) have the same top-10 ids in
  the same order for every query;
- sparse rows: >= 90% of each query's top-k terms shared with fp32's. Exact equality is not asked: the
  random-init MLM weights of a query's 24 kept terms all lie within ~0.2 of each other, so int8 rounding swaps a
  term at the top-k cut now and then (1 term in 4 of 12 queries here), and the near-tied hybrid scores of a random
  model then reorder; what int8 does to real rankings is measured in benchmarks/RESULTS.md, "Int8
  multilingual-e5-small";

and bad settings are refused."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

from madr.export.quantize import Int8QueryEncoder
from madr.search.params import SearchParams
from serve.backend import LocalBackend, query_encoder
from serve.config import ServeSettings


def cosine(a: np.ndarray, b: np.ndarray) -> float:
    return float(a @ b / (np.linalg.norm(a) * np.linalg.norm(b)))


@pytest.mark.parametrize("backend", ["torch", "onnx"])
def test_int8_backend_serves_the_same_top_results(served_index, backend):
    if backend == "onnx":
        pytest.importorskip("onnxruntime")
        pytest.importorskip("onnxscript")
    fp32 = LocalBackend(served_index["manifest"])
    int8 = LocalBackend(served_index["manifest"], encoder_backend=backend, encoder_precision="int8")
    assert isinstance(int8.encoder, Int8QueryEncoder) == (backend == "torch")
    dense_only = SearchParams(k=10, lam=1.0)
    for q in served_index["queries"]:
        got, want = asyncio.run(int8.encode(q)), asyncio.run(fp32.encode(q))
        assert cosine(got.dense.ravel(), want.dense.ravel()) >= 0.999, q
        shared = set(got.sparse.indices) & set(want.sparse.indices)
        assert len(shared) >= 0.9 * len(want.sparse.indices), f"{q}: top-k terms differ"
        (got_s, got_ids), (want_s, want_ids) = (
            asyncio.run(b.search(e, dense_only)) for b, e in ((int8, got), (fp32, want))
        )
        assert np.array_equal(got_ids, want_ids), f"{q}: int8 dense top-10 differs from fp32"
        np.testing.assert_allclose(got_s, want_s, rtol=0, atol=0.01, err_msg=f"{q}: dense scores moved")


def test_bad_precision_settings_are_refused(served_index):
    assert ServeSettings().encoder_precision == "fp32", "int8 must be opt-in"
    ServeSettings(encoder_precision="int8", encoder_backend="onnx")
    with pytest.raises(ValueError, match="encoder_precision must be one of fp32, int8, got 'int4'"):
        ServeSettings(encoder_precision="int4")
    with pytest.raises(ValueError, match="precision must be 'fp32' or 'int8', got 'fp16'"):
        query_encoder(served_index["model"], precision="fp16")


def test_the_ray_query_encoder_gets_the_precision(served_index):
    """The arguments the co-located replica and the fan-out `QueryEncoder` deployment are built with
    (`serve.colocated.encoder_args`, positional like `serve.app.build_app`'s bind) carry `encoder_precision`."""
    from madr.index.manifest import Manifest
    from serve.colocated import encoder_args
    from serve.deployments import QueryEncoder

    manifest = served_index["manifest"]
    settings = ServeSettings(
        manifest_path=str(manifest), model_dir=str(served_index["model_dir"]), encoder_precision="int8"
    )
    replica = QueryEncoder.func_or_class(*encoder_args(settings, Manifest.load(manifest)))
    assert isinstance(replica.encoder, Int8QueryEncoder)
