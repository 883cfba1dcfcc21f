"""MaxScore engine (``madr.search.sparse.maxscore``): the same ids, scores and tie order as the scipy and plain
compiled engines, on inputs built to break pruning (ties at the k-th score, skewed lists, tiny k, k beyond the
matches, empty queries, negative weights), and ``term_max`` saved with the index."""

from __future__ import annotations

import numpy as np
import pytest

from madr.search.sparse.inverted_index import InvertedIndex, term_maxima
from madr.search.sparse.vectors import SparseBatch


def skewed_batch(rng, n: int, vocab: int, nnz: int, integer: bool) -> SparseBatch:
    """Rows whose terms follow a Zipf-like law (a few terms in most rows: long, low-bound lists, as in
    SPLADE) with weights that are small integers (exact float32 sums: many ties) or floats."""
    p = 1.0 / np.arange(1, vocab + 1) ** 1.1
    pairs = []
    for _ in range(n):
        terms = rng.choice(vocab, size=min(nnz, vocab), replace=False, p=p / p.sum())
        w = rng.integers(1, 4, terms.size) if integer else rng.gamma(1.0, 1.0, terms.size) + 1e-3
        pairs.append((terms, w))
    return SparseBatch.from_pairs(pairs, vocab_size=vocab)


def assert_identical(index: InvertedIndex, queries: SparseBatch, k: int, what: str) -> None:
    """maxscore == compiled == scipy, ids and scores bit for bit (all three sum float32 in query order)."""
    ref = index.search(queries, k=k, engine="scipy")
    plain = index.search(queries, k=k, engine="compiled")
    got = index.search(queries, k=k, engine="maxscore")
    np.testing.assert_array_equal(got[1], ref[1], err_msg=f"{what}: ids differ from scipy's")
    np.testing.assert_array_equal(got[1], plain[1], err_msg=f"{what}: ids differ from the plain kernel's")
    np.testing.assert_array_equal(got[0], plain[0], err_msg=f"{what}: scores differ from the plain kernel's")
    np.testing.assert_array_equal(got[0], ref[0], err_msg=f"{what}: scores differ from scipy's")


@pytest.mark.parametrize("integer", [True, False], ids=["integer-ties", "float"])
@pytest.mark.parametrize("k", [1, 3, 10, 32, 100, 5000])
def test_maxscore_equals_scipy_on_skewed_lists(integer, k):
    rng = np.random.default_rng(k + integer)
    docs = skewed_batch(rng, 3000, 400, 24, integer)
    queries = skewed_batch(rng, 60, 400, 12, integer)
    ids = rng.choice(10**9, size=len(docs), replace=False)
    index = InvertedIndex.build(docs, ids)
    if integer and k <= 100:
        scores = index.search(queries, k=k, engine="scipy")[0]
        assert np.any(scores[:, 1:] == scores[:, :-1]) or k == 1, "the fixture should tie inside the top k"
    assert_identical(index, queries, k, f"k={k} integer={integer}")


def test_ties_at_the_kth_score_keep_the_lower_ids():
    """Twenty rows with the same score, one common term with a long list of tiny weights (non-essential as
    soon as a threshold exists): the top 5 must be the 5 lowest ids of the tie, as the plain kernel ranks."""
    common, strong = 0, 1
    pairs = [([common, strong], [0.001, 2.0]) for _ in range(20)]  # 20 tied rows: score 2.0 * 1 + 0.001
    pairs += [([common], [0.001])] * 500  # a long, weak list
    pairs += [([strong], [1.0])] * 5  # below the tie
    docs = SparseBatch.from_pairs(pairs, vocab_size=2)
    ids = np.random.default_rng(0).permutation(len(pairs)) + 100
    index = InvertedIndex.build(docs, ids)
    query = SparseBatch.from_pairs([([common, strong], [1.0, 1.0])], vocab_size=2)
    assert_identical(index, query, 5, "tie at the k-th score")
    tied = np.sort(ids[:20])[:5]
    assert index.search(query, k=5, engine="maxscore")[1][0].tolist() == tied.tolist(), (
        "lowest ids of the tie"
    )


