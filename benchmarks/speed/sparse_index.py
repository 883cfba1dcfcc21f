"""Benchmark: ``madr.search.sparse.InvertedIndex`` on a synthetic SPLADE-like corpus vs brute-force sparse scoring.

Corpus: ``--docs`` documents with U[--doc-nnz-min, --doc-nnz-max] distinct terms (approximately; see
``zipf_rows``) over a BERT-sized vocabulary (30,522) whose term frequencies follow a Zipf law with exponent
``--zipf`` (term rank r drawn with probability ~ 1 / r^s, ranks shuffled over term ids), weights
U[0.05, 3) like SPLADE's log(1 + ReLU) values. Queries: the same generator with 20-40 terms.

Measured: corpus generation (not part of the index), index build time, index size (``nbytes``) and process
RSS, queries/s of ``InvertedIndex.search`` (one scipy sparse-sparse product per query batch, reading only
the posting lists of the query terms) and of the peer, brute-force sparse scoring: for each query a dense
query vector and ``corpus_csr @ q`` (scipy CSR row-major matrix-vector product over all postings) then an
argpartition top-k. Both are single-threaded scipy kernels. The top-k of both are compared on a sample.

    python -m benchmarks.speed.sparse_index --docs 50000      # smoke check, seconds
    python -m benchmarks.speed.sparse_index --docs 1000000    # the reported run
"""

from __future__ import annotations

import argparse
import os
import resource
import sys
import time

import numpy as np
import scipy.sparse as sp

from benchmarks.common.machine import machine_line, versions_line
from madr.search.protocol import pad_rows
from madr.search.sparse.inverted_index import InvertedIndex, top_k_row
from madr.search.sparse.vectors import SparseBatch


def machine_info() -> str:
    return (f"machine: {machine_line()}; os.cpu_count {os.cpu_count()}\n"
            f"versions: {versions_line('numpy', 'scipy')}")


def rss_gib() -> tuple[float, float]:
    """(current RSS, peak RSS) of this process in GiB."""
    with open("/proc/self/status") as f:
        fields = {ln.split(":")[0]: ln.split()[1] for ln in f if ln.startswith(("VmRSS", "VmHWM"))}
    return int(fields["VmRSS"]) / 2**20, int(fields["VmHWM"]) / 2**20


def distinct_curve(p: np.ndarray, max_draws: int) -> np.ndarray:
    """Expected number of distinct terms after m draws, m = 0..max_draws: sum_t 1 - (1 - p_t)^m."""
    m = np.arange(max_draws + 1, dtype=np.float64)
    return np.array([(-np.expm1(mi * np.log1p(-p))).sum() for mi in m])


def zipf_rows(rng: np.random.Generator, n: int, nnz_min: int, nnz_max: int, cdf: np.ndarray,
              draws_for: np.ndarray, perm: np.ndarray, chunk: int = 20_000) -> SparseBatch:
    """n rows; each draws Zipf term ranks with replacement, as many draws as give on average its target
    U[nnz_min, nnz_max] distinct terms, keeps the distinct ones (so nnz varies around the target)."""
    vocab = perm.size
    parts = []
    for start in range(0, n, chunk):
        b = min(chunk, n - start)
        n_draws = draws_for[rng.integers(nnz_min, nnz_max + 1, size=b)]
        width = int(n_draws.max())
        ranks = np.searchsorted(cdf, rng.random((b, width)), side="right").astype(np.int32)
        terms = perm[np.minimum(ranks, vocab - 1)]
        terms[np.arange(width)[None, :] >= n_draws[:, None]] = vocab  # sentinel, sorts last
        terms.sort(axis=1)
        keep = terms != vocab
        keep[:, 1:] &= terms[:, 1:] != terms[:, :-1]
        counts = keep.sum(axis=1)
        indptr = np.zeros(b + 1, dtype=np.int64)
        np.cumsum(counts, out=indptr[1:])
        values = rng.uniform(0.05, 3.0, size=int(indptr[-1])).astype(np.float32)
        parts.append(SparseBatch(indptr, terms[keep], values, vocab_size=vocab))
    return SparseBatch.concat(parts)


