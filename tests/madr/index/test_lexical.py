"""The lexical (BM25 on word pieces) part of a sharded index, built in process: per-shard term frequencies with
the collection's statistics merged into the manifest score every document as one ``BM25Index().fit`` over the
whole collection does; ``ShardedIndex`` dense + BM25 fusion equals the in-process reference (exact dense top-c
+ BM25Index top-c, ``weighted_fusion`` min-max) on ids and scores; lam = 1 / 0 give the dense / BM25 rankings;
a damaged document-frequency file is named."""

from __future__ import annotations

import numpy as np
import pytest

from madr.index import Manifest, build_index
from madr.index.lexical import LexicalInfo, query_term_counts, term_counts, word_pieces
from madr.search.exact import ExactSearcher
from madr.search.score_fusion import weighted_fusion
from madr.search.sharded import ShardedIndex
from madr.search.sparse import BM25Index

N_CAND = 40


@pytest.fixture(scope="module")
def built(catalog, tokenizer, tmp_path_factory):
    texts = [catalog.product_text(p) for p in catalog.products]
    ids = np.arange(len(texts), dtype=np.int64) * 3 + 11
    rng = np.random.default_rng(0)
    dense = rng.standard_normal((len(texts), 16)).astype(np.float32)
    tf = term_counts(word_pieces(tokenizer, texts), len(tokenizer))
    path = build_index(dense, ids, tmp_path_factory.mktemp("lex"), num_shards=3, lexical=tf, fusion_lambda=0.3)
    queries = [q.text for q in catalog.queries[:25]]
    q_dense = rng.standard_normal((len(queries), 16)).astype(np.float32)
    bm25 = BM25Index().fit([tokenizer.tokenize(t) for t in texts], ids)  # strings: independent of the job's ids
    return {"path": path, "texts": texts, "ids": ids, "dense": dense, "queries": queries, "q_dense": q_dense,
            "bm25": bm25, "q_tokens": [tokenizer.tokenize(q) for q in queries]}


def reference(b, lam: float, k: int):
    d = ExactSearcher(b["dense"], b["ids"]).search(b["q_dense"], k=N_CAND)
    s = b["bm25"].search(b["q_tokens"], k=N_CAND)
    return weighted_fusion([d, s], [lam, 1 - lam], k, normalisation="minmax"), d, s


def test_manifest_records_the_collections_statistics(built, tokenizer):
    m = Manifest.load(built["path"])
    assert m.has_lexical and m.search_mode == "dense+bm25" and all(s.lexical_path for s in m.shards)
    info = LexicalInfo.from_dict(m.lexical)
    lengths = [len(tokenizer.tokenize(t)) for t in built["texts"]]
    assert info.num_docs == len(built["texts"]) and info.num_tokens == sum(lengths)
    assert info.avgdl == pytest.approx(built["bm25"].avgdl) and (info.k1, info.b, info.idf) == (0.9, 0.4, "lucene")
    assert info.fusion_lambda == 0.3
    m.verify(built["path"].parent)


