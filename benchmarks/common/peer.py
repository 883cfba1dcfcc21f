"""What the hand-written peers of the speed benchmarks (`speed.recipe_serving`, `speed.pipeline_vs_peer`) share,
written as a search engineer would with the libraries alone (so the peers import none of madr's search code):
`bm25s` over word-piece ids and its search, a FAISS index, and the fusion, the same rule as
`madr.search.score_fusion` in numpy."""

from __future__ import annotations

from typing import Any

import numpy as np

CHUNK = 100_000  # vectors added to a FAISS index at a time


def bm25_index(docs: list[list[int]], vocab_size: int, k1: float, b: float) -> Any:
    """bm25s (Lucene idf, `k1` / `b`, numba backend) over documents of token ids."""
    import bm25s

    model = bm25s.BM25(k1=k1, b=b, method="lucene", backend="numba")
    model.index((docs, {str(t): t for t in range(vocab_size)}), show_progress=False, create_empty_token=False)
    return model


def word_pieces(tokenizer: Any, texts: list[str]) -> list[list[int]]:
    """Token ids of the lower-cased texts, no special tokens, no truncation."""
    return tokenizer([t.lower() for t in texts], add_special_tokens=False, truncation=False,
                     return_attention_mask=False, return_token_type_ids=False, verbose=False)["input_ids"]


def bm25_search(model: Any, queries: list[list[int]], k: int, n_docs: int) -> list[tuple[np.ndarray, np.ndarray]]:
    """Per query (rows, scores) of its top `k` products with a positive BM25 score (empty for no known piece)."""
    known = [[t for t in q if t in model.unique_token_ids_set] for q in queries]
    out = [(np.zeros(0, np.int64), np.zeros(0, np.float32))] * len(queries)
    asked = [i for i, q in enumerate(known) if q]
    if asked:
        rows, scores = model.retrieve([known[i] for i in asked], k=min(k, n_docs), show_progress=False)
        for i, r, sc in zip(asked, rows, scores, strict=True):
            keep = sc > 0
            out[i] = (r[keep].astype(np.int64), sc[keep])
    return out


def dense_index(dense: np.ndarray, factory: str = "Flat", nprobe: int | None = None, seed: int = 0) -> Any:
    """A FAISS index of type `factory` (inner product; an IVF trained on 100k seeded vectors, `nprobe` set)."""
    import faiss

    index = faiss.index_factory(dense.shape[1], factory, faiss.METRIC_INNER_PRODUCT)
    if not index.is_trained:
        rows = np.random.default_rng(seed).choice(len(dense), min(len(dense), 100_000), replace=False)
        index.train(np.ascontiguousarray(dense[np.sort(rows)]))
    for a in range(0, len(dense), CHUNK):
        index.add(np.ascontiguousarray(dense[a:a + CHUNK]))
    if nprobe is not None and "IVF" in factory:
        faiss.extract_index_ivf(index).nprobe = int(nprobe)
    return index


def normalised(x: np.ndarray, how: str) -> np.ndarray:
    """Min-max or z-score (population std) of one score vector, in float64; all equal: zeros; "none": as is."""
    x = x.astype(np.float64)
    if how == "minmax":
        span = x.max() - x.min()
        return (x - x.min()) / span if span > 0 else np.zeros_like(x)
    if how == "zscore":
        return (x - x.mean()) / x.std() if x.std() > 0 else np.zeros_like(x)
    return x


def fuse(dense: tuple[np.ndarray, np.ndarray], bm25: tuple[np.ndarray, np.ndarray], lam: float, how: str,
         k: int) -> tuple[np.ndarray, np.ndarray]:
    """Top-k (ids, scores) of `lam * dense + (1 - lam) * bm25` over the union, each normalised (a miss: its min)."""
    cand = np.union1d(dense[0], bm25[0])

    def column(ids: np.ndarray, scores: np.ndarray) -> np.ndarray:
        col = np.full(cand.size, scores.min() if scores.size else 0.0, np.float64)
        col[np.searchsorted(cand, ids)] = scores
        return normalised(col, how)

    final = lam * column(*dense) + (1.0 - lam) * column(*bm25)
    top = np.lexsort((cand, -final))[:k]
    return cand[top], final[top]
