"""The served query encoding without Ray: the in-process backend encodes with
`madr.search.query_encoder.LeanQueryEncoder`, whose vectors equal the offline `encode_queries` (so served results
are unchanged), never switches the model's mode per request, and with `encoder_index_vocabulary` projects the
queries onto the terms the index's shards hold."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

from madr.index.encode import encode_queries
from madr.search.params import SearchParams
from madr.search.query_encoder import LeanQueryEncoder
from madr.search.sharded import ShardedIndex, sparse_term_ids
from serve.backend import LocalBackend, encode_texts, query_encoder


@pytest.fixture(scope="module")
def backends(served_index) -> dict[str, LocalBackend]:
    return {"full": LocalBackend(served_index["manifest"]),
            "index": LocalBackend(served_index["manifest"], index_vocabulary=True)}


def test_served_vectors_equal_the_offline_encoding(backends, served_index):
    backend = backends["full"]
    assert isinstance(backend.encoder, LeanQueryEncoder) and backend.encoder.terms is None
    queries = served_index["queries"]
    dense, sparse = encode_queries(served_index["model"], queries)
    for i, q in enumerate(queries):
        got = asyncio.run(backend.encode(q))
        np.testing.assert_allclose(got.dense, dense[i], rtol=1e-5, atol=1e-6, err_msg=q)
        assert np.array_equal(got.sparse.indices, sparse.row(i)[0]), f"{q}: term ids differ"
        np.testing.assert_allclose(got.sparse.values, sparse.row(i)[1], rtol=1e-5, atol=1e-5, err_msg=q)


def test_requests_switch_no_mode(backends, served_index):
    backend = backends["full"]
    model = backend.model
    calls = []
    original = model.train
    model.train = lambda mode=True: calls.append(mode) or original(mode)  # eval() goes through train(False)
    try:
        for q in served_index["queries"][:5]:
            asyncio.run(backend.encode(q))
        encode_texts(backend.encoder, served_index["queries"][:5])
    finally:
        del model.train
    assert calls == [] and not model.training, f"mode switches per request: {calls}"


def test_index_vocabulary_projection_is_served(backends, served_index):
    backend = backends["index"]
    terms = ShardedIndex.open(served_index["manifest"]).sparse_term_ids()
    assert np.array_equal(sparse_term_ids(served_index["manifest"]), terms)
    special = backend.model.tokenizer.all_special_ids
    assert np.array_equal(backend.encoder.terms.numpy(), np.setdiff1d(terms, special))
    deployed = query_encoder(backend.model, served_index["manifest"])  # what the Ray QueryEncoder builds
    assert np.array_equal(deployed.terms.numpy(), backend.encoder.terms.numpy())
    assert query_encoder(backend.model).terms is None
    full = encode_queries(served_index["model"], served_index["queries"])[1]
    for i, q in enumerate(served_index["queries"]):
        got = asyncio.run(backend.encode(q)).sparse
        assert np.isin(got.indices, terms).all(), f"{q}: a term the index does not hold"
        ref_ids, _ = full.row(i)
        assert np.isin(ref_ids[np.isin(ref_ids, terms)], got.indices).all(), f"{q}: lost an index term"
        _, ids = asyncio.run(backend.search(asyncio.run(backend.encode(q)), SearchParams(k=5)))
        assert (ids >= 0).any(), f"{q}: no results"