def test_k_beyond_the_matches_empty_queries_and_unknown_terms():
    rng = np.random.default_rng(3)
    docs = skewed_batch(rng, 50, 30, 4, integer=True)
    index = InvertedIndex.build(docs)
    queries = SparseBatch.from_pairs([([], []), ([0, 5], [1.0, 2.0]), ([29], [1.0]), ([], [])], vocab_size=40)
    index = InvertedIndex.build(SparseBatch(docs.indptr, docs.indices, docs.values, 40))
    got = index.search(queries, k=60, engine="maxscore")
    assert (got[1][[0, 3]] == -1).all() and np.isneginf(got[0][[0, 3]]).all(), "empty queries: all padding"
    assert_identical(index, queries, 60, "k > matches")
    assert_identical(
        index, SparseBatch.from_pairs([([35, 36], [1.0, 1.0])], vocab_size=40), 3, "unknown terms"
    )


def test_negative_weights_fall_back_to_the_plain_kernel():
    rng = np.random.default_rng(4)
    docs = skewed_batch(rng, 500, 50, 8, integer=False)
    queries = skewed_batch(rng, 20, 50, 6, integer=False)
    neg_query = SparseBatch(
        queries.indptr,
        queries.indices,
        np.where(np.arange(queries.nnz) % 3 == 0, -queries.values, queries.values),
        50,
    )
    assert_identical(InvertedIndex.build(docs), neg_query, 10, "negative query weights")
    neg_docs = SparseBatch(
        docs.indptr, docs.indices, np.where(np.arange(docs.nnz) % 5 == 0, -docs.values, docs.values), 50
    )
    index = InvertedIndex.build(neg_docs)
    assert not index.non_negative()
    assert_identical(index, queries, 10, "negative document weights")


def test_threads_and_auto_engine_give_the_same_results():
    rng = np.random.default_rng(5)
    docs = skewed_batch(rng, 2000, 300, 16, integer=True)
    queries = skewed_batch(rng, 40, 300, 10, integer=True)
    index = InvertedIndex.build(docs)
    serial = index.search(queries, k=10, engine="maxscore")
    for what, got in (
        ("2 threads", index.search(queries, k=10, engine="maxscore", num_threads=2)),
        ("auto, k 10", index.search(queries, k=10)),
        ("one query", index.search(queries.select([7]), k=10, engine="maxscore")),
    ):
        rows = [7] if what == "one query" else slice(None)
        np.testing.assert_array_equal(got[1], serial[1][rows], err_msg=what)
        np.testing.assert_array_equal(got[0], serial[0][rows], err_msg=what)


def test_term_max_is_saved_checked_and_rebuilt_for_old_files(tmp_path):
    rng = np.random.default_rng(6)
    docs = skewed_batch(rng, 300, 40, 6, integer=False)
    queries = skewed_batch(rng, 10, 40, 5, integer=False)
    index = InvertedIndex.build(docs)
    expected = docs.to_dense().max(axis=0)
    np.testing.assert_array_equal(index.term_max(), expected, err_msg="term_max = each term's largest weight")
    index.save(tmp_path / "new.npz")
    with np.load(tmp_path / "new.npz") as f:
        fields = dict(f)
    np.testing.assert_array_equal(fields["term_max"], expected, err_msg="term_max is saved")
    old = {name: v for name, v in fields.items() if name != "term_max"}  # a file from before term_max
    np.savez(tmp_path / "old.npz", **old)
    for name in ("new.npz", "old.npz"):
        loaded = InvertedIndex.load(tmp_path / name)
        np.testing.assert_array_equal(loaded.term_max(), expected, err_msg=f"{name}: term_max after load")
        assert_identical(loaded, queries, 5, name)
    t = int(np.flatnonzero(expected)[0])
    fields["term_max"] = expected.copy()
    fields["term_max"][t] *= 0.5  # a bound below a weight would drop documents silently
    np.savez(tmp_path / "bad.npz", **fields)
    with pytest.raises(ValueError, match=rf"bad\.npz: field 'term_max' is .* for term {t}"):
        InvertedIndex.load(tmp_path / "bad.npz")
    fields["term_max"] = expected[:-1]
    np.savez(tmp_path / "short.npz", **fields)
    with pytest.raises(ValueError, match=r"short\.npz: field 'term_max' has shape"):
        InvertedIndex.load(tmp_path / "short.npz")


def test_term_max_follows_adds():
    one = SparseBatch.from_pairs([([0, 1], [1.0, 2.0])], vocab_size=3)
    index = InvertedIndex.build(one)
    assert index.term_max().tolist() == [1.0, 2.0, 0.0]
    index.add(SparseBatch.from_pairs([([1, 2], [5.0, 0.5])], vocab_size=3))
    assert index.term_max().tolist() == [1.0, 5.0, 0.5], "an add rebuilds the bounds with the postings"
    np.testing.assert_array_equal(term_maxima(index._compact()), index.term_max())