def test_fused_search_equals_the_unsharded_reference(built, tokenizer):
    index = ShardedIndex.open(built["path"])
    assert index.has_lexical and index.fusion_lambda == 0.3 and index.num_shards == 3
    lex = index.query_terms(tokenizer, built["queries"])
    # every shard's BM25 scores are the whole collection's: the merged BM25 candidates equal BM25Index's
    parts = [s.candidates(built["q_dense"], lex, k=10, candidates=N_CAND) for s in index.shards]
    from madr.search.protocol import merge_topk

    (ref, d_ref, s_ref) = reference(built, 0.3, 10)
    got_b = merge_topk([b for _, b in parts], N_CAND)
    np.testing.assert_array_equal(got_b[1], s_ref[1])
    np.testing.assert_allclose(got_b[0], s_ref[0], rtol=1e-5)
    # lam None -> the manifest's 0.3; normalisation None -> min-max
    got = index.search(built["q_dense"], k=10, candidates=N_CAND, lexical=lex)
    np.testing.assert_array_equal(got[1], ref[1])
    np.testing.assert_allclose(got[0], ref[0], rtol=1e-5, atol=1e-6)
    for lam in (0.0, 0.7, 1.0):
        ref_l = reference(built, lam, 10)[0]
        got_l = index.search(built["q_dense"], k=10, candidates=N_CAND, lexical=lex, lam=lam)
        np.testing.assert_array_equal(got_l[1], ref_l[1])
        np.testing.assert_allclose(got_l[0], ref_l[0], rtol=1e-5, atol=1e-6)
    # lam = 1: the dense ranking; lam = 0: the BM25 ranking
    np.testing.assert_array_equal(index.search(built["q_dense"], k=10, candidates=N_CAND, lexical=lex, lam=1.0)[1],
                                  d_ref[1][:, :10])
    got0 = index.search(built["q_dense"], k=10, candidates=N_CAND, lexical=lex, lam=0.0)[1]
    for q in range(len(built["queries"])):  # BM25 hits above the list's last score come first, in BM25 order
        live = s_ref[0][q][np.isfinite(s_ref[0][q])]
        above = int((live[:10] > live.min()).sum()) if live.size else 0
        assert got0[q, :above].tolist() == s_ref[1][q, :above].tolist(), f"query {q}"
    assert sum(np.isfinite(s_ref[0][q]).sum() > 10 for q in range(len(built["queries"]))) >= 10
    # without query terms the index searches dense only, as before
    np.testing.assert_array_equal(index.search(built["q_dense"], k=10)[1], d_ref[1][:, :10])
    # a single shard fuses over itself (Shard.search) like the whole index over one shard would
    one = index.shards[0].search(built["q_dense"], k=5, candidates=N_CAND, lexical=lex)
    assert one[1].shape == (len(built["queries"]), 5) and np.isin(one[1], index.shards[0].ids).all()


def test_query_terms_and_errors(built, tokenizer, tmp_path):
    q = query_term_counts(tokenizer, ["blue blue socks"])
    ids, counts = q.row(0)
    assert counts.max() == 2.0 and q.vocab_size == len(tokenizer)
    dense_only = build_index(built["dense"][:30], built["ids"][:30], tmp_path / "dense", num_shards=2)
    index = ShardedIndex.open(dense_only)
    assert not index.has_lexical and index.search_mode == "dense" and index.query_terms(tokenizer, ["x"]) is None
    with pytest.raises(ValueError, match="no lexical"):
        index.search(built["q_dense"][:1], k=3, lexical=q)
    # a damaged document-frequency file is named when the index is opened
    lex_dir = tmp_path / "lex"
    tf = term_counts(word_pieces(tokenizer, built["texts"][:30]), len(tokenizer))
    build_index(built["dense"][:30], built["ids"][:30], lex_dir, num_shards=2, lexical=tf)
    df = lex_dir / "lexical.df.npy"
    blob = bytearray(df.read_bytes())
    blob[-1] ^= 0x01
    df.write_bytes(bytes(blob))
    with pytest.raises(ValueError, match=r"checksum mismatch for .*lexical\.df\.npy"):
        ShardedIndex.open(lex_dir)


def test_word_pieces_are_case_insensitive_with_a_cased_tokenizer(tmp_path):
    """A cased tokenizer (e5's is) gives "Angle" and "angle" different pieces; the lexical part lower-cases
    first, as a Lucene analyzer does, so a query matches a title whatever their case."""
    from madr.modeling.tokenization import train_wordpiece_tokenizer

    cased = train_wordpiece_tokenizer(["Angle bracket", "angle Bracket", "steel angle"] * 5, vocab_size=200,
                                      lowercase=False, out_dir=str(tmp_path / "cased"))
    assert cased.tokenize("Angle") != cased.tokenize("angle")
    assert word_pieces(cased, ["Angle Bracket"]) == word_pieces(cased, ["angle bracket"])


