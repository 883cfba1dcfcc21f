"""madr.index in-process: sharded build + search against brute force, hybrid against HybridSearcher,
approximate index types against exact recall bounds, checksums, mmap, the manifest and the DocStore."""

from __future__ import annotations

import json
from pathlib import Path

import faiss
import numpy as np
import pyarrow as pa
import pytest
import torch

from madr.config import BackboneConfig, ModelConfig
from madr.index import DocStore, Manifest, build_index, encode_queries
from madr.index.build import id_report
from madr.modeling.model import build_model
from madr.search.hybrid import EncodedCorpus, EncodedTexts, HybridSearcher
from madr.search.protocol import merge_topk
from madr.search.sharded import ShardedIndex, load_shard
from madr.search.sparse import SparseBatch

N, D, V = 1500, 16, 300


def _clustered(n: int, d: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    centres = rng.standard_normal((20, d)).astype(np.float32)
    return centres[rng.integers(0, 20, n)] + 0.4 * rng.standard_normal((n, d)).astype(np.float32)


def _sparse(n: int, seed: int, nnz: int = 6) -> SparseBatch:
    rng = np.random.default_rng(seed)
    pairs = [(rng.choice(V, nnz, replace=False), rng.random(nnz).astype(np.float32) + 0.1) for _ in range(n)]
    return SparseBatch.from_pairs(pairs, vocab_size=V)


@pytest.fixture(scope="module")
def data():
    x = _clustered(N, D, 0)
    q = _clustered(40, D, 1)
    ids = np.random.default_rng(2).permutation(N).astype(np.int64) * 3 + 11  # not row numbers
    return x, q, ids


def _exact(x: np.ndarray, ids: np.ndarray, q: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    s = q.astype(np.float64) @ x.T.astype(np.float64)
    order = np.lexsort((np.broadcast_to(ids, s.shape), -s), axis=1)[:, :k]
    return np.take_along_axis(s, order, 1), ids[order]


def _recall(found: np.ndarray, exact: np.ndarray) -> float:
    return float(np.mean([len(set(f) & set(e)) / len(e) for f, e in zip(found, exact, strict=True)]))


def test_flat_shards_equal_brute_force(data, tmp_path):
    x, q, ids = data
    path = build_index(x, ids, tmp_path, num_shards=3, index_factory="Flat")
    index = ShardedIndex.open(path)
    assert (index.num_shards, index.ntotal, index.dim, index.has_sparse) == (3, N, D, False)
    scores, found = index.search(q, k=10)
    exp_s, exp_i = _exact(x, ids, q, 10)
    np.testing.assert_array_equal(found, exp_i)
    np.testing.assert_allclose(scores, exp_s, rtol=1e-5, atol=1e-5)
    # shards hold disjoint id ranges that cover every id exactly once
    m = Manifest.load(path)
    assert [s.count for s in m.shards] == [500, 500, 500]
    assert all(a.max_id < b.min_id for a, b in zip(m.shards, m.shards[1:], strict=False))
    report = id_report(tmp_path, m.shards, expected_ids=ids)
    assert report["duplicates"] == [] and report["missing"] == [] and report["num_ids"] == N
    np.testing.assert_allclose(index.reconstruct(ids[:50]), x[:50])


@pytest.mark.parametrize("factory,kwargs,bound", [
    ("IVF32,Flat", {"nprobe": 8}, 0.95),  # measured 0.995
    ("HNSW16", {"ef_search": 64}, 0.95),  # measured 0.997
    ("OPQ8,IVF16,PQ8x4", {"nprobe": 8}, 0.45),  # measured 0.53: 4-bit codes of 2-d sub-vectors
])
def test_approximate_types_recall(data, tmp_path, factory, kwargs, bound):
    x, q, ids = data
    index = ShardedIndex.open(build_index(x, ids, tmp_path, num_shards=2, index_factory=factory))
    _, exact = _exact(x, ids, q, 10)
    _, found = index.search(q, k=10, **kwargs)
    assert set(found.ravel().tolist()) <= set(ids.tolist())
    recall = _recall(found, exact)
    assert recall >= bound, f"{factory}: recall@10 {recall:.3f} < {bound}"


def test_search_parameters_change_results(data, tmp_path):
    x, q, ids = data
    _, exact = _exact(x, ids, q, 10)
    index = ShardedIndex.open(build_index(x, ids, tmp_path / "ivf", num_shards=2, index_factory="IVF32,Flat"))
    r1 = _recall(index.search(q, k=10, nprobe=1)[1], exact)
    r32 = _recall(index.search(q, k=10, nprobe=32)[1], exact)
    assert r32 == 1.0 and r1 < r32  # all lists probed: exact
    index = ShardedIndex.open(build_index(x, ids, tmp_path / "hnsw", num_shards=2, index_factory="HNSW16"))
    assert _recall(index.search(q, k=10, ef_search=4)[1], exact) < _recall(index.search(q, k=10, ef_search=64)[1], exact)


def test_hybrid_sharded_equals_hybrid_searcher(data, tmp_path):
    x, q, ids = data
    sp_docs, sp_q = _sparse(N, 3), _sparse(len(q), 4)
    path = build_index(x, ids, tmp_path, num_shards=4, index_factory="Flat", sparse=sp_docs, hybrid_lambda=0.3)
    index = ShardedIndex.open(path)
    assert index.has_sparse and index.hybrid_lambda == 0.3
    ref = HybridSearcher.build(EncodedCorpus(x, sp_docs, ids), hybrid_lambda=0.3)
    exp_s, exp_i = ref.search_encoded(EncodedTexts(q, sp_q), k=10, candidates=N)
    got_s, got_i = index.search(q, k=10, sparse=sp_q, candidates=N)
    np.testing.assert_array_equal(got_i, exp_i)
    np.testing.assert_allclose(got_s, exp_s, rtol=1e-6, atol=1e-6)
    # lam from the call overrides the manifest; lam = 1 is dense-only
    exp_s, exp_i = ref.search_encoded(EncodedTexts(q, sp_q), k=5, lam=0.8, candidates=N)
    np.testing.assert_array_equal(index.search(q, k=5, sparse=sp_q, lam=0.8, candidates=N)[1], exp_i)
    np.testing.assert_array_equal(index.search(q, k=5, lam=1.0)[1], _exact(x, ids, q, 5)[1])
    with pytest.raises(ValueError, match="needs sparse query vectors"):
        index.search(q, k=5)


def test_checksum_detects_corrupted_shard(data, tmp_path):
    x, q, ids = data
    path = build_index(x[:300], ids[:300], tmp_path, num_shards=2)
    blob = bytearray((tmp_path / "shard-00001.faiss").read_bytes())
    blob[-5] ^= 0xFF
    (tmp_path / "shard-00001.faiss").write_bytes(bytes(blob))
    with pytest.raises(ValueError, match=r"shard 1: checksum mismatch for .*shard-00001\.faiss"):
        ShardedIndex.open(path)
    load_shard(path, 0)  # the intact shard still opens
    ShardedIndex.open(path, verify=False)  # the check can be skipped on purpose


def test_mmap_open_gives_same_results(data, tmp_path):
    x, q, ids = data
    for factory in ("Flat", "IVF16,Flat"):
        out = tmp_path / factory.replace(",", "_")
        path = build_index(x, ids, out, num_shards=2, index_factory=factory)
        a = ShardedIndex.open(path).search(q, k=7, nprobe=4)
        b = ShardedIndex.open(path, mmap=True).search(q, k=7, nprobe=4)
        np.testing.assert_array_equal(a[1], b[1])
        np.testing.assert_array_equal(a[0], b[0])


def test_merge_topk_ties_and_padding():
    a = (np.array([[1.0, 0.5, -np.inf]], np.float32), np.array([[7, 3, -1]]))
    b = (np.array([[1.0, 0.9]], np.float32), np.array([[2, 9]]))
    s, i = merge_topk([a, b], 6)
    assert i.tolist() == [[2, 7, 9, 3, -1, -1]]
    assert s[0, :4].tolist() == [1.0, 1.0, pytest.approx(0.9), 0.5] and np.isneginf(s[0, 4:]).all()
    with pytest.raises(ValueError, match="query counts"):
        merge_topk([a, (np.zeros((2, 1)), np.zeros((2, 1)))], 2)


def test_manifest_roundtrip_and_errors(data, tmp_path):
    x, _, ids = data
    path = build_index(x[:100], ids[:100], tmp_path, num_shards=2, model_dir="m", config_hash="abc")
    m = Manifest.load(path)
    assert (m.format, m.dim, m.index_factory, m.num_docs, m.model_dir, m.config_hash, m.hybrid_lambda) == \
        ("madr.index/1", D, "Flat", 100, "m", "abc", None)
    m2 = Manifest.load(m.save(tmp_path / "copy.json"))
    assert m2.to_dict() == m.to_dict()
    raw = json.loads(path.read_text())
    raw["num_docs"] = 99
    (tmp_path / "bad.json").write_text(json.dumps(raw))
    with pytest.raises(ValueError, match=r"bad\.json: .*num_docs is 99 but the shards hold 100"):
        Manifest.load(tmp_path / "bad.json")
    with pytest.raises(ValueError, match="duplicate id"):
        build_index(x[:4], np.array([1, 2, 2, 3]), tmp_path / "dup", num_shards=1)
    with pytest.raises(ValueError, match="bad FAISS index factory"):
        build_index(x[:4], np.arange(4), tmp_path / "bad", num_shards=1, index_factory="Nope")


def test_docstore(tmp_path, data):
    x, _, ids = data
    docs = pa.table({"doc_id": ids[:20], "title": [f"t{i}" for i in ids[:20]]})
    path = build_index(x[:20], ids[:20], tmp_path, num_shards=1, docs=docs)
    store = DocStore.open(tmp_path / Manifest.load(path).docs_path)
    got = store.get([int(ids[3]), -1, 10**9, int(ids[0])])
    assert got[0] == {"doc_id": int(ids[3]), "title": f"t{ids[3]}"} and got[1] is None and got[2] is None
    assert got[3]["doc_id"] == int(ids[0])
    bad = tmp_path / "dup.parquet"
    import pyarrow.parquet as pq

    pq.write_table(pa.table({"doc_id": [1, 2, 1]}), bad)
    with pytest.raises(ValueError, match=r"dup\.parquet: row 2, field 'doc_id': duplicate id 1"):
        DocStore.open(bad)
    # a directory of files (the encode job writes one per shard) is read into one chunk per column
    folder = tmp_path / "docs"
    folder.mkdir()
    for part in range(3):
        rows = np.arange(part * 40, part * 40 + 40)
        pq.write_table(pa.table({"doc_id": rows[::-1], "title": [f"t{i}" for i in rows[::-1]]}), folder / f"{part}.parquet",
                       row_group_size=7)
    store = DocStore.open(folder, columns=["title"])
    assert len(store) == 120 and all(c.num_chunks == 1 for c in store.table.columns)
    assert [r["title"] for r in store.get([119, 0, 47, 500])[:3]] == ["t119", "t0", "t47"]


def test_import_without_torch():
    """Search-only processes (Serve shard replicas) import the index without torch; the encoders load on use."""
    import subprocess
    import sys

    code = ("import sys; from madr.search.sharded import ShardedIndex; from madr.index import DocStore, Manifest; "
            "assert 'torch' not in sys.modules")
    subprocess.run([sys.executable, "-c", code], check=True, cwd=str(Path(__file__).resolve().parents[3]))
    import madr.index
    from madr.index import encode_documents

    assert encode_documents.__module__ == "madr.index.encode" and madr.index.encode_queries.__name__ == "encode_queries"
    with pytest.raises(AttributeError, match="has no attribute 'nope'"):
        madr.index.nope  # noqa: B018


def test_encode_queries_dense_and_hybrid(tokenizer):
    tiny = {"hidden_size": 32, "num_hidden_layers": 1, "num_attention_heads": 2, "intermediate_size": 64,
            "max_position_embeddings": 64}
    torch.manual_seed(0)
    texts = ["red running shoes", "blue kettle"]
    hybrid = build_model(ModelConfig(name="hybrid", backbone=BackboneConfig(tiny=tiny), sparse_top_k=8,
                                     max_query_length=16, max_doc_length=32), tokenizer)
    dense, sparse = encode_queries(hybrid, texts)
    assert dense.shape == (2, 32) and dense.dtype == np.float32 and len(sparse) == 2
    assert max(np.diff(sparse.indptr)) <= 8
    cls = build_model(ModelConfig(name="bibert", backbone=BackboneConfig(tiny=tiny), max_query_length=16,
                                  max_doc_length=32), tokenizer)
    dense, sparse = encode_queries(cls, texts)
    assert sparse is None and np.allclose(np.linalg.norm(dense, axis=1), 1.0, atol=1e-5)  # cosine model


def test_faiss_index_types_stored_with_global_ids(data, tmp_path):
    x, _, ids = data
    for factory, kind in (("Flat", faiss.IndexIDMap2), ("IVF8,Flat", faiss.IndexIVFFlat),
                          ("HNSW8", faiss.IndexIDMap2)):
        path = build_index(x[:200], ids[:200], tmp_path / kind.__name__ / factory[:3], 1, factory)
        shard = load_shard(path, 0)
        assert isinstance(shard.index, kind)
        assert set(shard.search(x[:5], k=3)[1].ravel().tolist()) <= set(ids[:200].tolist())
