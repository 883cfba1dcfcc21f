"""Every searcher is a `madr.search.protocol.Searcher` taking one `SearchParams`, and each one's top-k equals the
brute-force reference (`madr.search.exact.ExactSearcher`) on a small synthetic set: FAISS Flat shards (dense and
hybrid with exhaustive candidates), the sparse inverted index, BM25 and the HybridSearcher."""

from __future__ import annotations

import numpy as np
import pytest

from madr.index import build_index
from madr.search.exact import ExactSearcher
from madr.search.hybrid import EncodedCorpus, EncodedTexts, HybridSearcher
from madr.search.params import SearchParams, resolve
from madr.search.protocol import PAD_ID, Searcher
from madr.search.sharded import ShardedIndex, load_shard
from madr.search.sparse import BM25Index, InvertedIndex, SparseBatch

N, Q, D, V, K = 240, 9, 12, 40, 10


def _sparse(rng: np.random.Generator, n: int, terms: int) -> SparseBatch:
    pairs = [(np.sort(rng.choice(V, terms, replace=False)), rng.uniform(0.1, 2.0, terms)) for _ in range(n)]
    return SparseBatch.from_pairs(pairs, vocab_size=V)


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    rng = np.random.default_rng(0)
    dense = rng.standard_normal((N, D)).astype(np.float32)
    ids = rng.permutation(N).astype(np.int64) * 3 + 5  # global ids are neither row numbers nor sorted
    q = rng.standard_normal((Q, D)).astype(np.float32)
    docs, queries = _sparse(rng, N, 12), _sparse(rng, Q, 10)
    path = build_index(dense, ids, tmp_path_factory.mktemp("index"), num_shards=3, sparse=docs, hybrid_lambda=0.4)
    words = [f"w{i}" for i in range(30)]
    texts = [list(rng.choice(words, int(rng.integers(3, 12)))) for _ in range(N)]
    return {"dense": dense, "ids": ids, "q": q, "docs": docs, "queries": queries, "path": path, "texts": texts,
            "token_queries": [list(rng.choice(words, 4)) for _ in range(Q)],
            "exact": ExactSearcher(dense, ids, docs, hybrid_lambda=0.4)}


def _same(got, want, what: str) -> None:
    scores, ids = got
    assert scores.shape == ids.shape == want[1].shape and scores.dtype == np.float32 and ids.dtype == np.int64, what
    np.testing.assert_array_equal(ids, want[1], err_msg=what)
    np.testing.assert_allclose(scores, want[0], rtol=1e-5, atol=1e-5, err_msg=what)


def test_every_searcher_satisfies_the_protocol(data):
    bm25 = BM25Index().fit(data["texts"])
    searchers = [data["exact"], ShardedIndex.open(data["path"]), load_shard(data["path"], 0),
                 InvertedIndex.build(data["docs"], data["ids"]), bm25,
                 HybridSearcher.build(EncodedCorpus(data["dense"], data["docs"], data["ids"]))]
    for s in searchers:
        assert isinstance(s, Searcher), type(s).__name__


def test_exact_reference_is_brute_force(data):
    scores = data["q"].astype(np.float64) @ data["dense"].T.astype(np.float64)
    got = data["exact"].search(data["q"], SearchParams(k=K, lam=1.0))
    for qi in range(Q):
        order = np.lexsort((data["ids"], -scores[qi]))[:K]
        np.testing.assert_array_equal(got[1][qi], data["ids"][order])
    lam = 0.4  # the searcher's hybrid_lambda is the default
    hybrid = lam * scores + (1 - lam) * (data["queries"].to_dense() @ data["docs"].to_dense().T)
    got = data["exact"].search(data["q"], k=K, sparse=data["queries"])
    np.testing.assert_array_equal(got[1], data["ids"][np.argsort(-hybrid, axis=1, kind="stable")[:, :K]])
    padded = data["exact"].search(data["q"][:2], k=N + 3, lam=1.0)
    assert (padded[1][:, N:] == PAD_ID).all() and np.isneginf(padded[0][:, N:]).all()


