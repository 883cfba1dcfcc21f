"""Search benchmark of the sharded index types: recall@k against exact search, queries/s, bytes per vector.

Synthetic clustered vectors (a mixture of Gaussians, L2-normalised, inner product). Every index type is
built with ``madr.index.build_index`` (quantiser trained once on a sample, N shards with global ids) and
searched through ``ShardedIndex.search`` (batched queries, all shards, merged top-k). Peers in the same
run: brute force in numpy (float32 matmul + argpartition) and one unsharded ``faiss.IndexFlatIP``; the
exact top-k of numpy is the recall reference. Bytes per vector = the shard files on disk / N.

    python benchmarks/bench_index.py --n 100000 --dim 64 --queries 500
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

# (factory, search settings to sweep)
TYPES = [
    ("Flat", [{}]),
    ("IVF{nlist},Flat", [{"nprobe": 4}, {"nprobe": 16}, {"nprobe": 64}]),
    ("IVF{nlist},PQ{m}", [{"nprobe": 16}, {"nprobe": 64}]),
    ("OPQ{m},IVF{nlist},PQ{m}", [{"nprobe": 16}, {"nprobe": 64}]),
    ("HNSW32", [{"ef_search": 32}, {"ef_search": 128}]),
]


def clustered(n: int, d: int, seed: int, centres: np.ndarray) -> np.ndarray:
    rng = np.random.default_rng(seed)
    x = centres[rng.integers(0, centres.shape[0], n)] + 0.6 * rng.standard_normal((n, d)).astype(np.float32)
    return (x / np.linalg.norm(x, axis=1, keepdims=True)).astype(np.float32)


def numpy_topk(x: np.ndarray, q: np.ndarray, k: int, batch: int = 256) -> np.ndarray:
    out = []
    for i in range(0, q.shape[0], batch):
        s = q[i:i + batch] @ x.T
        top = np.argpartition(-s, k, axis=1)[:, :k]
        order = np.argsort(-np.take_along_axis(s, top, 1), axis=1)
        out.append(np.take_along_axis(top, order, 1))
    return np.concatenate(out)


def recall(found: np.ndarray, exact: np.ndarray) -> float:
    return float(np.mean([len(set(f.tolist()) & set(e.tolist())) / e.size for f, e in zip(found, exact, strict=True)]))


def timed(fn, repeats: int = 1):
    best, out = float("inf"), None
    for _ in range(repeats):
        start = time.perf_counter()
        out = fn()
        best = min(best, time.perf_counter() - start)
    return best, out


def main() -> None:
    import faiss

    from madr.index import ShardedIndex, build_index

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n", type=int, default=100_000)
    ap.add_argument("--dim", type=int, default=64)
    ap.add_argument("--queries", type=int, default=500)
    ap.add_argument("--k", type=int, default=100)
    ap.add_argument("--shards", type=int, default=4)
    ap.add_argument("--train-size", type=int, default=30_000)
    ap.add_argument("--types", nargs="+", default=None, help="subset of the factory strings")
    args = ap.parse_args()
    nlist = int(4 * np.sqrt(args.n) // 16 * 16) or 16
    m = args.dim // 4
    rng = np.random.default_rng(0)
    centres = rng.standard_normal((200, args.dim)).astype(np.float32)
    x, q = clustered(args.n, args.dim, 1, centres), clustered(args.queries, args.dim, 2, centres)
    ids = np.arange(args.n, dtype=np.int64)
    print(f"machine: {platform.machine()}, {os.cpu_count()} cores, load avg {os.getloadavg()[0]:.1f}; "
          f"python {platform.python_version()}, numpy {np.__version__}, faiss {faiss.__version__} "
          f"(omp threads {faiss.omp_get_max_threads()})")
    print(f"{args.n} x {args.dim} vectors (200 Gaussian clusters, normalised), {args.queries} queries, "
          f"k={args.k}, {args.shards} shards, nlist={nlist}, PQ m={m}")
    t_np, exact = timed(lambda: numpy_topk(x, q, args.k))
    print(f"{'numpy brute force':<32} recall 1.000  {args.queries / t_np:>9.0f} q/s  {4 * args.dim:>5} B/vec")
    flat = faiss.IndexFlatIP(args.dim)
    flat.add(x)
    t_fl, (_, fl_ids) = timed(lambda: flat.search(q, args.k), repeats=2)
    print(f"{'faiss IndexFlatIP (1 index)':<32} recall {recall(fl_ids, exact):.3f}  {args.queries / t_fl:>9.0f} q/s  "
          f"{4 * args.dim:>5} B/vec")
    rows = []
    for pattern, settings in TYPES:
        factory = pattern.format(nlist=nlist, m=m)
        if args.types and factory not in args.types and pattern not in args.types:
            continue
        with tempfile.TemporaryDirectory() as tmp:
            t_build, path = timed(lambda f=factory, t=tmp: build_index(x, ids, t, args.shards, f,
                                                                         train_size=args.train_size))
            index = ShardedIndex.open(path, mmap=True)
            nbytes = sum(f.stat().st_size for f in Path(tmp).glob("shard-*.faiss"))
            for kw in settings:
                t, (_, found) = timed(lambda k=kw, ix=index: ix.search(q, args.k, **k), repeats=2)
                r = recall(found, exact)
                label = f"{factory} {' '.join(f'{a}={b}' for a, b in kw.items())}"
                rows.append((label, r, args.queries / t, nbytes / args.n, t_build))
                print(f"{label:<32} recall {r:.3f}  {args.queries / t:>9.0f} q/s  {nbytes / args.n:>5.0f} B/vec  "
                      f"(build {t_build:.0f} s; x{t_np / t:.1f} numpy, x{t_fl / t:.2f} faiss Flat q/s)", flush=True)


if __name__ == "__main__":
    main()
