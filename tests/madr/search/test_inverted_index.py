"""InvertedIndex: exact sparse top-k equal to brute-force dense scoring (paper 002 Eq. 1, sparse term)."""

from __future__ import annotations

import numpy as np
import pytest

from madr.search.sparse.inverted_index import InvertedIndex
from madr.search.sparse.vectors import SparseBatch

N_DOCS, VOCAB, DOC_NNZ, N_QUERIES, Q_NNZ = 2000, 500, 20, 50, 8


def _random_batch(rng, n, nnz, integer: bool) -> SparseBatch:
    pairs = []
    for _ in range(n):
        ids = rng.choice(VOCAB, size=nnz, replace=False)
        w = rng.integers(1, 5, size=nnz) if integer else rng.random(nnz) + 0.01
        pairs.append((ids, w))
    return SparseBatch.from_pairs(pairs, vocab_size=VOCAB)


@pytest.fixture(scope="module")
def corpus():
    """Integer weights (sums exact in float32, so many exact ties) and global ids that are not 0..N-1."""
    rng = np.random.default_rng(0)
    docs = _random_batch(rng, N_DOCS, DOC_NNZ, integer=True)
    queries = _random_batch(rng, N_QUERIES, Q_NNZ, integer=True)
    ids = rng.choice(10**12, size=N_DOCS, replace=False).astype(np.int64)
    return docs, queries, ids


def brute_force(docs: SparseBatch, queries: SparseBatch, ids: np.ndarray, k: int):
    """Dense numpy matmul, keep score > 0, order by (score desc, id asc), pad -inf / -1."""
    scores = queries.to_dense().astype(np.float64) @ docs.to_dense().astype(np.float64).T
    out_s = np.full((len(queries), k), -np.inf)
    out_i = np.full((len(queries), k), -1, dtype=np.int64)
    for q in range(len(queries)):
        pos = np.flatnonzero(scores[q] > 0)
        order = pos[np.lexsort((ids[pos], -scores[q, pos]))][:k]
        out_s[q, : order.size] = scores[q, order]
        out_i[q, : order.size] = ids[order]
    return out_s, out_i


def assert_same(got, expected, what):
    np.testing.assert_array_equal(got[1], expected[1], err_msg=f"{what}: ids differ")
    np.testing.assert_allclose(got[0], expected[0], rtol=1e-6, err_msg=f"{what}: scores differ")


@pytest.mark.parametrize("engine", ["compiled", "maxscore", "scipy"])
@pytest.mark.parametrize("k", [1, 10, 100, 1000])
def test_search_equals_brute_force_with_ties_and_global_ids(corpus, k, engine):
    docs, queries, ids = corpus
    index = InvertedIndex.build(docs, ids)
    got = index.search(queries, k=k, engine=engine)
    exp = brute_force(docs, queries, ids, k)
    assert got[0].dtype == np.float32 and got[1].dtype == np.int64 and got[0].shape == (N_QUERIES, k)
    s = got[0]
    assert np.any(s[:, 1:] == s[:, :-1]) or k == 1, "fixture should produce ties inside the top-k"
    assert_same(got, exp, f"k={k}")


def test_search_with_float_weights_equals_brute_force():
    rng = np.random.default_rng(1)
    docs = _random_batch(rng, N_DOCS, DOC_NNZ, integer=False)
    queries = _random_batch(rng, N_QUERIES, Q_NNZ, integer=False)
    ids = np.arange(N_DOCS) * 7 + 3
    assert_same(InvertedIndex.build(docs, ids).search(queries, k=10), brute_force(docs, queries, ids, 10),
                "float weights")


@pytest.mark.parametrize("engine", ["compiled", "maxscore", "scipy"])
def test_fewer_matches_than_k_are_padded_and_zero_score_docs_not_returned(engine):
    docs = SparseBatch.from_pairs([([0], [1.0]), ([1], [2.0]), ([0, 1], [3.0, 1.0])], vocab_size=3)
    queries = SparseBatch.from_pairs([([0], [1.0]), ([2], [1.0])], vocab_size=3)
    scores, ids = InvertedIndex.build(docs, [10, 20, 30]).search(queries, k=3, engine=engine)
    assert ids.tolist() == [[30, 10, -1], [-1, -1, -1]], f"only docs sharing a term, then -1 padding: {ids}"
    assert scores[0, :2].tolist() == [3.0, 1.0] and np.isneginf(scores[0, 2]) and np.isneginf(scores[1]).all()