def test_flat_shards_equal_the_reference(data):
    index = ShardedIndex.open(data["path"])
    _same(index.search(data["q"], SearchParams(k=K, lam=1.0)), data["exact"].search(data["q"], k=K, lam=1.0),
          "dense")
    params = SearchParams(k=K, candidates=N)  # exhaustive candidates, the manifest's lam 0.4
    _same(index.search(data["q"], params, sparse=data["queries"]),
          data["exact"].search(data["q"], params, sparse=data["queries"]), "hybrid")
    with pytest.raises(ValueError, match="normalisation"):
        index.search(data["q"], params, sparse=data["queries"], normalisation="minmax")


def test_sparse_inverted_index_equals_the_reference(data):
    index = InvertedIndex.build(data["docs"], data["ids"])
    reference = ExactSearcher(data["docs"].to_dense(), data["ids"])
    want = reference.search(data["queries"].to_dense(), k=K)
    assert (want[0] > 0).all()  # every query shares a term with at least K documents: no padding to compare
    _same(index.search(data["queries"], SearchParams(k=K)), want, "sparse")
    np.testing.assert_array_equal(index.documents().to_dense(), data["docs"].to_dense())


def test_bm25_equals_the_reference_over_its_weights(data):
    bm25 = BM25Index().fit(data["texts"], data["ids"])
    reference = ExactSearcher(bm25.index.documents().to_dense(), bm25.index.ids)
    want = reference.search(bm25.encode_queries(data["token_queries"]).to_dense(), k=5)
    assert (want[0] > 0).all()
    _same(bm25.search(data["token_queries"], SearchParams(k=5)), want, "bm25")


@pytest.mark.parametrize("factory, extra", [("Flat", {}), ("IVF4,Flat", {"nprobe": 4})])
def test_hybrid_searcher_equals_the_reference(data, factory, extra):
    searcher = HybridSearcher.build(EncodedCorpus(data["dense"], data["docs"], data["ids"]), hybrid_lambda=0.4,
                                    index_factory=factory)
    queries = EncodedTexts(data["q"], data["queries"])
    params = SearchParams(k=K, candidates=N, **extra)  # IVF: all 4 lists probed is exhaustive
    _same(searcher.search_encoded(queries, params), data["exact"].search(data["q"], params, sparse=data["queries"]),
          f"{factory} hybrid")
    _same(searcher.search_encoded(queries, params, mode="dense"), data["exact"].search(data["q"], params, lam=1.0),
          f"{factory} dense")


def test_search_params_are_checked_once():
    with pytest.raises(ValueError, match="search.k must be"):
        SearchParams(k=0)
    with pytest.raises(ValueError, match="search.nprobe must be"):
        SearchParams(nprobe=0)
    with pytest.raises(ValueError, match="search.candidates must be"):
        SearchParams(candidates=-1)
    with pytest.raises(ValueError, match=r"search.lam must be in \[0, 1\]"):
        SearchParams(lam=1.5)
    with pytest.raises(ValueError, match="search.normalisation"):
        SearchParams(normalisation="l2")
    with pytest.raises(TypeError, match="unknown search setting.*nprobes"):
        resolve(None, {"nprobes": 3})
    with pytest.raises(TypeError, match="pass k as a keyword"):
        resolve(10, {})  # type: ignore[arg-type]
    p = resolve(SearchParams(k=5, nprobe=8), {"lam": 1})
    assert (p.k, p.nprobe, p.lam, p.num_candidates) == (5, 8, 1.0, 100)
    assert SearchParams(k=300).num_candidates == 300 and SearchParams(candidates=7).num_candidates == 7
    assert hash(SearchParams(k=3)) == hash(SearchParams(k=3))  # usable as a batching key