def brute_force(corpus_csr: sp.csr_array, queries: SparseBatch, ids: np.ndarray, k: int):
    """The peer: per query, dense q and CSR matvec over every posting, then the same top-k rule."""
    rows = []
    q_dense = np.zeros(queries.vocab_size, dtype=np.float32)
    for i in range(len(queries)):
        t, w = queries.row(i)
        q_dense[t] = w
        scores = corpus_csr @ q_dense
        q_dense[t] = 0.0
        rows.append(top_k_row(scores, ids, k))
    return pad_rows(rows, k)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog=f"python -m {__spec__.name}", description=__doc__.split("\n")[0])
    ap.add_argument("--docs", type=int, default=1_000_000)
    ap.add_argument("--queries", type=int, default=500)
    ap.add_argument("--peer-queries", type=int, default=100, help="queries timed for the brute-force peer")
    ap.add_argument("--vocab", type=int, default=30_522)
    ap.add_argument("--zipf", type=float, default=1.0, help="Zipf exponent of the term distribution")
    ap.add_argument("--doc-nnz", type=int, nargs=2, default=[100, 200], metavar=("MIN", "MAX"))
    ap.add_argument("--query-nnz", type=int, nargs=2, default=[20, 40], metavar=("MIN", "MAX"))
    ap.add_argument("--batch-sizes", nargs="+", default=["1", "auto", "64"],
                    help="queries per sparse product; 'auto' = InvertedIndex's default (None)")
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 1,
                    help="also time search with this many threads (auto batch size)")
    ap.add_argument("--k", type=int, default=10)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)

    print(machine_info())
    print(f"command: {' '.join(sys.argv)}")
    rng = np.random.default_rng(args.seed)
    p = 1.0 / np.arange(1, args.vocab + 1, dtype=np.float64) ** args.zipf
    p /= p.sum()
    cdf = np.cumsum(p)
    curve = distinct_curve(p, 8 * args.doc_nnz[1])
    draws_for = np.searchsorted(curve, np.arange(args.doc_nnz[1] + 1))  # draws giving >= n distinct
    perm = rng.permutation(args.vocab).astype(np.int32)

    t0 = time.perf_counter()
    docs = zipf_rows(rng, args.docs, *args.doc_nnz, cdf, draws_for, perm)
    queries = zipf_rows(rng, args.queries, *args.query_nnz, cdf, draws_for, perm)
    ids = rng.permutation(args.docs).astype(np.int64) * 3 + 7  # global ids, not 0..N-1
    t_gen = time.perf_counter() - t0
    nnz_doc = np.diff(docs.indptr)
    print(f"corpus: {args.docs:,} docs, {docs.nnz:,} postings, nnz/doc mean {nnz_doc.mean():.1f} "
          f"(min {nnz_doc.min()}, max {nnz_doc.max()}), vocab {args.vocab:,}, zipf s={args.zipf}; "
          f"{len(queries)} queries, nnz/query mean {np.diff(queries.indptr).mean():.1f}; "
          f"generated in {t_gen:.1f} s; SparseBatch {docs.nbytes / 2**30:.2f} GiB")

    rss0, _ = rss_gib()
    t0 = time.perf_counter()
    index = InvertedIndex.build(docs, ids)
    nbytes = index.nbytes  # forces the (lazy) posting-list build
    t_build = time.perf_counter() - t0
    rss1, peak = rss_gib()
    print(f"index build: {t_build:.2f} s; index nbytes {nbytes / 2**30:.3f} GiB "
          f"({nbytes / docs.nnz:.2f} B/posting); RSS {rss0:.2f} -> {rss1:.2f} GiB (+{rss1 - rss0:.2f}), "
          f"peak so far {peak:.2f} GiB")

    df = np.diff(index._compact().indptr)
    touched = np.array([df[queries.row(i)[0]].sum() for i in range(len(queries))])
    print(f"postings read per query (inverted index): mean {touched.mean() / 1e6:.2f} M = "
          f"{touched.mean() / docs.nnz:.1%} of all postings (brute force reads 100%)")

    index.search(queries.select(slice(0, 4)), k=args.k)  # warm-up
    results = {}
    configs = [(None if b == "auto" else int(b), 1) for b in args.batch_sizes]
    if args.threads > 1:
        configs.append((None, args.threads))
    for bs, threads in configs:
        t0 = time.perf_counter()
        results[(bs, threads)] = index.search(queries, k=args.k, batch_size=bs, num_threads=threads)
        dt = time.perf_counter() - t0
        print(f"InvertedIndex.search batch_size={bs or f'auto ({index._batch_size(None)})'} "
              f"threads={threads}: {len(queries)} queries in {dt:.2f} s = {len(queries) / dt:.1f} queries/s "
              f"({1000 * dt / len(queries):.1f} ms/query)")

    corpus_csr = docs.to_scipy()
    n_peer = min(args.peer_queries, len(queries))
    peer_q = queries.select(slice(0, n_peer))
    t0 = time.perf_counter()
    peer = brute_force(corpus_csr, peer_q, ids, args.k)
    t_peer = time.perf_counter() - t0
    peer_qps = n_peer / t_peer
    print(f"peer brute force (CSR matvec per query): {n_peer} queries in {t_peer:.2f} s = "
          f"{peer_qps:.2f} queries/s ({1000 * t_peer / n_peer:.1f} ms/query)")

    t0 = time.perf_counter()
    mine = index.search(peer_q, k=args.k)
    index_qps = n_peer / (time.perf_counter() - t0)
    print(f"ratio (same {n_peer} queries, both single-threaded, auto batch size): InvertedIndex "
          f"{index_qps:.2f} q/s / brute force {peer_qps:.2f} q/s = {index_qps / peer_qps:.1f}x")

    same_ids = np.array_equal(mine[1], peer[1])
    max_diff = float(np.max(np.abs(mine[0] - peer[0]))) if same_ids else float("nan")
    agree = (mine[1] == peer[1]).all(axis=1).sum()
    print(f"top-{args.k} agreement on {n_peer} queries: {agree}/{n_peer} identical id lists; "
          f"max |score diff| {max_diff:.3g}")
    for config, res in results.items():
        if not np.array_equal(res[1][:n_peer], peer[1]):
            print(f"MISMATCH: search with (batch_size, threads)={config} differs from brute force")
            return 1
    _, peak = rss_gib()
    print(f"peak RSS {peak:.2f} GiB; ru_maxrss {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20:.2f} GiB")
    return 0 if same_ids else 1


if __name__ == "__main__":
    sys.exit(main())