def test_batch_size_and_threads_do_not_change_results(corpus):
    docs, queries, ids = corpus
    index = InvertedIndex.build(docs, ids)
    reference = index.search(queries, k=10, batch_size=1, engine="scipy")
    assert_same(index.search(queries, k=10, batch_size=64, engine="scipy"), reference, "batch_size=64")
    assert_same(index.search(queries, k=10, engine="scipy"), reference, "automatic batch size")
    assert_same(index.search(queries, k=10, batch_size=7, num_threads=2, engine="scipy"), reference, "2 threads")
    assert_same(index.search(queries, k=10, num_threads=2), reference, "compiled, 2 threads")
    assert_same(index.search(queries.select([3]), k=10), (reference[0][3:4], reference[1][3:4]), "one query")
    with pytest.raises(ValueError, match="batch_size must be >= 1"):
        index.search(queries, k=10, batch_size=0, engine="scipy")
    with pytest.raises(ValueError, match="engine must be"):
        index.search(queries, k=10, engine="nope")


def test_add_equals_building_at_once(corpus):
    docs, queries, ids = corpus
    whole = InvertedIndex.build(docs, ids)
    parts = InvertedIndex(VOCAB)
    cuts = [0, 700, 701, 1500, N_DOCS]
    for a, b in zip(cuts[:-1], cuts[1:], strict=True):
        part = SparseBatch(docs.indptr[a : b + 1] - docs.indptr[a], docs.indices[docs.indptr[a] : docs.indptr[b]],
                           docs.values[docs.indptr[a] : docs.indptr[b]], VOCAB)
        parts.add(part, ids[a:b])
        if a == 700:
            parts.search(queries, k=5)  # a search between adds compacts; later adds must still merge
    assert len(parts) == N_DOCS
    assert_same(parts.search(queries, k=10), whole.search(queries, k=10), "add()")
    np.testing.assert_array_equal(parts.ids, ids, err_msg="ids keep insertion order")


def test_add_default_ids_continue_and_duplicates_are_rejected():
    one = SparseBatch.from_pairs([([0], [1.0])], vocab_size=2)
    index = InvertedIndex.build(one)
    index.add(one)
    assert index.ids.tolist() == [0, 1], f"default ids continue from the count, got {index.ids}"
    with pytest.raises(ValueError, match="duplicate document id 1"):
        index.add(one, [1])
    with pytest.raises(ValueError, match="must be >= 0"):
        index.add(one, [-1])
    with pytest.raises(ValueError, match="vocab_size 3"):
        index.add(SparseBatch.from_pairs([([0], [1.0])], vocab_size=3))


def test_save_load_round_trip(corpus, tmp_path):
    docs, queries, ids = corpus
    index = InvertedIndex.build(docs, ids)
    index.save(tmp_path / "index.npz")
    loaded = InvertedIndex.load(tmp_path / "index.npz")
    assert len(loaded) == N_DOCS and loaded.nbytes == index.nbytes
    assert_same(loaded.search(queries, k=10), index.search(queries, k=10), "after load")


def test_load_rejects_inconsistent_file(tmp_path):
    index = InvertedIndex.build(SparseBatch.from_pairs([([0, 1], [1.0, 2.0])], vocab_size=2))
    index.save(tmp_path / "i.npz")
    with np.load(tmp_path / "i.npz") as f:
        fields = dict(f)
    fields["indptr"] = fields["indptr"][:-1]
    np.savez(tmp_path / "bad.npz", **fields)
    with pytest.raises(ValueError, match=r"bad\.npz: field 'indptr' has shape"):
        InvertedIndex.load(tmp_path / "bad.npz")


