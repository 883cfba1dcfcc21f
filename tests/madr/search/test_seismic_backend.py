"""The approximate sparse backend (Seismic, `pyseismic-lsr`) behind madr's searcher convention, and the
index config choosing it: built into every shard with a checksum, recorded in the manifest, opened by the
searchers."""

from __future__ import annotations

import json

import numpy as np
import pytest

from madr.index import build_index
from madr.search.sharded import ShardedIndex, load_shard
from madr.search.sparse import InvertedIndex, SparseBatch
from madr.search.sparse.backend import SparseBackend
from madr.search.sparse.seismic_index import SeismicParams, SeismicSparseIndex

N, V, D = 1200, 400, 8
EXHAUSTIVE = SeismicParams(n_postings=N, centroid_fraction=0.1, summary_energy=1.0, doc_cut=50, query_cut=50,
                           heap_factor=1.0)  # every posting kept, every term of the query used


def _topical(n: int, seed: int, nnz: int = 12) -> SparseBatch:
    """SPLADE-like rows: most terms from one of 20 topics (40 terms each), the rest from the whole vocabulary."""
    rng = np.random.default_rng(seed)
    pairs = []
    for _ in range(n):
        topic = rng.integers(0, 19) * 20  # topics overlap by half: terms 0..399
        terms = np.unique(np.concatenate([topic + rng.choice(40, nnz - 3, replace=False), rng.choice(V, 3)]))
        pairs.append((terms, (rng.random(terms.size) * 2 + 0.05).astype(np.float32)))
    return SparseBatch.from_pairs(pairs, vocab_size=V)


@pytest.fixture(scope="module")
def corpus():
    ids = np.random.default_rng(9).permutation(N).astype(np.int64) * 5 + 7
    return _topical(N, 0), _topical(30, 1, nnz=6), ids


def _recall(found: np.ndarray, exact: np.ndarray) -> float:
    return float(np.mean([len(set(f[f >= 0]) & set(e[e >= 0])) / max(1, (e >= 0).sum())
                          for f, e in zip(found, exact, strict=True)]))


def test_seismic_finds_the_exact_top_k_in_madr_order(corpus, tmp_path):
    docs, queries, ids = corpus
    exact = InvertedIndex.build(docs, ids)
    ref = exact.search(queries, k=10)
    index = SeismicSparseIndex.build(exact, EXHAUSTIVE)
    scores, got = index.search(queries, k=10)
    assert _recall(got, ref[1]) >= 0.95, "with every posting kept Seismic should find (almost) the exact top 10"
    assert scores.dtype == np.float32 and got.dtype == np.int64 and got.shape == (30, 10)
    assert (np.diff(scores, axis=1) <= 0).all(), "scores descending"
    assert set(got[got >= 0].tolist()) <= set(ids.tolist()), "global ids, not row numbers"
    np.testing.assert_allclose(index.score(queries, got), exact.score(queries, got), rtol=1e-6)
    index.save(tmp_path / "s.seismic")
    assert (tmp_path / "s.seismic").is_file() and not list(tmp_path.glob("*.index.seismic"))
    again = SeismicSparseIndex.load(tmp_path / "s.seismic", exact, EXHAUSTIVE).search(queries, k=10)
    np.testing.assert_array_equal(again[1], got)
    with pytest.raises(ValueError, match="Seismic holds"):
        SeismicSparseIndex.load(tmp_path / "s.seismic", InvertedIndex.build(docs.select(range(10)), ids[:10]))


def test_each_query_gets_its_own_results(corpus):
    """Seismic's batch results need not come back in query order: a batch must equal each query alone."""
    docs, _, ids = corpus
    queries = _topical(120, 5, nnz=6)
    index = SeismicSparseIndex.build(InvertedIndex.build(docs, ids), EXHAUSTIVE)
    batch = index.search(queries, k=5, num_threads=2)
    for q in range(0, 120, 7):
        alone = index.search(queries.select([q]), k=5)
        np.testing.assert_array_equal(batch[1][q], alone[1][0], err_msg=f"query {q}")


def test_seismic_search_knobs_trade_recall(corpus):
    docs, queries, ids = corpus
    exact = InvertedIndex.build(docs, ids)
    ref = exact.search(queries, k=10)[1]
    pruned = SeismicSparseIndex.build(exact, SeismicParams(n_postings=40, summary_energy=0.3, query_cut=2,
                                                           heap_factor=0.3))
    assert _recall(pruned.search(queries, k=10)[1], ref) < 0.95, "pruned postings + 2 query terms lose results"


def test_backend_config_checks():
    assert SparseBackend.from_dict(None).name == "exact" and SparseBackend().to_dict() == {"name": "exact"}
    b = SparseBackend.from_dict({"name": "seismic", "seismic": {"heap_factor": 0.9}})
    assert b.approximate and b.seismic.heap_factor == 0.9 and SparseBackend.from_dict(b.to_dict()) == b
    with pytest.raises(ValueError, match="sparse_backend must be one of"):
        SparseBackend(name="wand")
    with pytest.raises(ValueError, match="heap_factor"):
        SparseBackend.from_dict({"name": "seismic", "seismic": {"heap_factor": 0}})
    with pytest.raises(TypeError):
        SparseBackend.from_dict({"name": "seismic", "seismic": {"no_such_knob": 1}})


def test_sharded_index_built_with_seismic(corpus, tmp_path):
    docs, queries, ids = corpus
    dense = np.random.default_rng(3).standard_normal((N, D)).astype(np.float32)
    q_dense = np.random.default_rng(4).standard_normal((30, D)).astype(np.float32)
    backend = SparseBackend("seismic", EXHAUSTIVE)
    path = build_index(dense, ids, tmp_path / "seismic", num_shards=2, sparse=docs, hybrid_lambda=0.0,
                       sparse_backend=backend)
    manifest = json.loads(path.read_text())
    assert manifest["sparse_backend"] == backend.to_dict()
    for shard in manifest["shards"]:
        assert shard["approx_sparse_path"].endswith(".sparse.seismic")
        assert shard["approx_sparse_path"] in shard["sha256"], "checksummed like every shard file"
    assert isinstance(load_shard(path, 0).sparse, SeismicSparseIndex)
    exact_path = build_index(dense, ids, tmp_path / "exact", num_shards=2, sparse=docs, hybrid_lambda=0.0)
    assert isinstance(load_shard(exact_path, 0).sparse, InvertedIndex)
    got = ShardedIndex.open(path).search(q_dense, k=10, sparse=queries, candidates=50)[1]
    ref = ShardedIndex.open(exact_path).search(q_dense, k=10, sparse=queries, candidates=50)[1]
    assert _recall(got, ref) >= 0.95, "lam = 0: the sparse ranking, from Seismic's candidates"
    blob = bytearray((tmp_path / "seismic" / "shard-00001.sparse.seismic").read_bytes())
    blob[-3] ^= 0xFF
    (tmp_path / "seismic" / "shard-00001.sparse.seismic").write_bytes(bytes(blob))
    with pytest.raises(ValueError, match=r"checksum mismatch for .*shard-00001\.sparse\.seismic"):
        ShardedIndex.open(path)