def test_an_index_with_its_own_lexical_tokenizer(built, tokenizer, tmp_path):
    """``build_index(..., lexical_tokenizer=tok)``: the tokenizer (another vocabulary than the model's) is saved
    in the index with its files' checksums; ``query_terms`` splits queries by it whatever tokenizer it is given,
    so fused search equals the reference over its pieces; a damaged tokenizer file is named."""
    from madr.index.lexical import TOKENIZER_DIR
    from madr.modeling.tokenization import train_wordpiece_tokenizer

    texts, ids = built["texts"], built["ids"]
    own = train_wordpiece_tokenizer(texts, vocab_size=200, out_dir=str(tmp_path / "own"))
    assert len(own) != len(tokenizer) and own.tokenize(texts[0]) != tokenizer.tokenize(texts[0])
    tf = term_counts(word_pieces(own, texts), len(own))
    with pytest.raises(ValueError, match="lexical_tokenizer needs"):
        build_index(built["dense"], ids, tmp_path / "bad", num_shards=2, lexical=tf, lexical_tokenizer=tokenizer)
    path = build_index(built["dense"], ids, tmp_path / "idx", num_shards=3, lexical=tf, fusion_lambda=0.3,
                       lexical_tokenizer=own)
    info = LexicalInfo.from_dict(Manifest.load(path).lexical)
    assert info.vocab_size == len(own) and info.tokenizer_path == TOKENIZER_DIR
    files = sorted(p.name for p in (path.parent / TOKENIZER_DIR).iterdir())
    assert files and sorted(info.tokenizer_sha256) == files
    index = ShardedIndex.open(path)
    assert len(index.lexical_tokenizer) == len(own)
    lex = index.query_terms(tokenizer, built["queries"])  # the model's tokenizer is passed, the index's is used
    assert lex.vocab_size == len(own)
    bm25 = BM25Index().fit([own.tokenize(t.lower()) for t in texts], ids)
    ref = weighted_fusion([ExactSearcher(built["dense"], ids).search(built["q_dense"], k=N_CAND),
                           bm25.search([own.tokenize(q.lower()) for q in built["queries"]], k=N_CAND)],
                          [0.3, 0.7], 10, normalisation="minmax")
    got = index.search(built["q_dense"], k=10, candidates=N_CAND, lexical=lex)
    np.testing.assert_array_equal(got[1], ref[1])
    np.testing.assert_allclose(got[0], ref[0], rtol=1e-5, atol=1e-6)
    assert not np.array_equal(got[1], reference(built, 0.3, 10)[0][1])  # the model's pieces rank otherwise
    # an index over the model's pieces records no tokenizer (its manifest is as before the option)
    assert "tokenizer_path" not in Manifest.load(built["path"]).lexical
    assert ShardedIndex.open(built["path"]).lexical_tokenizer is None
    damaged = path.parent / TOKENIZER_DIR / files[0]
    damaged.write_bytes(damaged.read_bytes() + b" ")
    with pytest.raises(ValueError, match=f"checksum mismatch for tokenizer file .*{files[0]}"):
        Manifest.load(path).verify(path.parent)
    with pytest.raises(ValueError, match=f"checksum mismatch for tokenizer file .*{files[0]}"):
        ShardedIndex.open(path)


def test_bm25_matches_sum_to_the_documents_bm25_score(built, tokenizer):
    """What `/explain` shows of the BM25 part: the pieces a query and a document share, each with its
    contribution, largest first; they sum to the document's score in BM25Index over the collection."""
    from madr.index.lexical import bm25_matches

    info = LexicalInfo.from_dict(Manifest.load(built["path"]).lexical)
    idf = info.idf_values(built["path"].parent)
    scores, ids = built["bm25"].search(built["q_tokens"], k=1)
    matched = [qi for qi in range(len(ids)) if ids[qi, 0] >= 0][:5]
    assert matched, "some query matches a document"
    for qi in matched:
        doc = int(np.flatnonzero(built["ids"] == ids[qi, 0])[0])
        q_ids, d_ids = word_pieces(tokenizer, [built["queries"][qi], built["texts"][doc]])
        matches = bm25_matches(q_ids, d_ids, idf, info.avgdl, info.k1, info.b)
        assert matches and {m["term_id"] for m in matches} <= set(q_ids) & set(d_ids)
        contributions = [m["contribution"] for m in matches]
        assert contributions == sorted(contributions, reverse=True)
        assert sum(contributions) == pytest.approx(scores[qi, 0], rel=1e-5), built["queries"][qi]
    # hand-computed: one shared term, twice in the query, once in a document of average length
    one = bm25_matches([7, 7, 9], [7, 8], np.array([0.0] * 7 + [2.0, 5.0, 5.0]), avgdl=2.0, k1=0.9, b=0.4)
    assert one == [{"term_id": 7, "query_count": 2, "doc_count": 1, "idf": 2.0,
                    "contribution": pytest.approx(2 * 2.0 * 1 * 1.9 / (1 + 0.9))}]
    assert bm25_matches([1], [2], np.ones(3), avgdl=1.0) == []