def test_nbytes_counts_postings_and_ids(corpus):
    docs, _, ids = corpus
    index = InvertedIndex.build(docs, ids)
    nnz = docs.nnz
    assert index.nbytes >= nnz * 8 + N_DOCS * 8, f"data + row indices + ids at least, got {index.nbytes}"
    assert index.nbytes <= nnz * 12 + N_DOCS * 8 + (VOCAB + 1) * 8, f"no hidden copies, got {index.nbytes}"


def test_score_gives_exact_scores_for_given_ids(corpus):
    docs, queries, ids = corpus
    index = InvertedIndex.build(docs, ids)
    dense = queries.to_dense() @ docs.to_dense().T
    pick = np.stack([ids[[5, 0, 1999]]] * N_QUERIES)
    pick[0, 2] = -1
    got = index.score(queries, pick)
    np.testing.assert_allclose(got[:, :2], dense[:, [5, 0]], err_msg="score() must equal the dot products")
    np.testing.assert_allclose(got[1:, 2], dense[1:, 1999])
    assert np.isneginf(got[0, 2]), "padding id -1 scores -inf"
    with pytest.raises(ValueError, match="document id 42 is not in the index"):
        index.score(queries, np.full((N_QUERIES, 1), 42))


def test_posting_pruning_keeps_top_weights_per_term():
    # term 0 postings: weights 5, 1, 5, 3 for ids 40, 10, 30, 20 -> keep 2: both 5s (ids 30, 40)
    docs = SparseBatch.from_pairs([([0, 1], [5.0, 1.0]), ([0], [1.0]), ([0], [5.0]), ([0, 1], [3.0, 2.0])],
                                  vocab_size=2)
    index = InvertedIndex.build(docs, [40, 10, 30, 20], max_postings_per_term=2)
    scores, ids = index.search(SparseBatch.from_pairs([([0], [1.0])], vocab_size=2), k=4)
    assert ids.tolist() == [[30, 40, -1, -1]], f"pruned term 0 keeps the 2 highest weights, got {ids}"
    _, ids = index.search(SparseBatch.from_pairs([([1], [1.0])], vocab_size=2), k=4)
    assert ids.tolist() == [[20, 40, -1, -1]], f"term 1 has only 2 postings, untouched, got {ids}"
    unpruned = InvertedIndex.build(docs, [40, 10, 30, 20])
    assert unpruned.nbytes > index.nbytes, "pruning must shrink the index"


def test_search_validates_arguments(corpus):
    docs, queries, ids = corpus
    index = InvertedIndex.build(docs, ids)
    with pytest.raises(ValueError, match="k must be >= 1"):
        index.search(queries, k=0)
    with pytest.raises(ValueError, match="vocab_size 7"):
        index.search(SparseBatch.from_pairs([([0], [1.0])], vocab_size=7), k=3)


def test_empty_index_returns_padding():
    index = InvertedIndex(4)
    scores, ids = index.search(SparseBatch.from_pairs([([1], [1.0])], vocab_size=4), k=2)
    assert ids.tolist() == [[-1, -1]] and np.isneginf(scores).all()


def test_one_thread_search_starts_no_thread_pool():
    """A serving process searches with num_threads=1: numba's worker pool (idle workers compete with torch)
    must not start (plain or MaxScore kernel); with num_threads=2 it does. Run in a fresh interpreter (numba's private pool flag)."""
    import subprocess
    import sys

    code = """
import numba.np.ufunc.parallel as pool
from madr.search.sparse import InvertedIndex, SparseBatch
docs = SparseBatch.from_pairs([([0, 1], [1.0, 2.0]), ([1], [1.0])], vocab_size=2)
index, q = InvertedIndex.build(docs), SparseBatch.from_pairs([([1], [1.0])] * 8, vocab_size=2)
index.search(q, k=1, engine="compiled")
index.search(q, k=1, engine="maxscore")
one = pool._is_initialized
index.search(q, k=1, num_threads=2)
print(one, pool._is_initialized)
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600, check=True)
    assert out.stdout.split() == ["False", "True"], f"(pool started after 1 thread, after 2 threads): {out.stdout}"
