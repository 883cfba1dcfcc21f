"""BM25Index: BM25 weights in the sparse inverted index (paper 002 Table 3 baseline, paper 004 Sec. VI-D)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from madr.search.sparse.bm25 import BM25Index

# N = 3, avgdl = 3; df: a=1, b=2, c=2, d=1
DOCS = [["a", "b", "a"], ["b", "c"], ["c", "c", "c", "d"]]
IDF_RARE = math.log(1 + (3 - 1 + 0.5) / (1 + 0.5))  # Lucene idf of a, d = log(8/3) ~ 0.98083
IDF_HALF = math.log(1 + (3 - 2 + 0.5) / (2 + 0.5))  # Lucene idf of b, c = log(1.6) ~ 0.47000
# k1 = 0.9, b = 0.4: K(d) = k1 * (1 - b + b * |d| / avgdl)
K = [0.9 * (0.6 + 0.4 * 3 / 3), 0.9 * (0.6 + 0.4 * 2 / 3), 0.9 * (0.6 + 0.4 * 4 / 3)]  # 0.9, 0.78, 1.02


def tf_part(tf: int, doc: int) -> float:
    return tf * 1.9 / (tf + K[doc])


def test_scores_match_hand_computation():
    index = BM25Index().fit(DOCS, ids=[100, 101, 102])
    scores, ids = index.search([["a", "c"]], k=3)
    expected = {100: IDF_RARE * tf_part(2, 0),  # a twice in d0: ~1.28523
                101: IDF_HALF * tf_part(1, 1),  # c once in d1: ~0.50169
                102: IDF_HALF * tf_part(3, 2)}  # c three times in d2: ~0.66642
    assert ids.tolist() == [[100, 102, 101]], f"ranking by hand is d0, d2, d1; got {ids}"
    np.testing.assert_allclose(scores[0], [expected[i] for i in ids[0]], rtol=1e-6,
                               err_msg="BM25 scores differ from the hand computation")


def test_query_term_counts_vs_binary():
    count = BM25Index().fit(DOCS).search([["b", "b"]], k=2)
    binary = BM25Index(query_weighting="binary").fit(DOCS).search([["b", "b"]], k=2)
    one = [IDF_HALF * tf_part(1, 1), IDF_HALF * tf_part(1, 0)]  # shorter d1 beats d0
    assert count[1].tolist() == [[1, 0]] and binary[1].tolist() == [[1, 0]]
    np.testing.assert_allclose(binary[0][0], one, rtol=1e-6, err_msg="binary: each distinct term once")
    np.testing.assert_allclose(count[0][0], [2 * x for x in one], rtol=1e-6, err_msg="count: twice")


def test_k1_b_are_parameters():
    index = BM25Index(k1=1.2, b=0.0).fit(DOCS)
    scores, ids = index.search([["c"]], k=3)
    assert ids.tolist() == [[2, 1, -1]], f"b=0: no length normalisation, higher tf wins, -1 pads; got {ids}"
    np.testing.assert_allclose(scores[0, :2], [IDF_HALF * 3 * 2.2 / (3 + 1.2), IDF_HALF * 2.2 / (1 + 1.2)],
                               rtol=1e-6)


def test_unknown_query_tokens_are_ignored_and_wordpiece_ids_work():
    index = BM25Index().fit([[7, 3, 7], [3, 5], [5, 5, 5, 9]])
    scores, ids = index.search([[7, 5, 12345], [12345]], k=3)
    assert ids[0].tolist() == [0, 2, 1], f"same corpus as DOCS with ids for tokens, got {ids[0]}"
    assert ids[1].tolist() == [-1, -1, -1] and np.isneginf(scores[1]).all(), "no known token: all padding"


def test_bad_input_is_rejected():
    with pytest.raises(ValueError, match="document 1 must be a list of tokens"):
        BM25Index().fit([["a"], "b c"])
    with pytest.raises(ValueError, match="no documents"):
        BM25Index().fit([])
    with pytest.raises(ValueError, match="call fit"):
        BM25Index().search([["a"]], k=1)
    with pytest.raises(ValueError, match="idf must be"):
        BM25Index(idf="bm25+")


def _random_corpus(seed: int):
    rng = np.random.default_rng(seed)
    vocab = [f"t{i}" for i in range(40)]
    p = 1.0 / np.arange(1, 41)
    p /= p.sum()  # Zipf: the commonest tokens are in more than half the docs (negative Okapi idf)
    docs = [list(rng.choice(vocab, size=rng.integers(1, 15), p=p)) for _ in range(120)]
    queries = [list(rng.choice(vocab, size=rng.integers(1, 5), p=p)) for _ in range(20)]
    return docs, queries


def _assert_matches_reference(index: BM25Index, reference, queries, n_docs: int) -> None:
    scores, ids = index.search(queries, k=n_docs)
    for q, query in enumerate(queries):
        expected = np.asarray(reference.get_scores(query))
        got = np.zeros(n_docs)
        got[ids[q][ids[q] >= 0]] = scores[q][ids[q] >= 0]
        np.testing.assert_allclose(got, np.where(expected > 0, expected, 0.0), rtol=1e-5, atol=1e-6,
                                   err_msg=f"query {q} {query}: differs from rank_bm25")


def test_okapi_idf_matches_rank_bm25():
    rank_bm25 = pytest.importorskip("rank_bm25", reason="rank-bm25 is not installed (pip install rank-bm25)")
    docs, queries = _random_corpus(0)
    reference = rank_bm25.BM25Okapi(docs, k1=0.9, b=0.4, epsilon=0.25)
    assert min(reference.idf.values()) > 0 and any(
        math.log(120 - sum(t in d for d in docs) + 0.5) < math.log(sum(t in d for d in docs) + 0.5)
        for t in reference.idf), "fixture must exercise the negative-idf floor"
    _assert_matches_reference(BM25Index(idf="okapi").fit(docs), reference, queries, len(docs))


def test_lucene_idf_matches_rank_bm25_with_lucene_idf():
    rank_bm25 = pytest.importorskip("rank_bm25", reason="rank-bm25 is not installed (pip install rank-bm25)")

    class LuceneIdf(rank_bm25.BM25Okapi):
        def _calc_idf(self, nd):
            self.idf = {w: math.log(1 + (self.corpus_size - f + 0.5) / (f + 0.5)) for w, f in nd.items()}

    docs, queries = _random_corpus(1)
    reference = LuceneIdf(docs, k1=1.2, b=0.75)
    _assert_matches_reference(BM25Index(k1=1.2, b=0.75).fit(docs), reference, queries, len(docs))
