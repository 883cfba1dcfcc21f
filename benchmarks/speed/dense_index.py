"""Search benchmark of the sharded index types: recall@k against exact search, queries/s, bytes per vector.

Synthetic clustered vectors (a mixture of 200 Gaussians, L2-normalised, inner product), generated in
chunks and cached as ``.npy`` under ``--work`` (10M x 128 float32 = 4.8 GiB, memory-mapped, so the
corpus never exists twice in RAM). Every index type is built with ``madr.index.build_index`` (quantiser
trained once on a ``--train-size`` sample, ``--shards`` shards with global ids, each written atomically
with checksums) and searched through ``ShardedIndex.search`` (opened with ``mmap=True``: batched queries,
every shard, merged top-k).

Peer in the same run: exact brute force over the whole (unsharded) corpus with ``faiss.knn`` (BLAS inner
products in blocks, no index copy; all queries in one call); its top-k is the recall reference, it is
timed in every run, and every row prints its queries/s ratio to it. Bytes per vector = the shards' ``.faiss`` files / N (the ``.ids.npy`` files add 8).
Thread count: faiss / BLAS use ``--threads`` OpenMP threads (default: all cores) for peer and ours alike.

    python -m benchmarks.speed.dense_index --n 1000000 --dim 128 --json benchmarks/results/index_1m.json
    python -m benchmarks.speed.dense_index --n 10000000 --types flat ivf_flat --json benchmarks/results/index_10m.json
    python -m benchmarks.speed.dense_index --plot benchmarks/results/index_1m.json benchmarks/results/index_10m.json \\
        --png benchmarks/plots/index_recall_qps.png

``--json`` files are merged: a run replaces the rows of the types it measured and keeps the others, so
slow types can be measured in separate commands (each < 20 min on 2 cores).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import tempfile
import time
from pathlib import Path

import numpy as np

from benchmarks.common.machine import arch_cores, versions_line
from benchmarks.common.plotting import pyplot, save_figure

# short name -> (factory pattern, search settings swept)
TYPES = {
    "flat": ("Flat", [{}]),
    "ivf_flat": ("IVF{nlist},Flat", [{"nprobe": p} for p in (4, 16, 64, 256)]),
    "ivf_pq": ("IVF{nlist},PQ{m}", [{"nprobe": p} for p in (4, 16, 64, 256)]),
    "opq_ivf_pq": ("OPQ{m},IVF{nlist},PQ{m}", [{"nprobe": p} for p in (4, 16, 64, 256)]),
    "hnsw": ("HNSW32", [{"ef_search": e} for e in (128, 256, 512)]),  # faiss searches with ef >= k
}
CHUNK = 1_000_000


def clustered(n: int, d: int, seed: int, centres: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
    """``n`` normalised points around ``centres`` (float32 throughout, generated ``CHUNK`` rows at a time)."""
    out = np.empty((n, d), np.float32) if out is None else out
    rng = np.random.default_rng(seed)
    for s in range(0, n, CHUNK):
        e = min(s + CHUNK, n)
        x = rng.standard_normal((e - s, d), dtype=np.float32)
        x *= 0.6
        x += centres[rng.integers(0, centres.shape[0], e - s)]
        x /= np.linalg.norm(x, axis=1, keepdims=True)
        out[s:e] = x
    return out


def cached_data(work: Path, n: int, d: int, nq: int) -> tuple[np.ndarray, np.ndarray]:
    """(corpus [n, d] memory-mapped, queries [nq, d]) from ``work``, generated on first use."""
    work.mkdir(parents=True, exist_ok=True)
    centres = np.random.default_rng(0).standard_normal((200, d)).astype(np.float32)
    path = work / f"x_{n}_{d}.npy"
    if not path.is_file():
        tmp = path.with_suffix(".tmp.npy")
        mm = np.lib.format.open_memmap(tmp, mode="w+", dtype=np.float32, shape=(n, d))
        clustered(n, d, 1, centres, mm)
        mm.flush()
        del mm
        os.replace(tmp, path)
    return np.load(path, mmap_mode="r"), clustered(nq, d, 2, centres)


def exact_topk(work: Path, x: np.ndarray, q: np.ndarray, k: int) -> tuple[np.ndarray, float]:
    """Exact top-k ids of every query (``faiss.knn`` over all queries at once) and the peer's queries/s,
    timed in this run (the ids are cached in ``work``; a cached run times the search again, so the ratio
    always compares searches under the same load)."""
    import faiss

    path = work / f"gt_{x.shape[0]}_{x.shape[1]}_{q.shape[0]}_{k}.npz"
    start = time.perf_counter()
    ids = faiss.knn(q, x, k, metric=faiss.METRIC_INNER_PRODUCT)[1]
    qps = q.shape[0] / (time.perf_counter() - start)
    if path.is_file() and not np.array_equal(np.load(path)["ids"], ids):
        print(f"note: exact top-{k} differs from the cached run's in "
              f"{(np.load(path)['ids'] != ids).any(axis=1).mean():.1%} of the queries (ties / BLAS rounding)")
    if not path.is_file():
        np.savez(path, ids=ids)
    return ids, qps


def recall(found: np.ndarray, exact: np.ndarray) -> float:
    """Mean |found ∩ exact| / |exact| per query (recall@k of the approximate top-k against the exact top-k)."""
    return float(np.mean([np.intersect1d(f, e).size / e.size for f, e in zip(found, exact, strict=True)]))


def timed(fn, repeats: int = 2, slow: float = 20.0):
    """Best wall time of ``repeats`` calls (one call when the first takes longer than ``slow`` s)."""
    best, out = float("inf"), None
    for _ in range(repeats):
        start = time.perf_counter()
        out = fn()
        best = min(best, time.perf_counter() - start)
        if best > slow:
            break
    return best, out


def peak_rss_gb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20


def bench_type(name: str, x: np.ndarray, q: np.ndarray, exact: np.ndarray, args, nlist: int,
               exact_qps: float) -> list[dict]:
    from madr.index import build_index
    from madr.search.sharded import ShardedIndex

    pattern, settings = TYPES[name]
    factory = pattern.format(nlist=nlist, m=args.dim // 4)
    ids = np.arange(x.shape[0], dtype=np.int64)
    rows = []
    with tempfile.TemporaryDirectory(dir=args.work) as tmp:
        t_build, path = timed(lambda: build_index(x, ids, tmp, args.shards, factory, train_size=args.train_size), 1)
        index = ShardedIndex.open(path, mmap=True)
        nbytes = sum(f.stat().st_size for f in Path(tmp).glob("shard-*.faiss"))
        for kw in settings:
            t, (_, found) = timed(lambda k=kw, ix=index: ix.search(q, k=args.k, **k))
            row = {"n": x.shape[0], "dim": args.dim, "type": name, "factory": factory, **kw,
                   "setting": " ".join(f"{a}={b}" for a, b in kw.items()) or "-",
                   f"recall@{args.k}": recall(found, exact), "qps": q.shape[0] / t,
                   "ratio_vs_exact_qps": q.shape[0] / t / exact_qps, "bytes_per_vector": nbytes / x.shape[0],
                   "build_s": t_build, "shards": args.shards, "queries": q.shape[0]}
            rows.append(row)
            print(f"{factory + ' ' + row['setting']:<36} recall@{args.k} {row[f'recall@{args.k}']:.3f}  "
                  f"{row['qps']:>8.0f} q/s  x{row['ratio_vs_exact_qps']:>6.2f} exact  "
                  f"{row['bytes_per_vector']:>5.0f} B/vec  build {t_build:>6.0f} s  peak RSS {peak_rss_gb():.1f} GB",
                  flush=True)
        del index
    return rows


def merge_json(path: Path, header: dict, rows: list[dict]) -> None:
    """Replace this run's (n, type) rows in ``path``; other rows stay."""
    old = json.loads(path.read_text()) if path.is_file() else {"runs": [], "rows": []}
    done = {(r["n"], r["type"]) for r in rows}
    old["rows"] = [r for r in old["rows"] if (r["n"], r["type"]) not in done] + rows
    old["runs"].append(header)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(old, indent=1))


def plot(json_paths: list[str], png: str, k: int = 100) -> None:
    plt = pyplot()
    if plt is None:
        return

    rows, exact = [], {}
    for p in json_paths:
        data = json.loads(Path(p).read_text())
        rows += data["rows"]
        for run in data["runs"]:
            exact[run["n"]] = run["exact_qps"]
    sizes = sorted({r["n"] for r in rows})
    fig, axes = plt.subplots(1, len(sizes), figsize=(6 * len(sizes), 4.5), squeeze=False)
    for ax, n in zip(axes[0], sizes, strict=True):
        for name in TYPES:
            pts = [r for r in rows if r["n"] == n and r["type"] == name]
            if not pts:
                continue
            ax.plot([r["qps"] for r in pts], [r[f"recall@{k}"] for r in pts], marker="o",
                    label=f"{pts[0]['factory']} ({pts[0]['bytes_per_vector']:.0f} B/vec)")
            for r in pts:
                if r["setting"] != "-":
                    ax.annotate(r["setting"].split("=")[1], (r["qps"], r[f"recall@{k}"]), fontsize=7)
        if n in exact:
            ax.axvline(exact[n], color="grey", ls="--", lw=1, label="exact brute force (faiss.knn)")
        ax.set_xscale("log")
        ax.set_xlabel("queries / s (batched, 2 cores)")
        ax.set_ylabel(f"recall@{k} vs exact")
        dims = "/".join(str(d) for d in sorted({r["dim"] for r in rows if r["n"] == n}))
        ax.set_title(f"{n / 1e6:g}M x {dims} vectors, sharded (labels: nprobe / efSearch)")
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=7, loc="lower left")
    save_figure(fig, png)
    print(f"plot -> {png}")


def main() -> None:
    import faiss

    ap = argparse.ArgumentParser(prog=f"python -m {__spec__.name}",
                                 description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n", type=int, default=1_000_000)
    ap.add_argument("--dim", type=int, default=128)
    ap.add_argument("--queries", type=int, default=1000)
    ap.add_argument("--k", type=int, default=100)
    ap.add_argument("--shards", type=int, default=4)
    ap.add_argument("--nlist", type=int, default=4096)
    ap.add_argument("--train-size", type=int, default=160_000)
    ap.add_argument("--types", nargs="+", default=list(TYPES), choices=list(TYPES))
    ap.add_argument("--threads", type=int, default=None, help="faiss OpenMP threads (default: all cores)")
    ap.add_argument("--work", default="/tmp/madr_bench_index")
    ap.add_argument("--json", default=None, help="merge the rows into this JSON file")
    ap.add_argument("--plot", nargs="+", default=None, help="only plot these JSON files (to --png)")
    ap.add_argument("--png", default="benchmarks/plots/index_recall_qps.png")
    args = ap.parse_args()
    if args.plot:
        plot(args.plot, args.png, args.k)
        return
    if args.threads:
        faiss.omp_set_num_threads(args.threads)
    work = Path(args.work)
    load = os.getloadavg()
    header = {"machine": arch_cores(), "load_before": load[0], "versions": versions_line("numpy", "faiss"),
              "threads": faiss.omp_get_max_threads(), "n": args.n, "dim": args.dim, "queries": args.queries,
              "k": args.k, "shards": args.shards, "nlist": args.nlist, "train_size": args.train_size}
    print(f"machine: {header['machine']}, load avg {load[0]:.2f}; {header['versions']} "
          f"(omp threads {header['threads']})")
    start = time.perf_counter()
    x, q = cached_data(work, args.n, args.dim, args.queries)
    print(f"{args.n} x {args.dim} vectors (200 Gaussian clusters, normalised; data ready in "
          f"{time.perf_counter() - start:.0f} s), {args.queries} queries, k={args.k}, {args.shards} shards, "
          f"nlist={args.nlist}, PQ m={args.dim // 4} x 8 bits, train sample {args.train_size}")
    exact, header["exact_qps"] = exact_topk(work, x, q, args.k)
    print(f"{'exact brute force (faiss.knn, 1 pass)':<36} recall@{args.k} 1.000  {header['exact_qps']:>8.0f} q/s  "
          f"{'':>14}{4 * args.dim:>5} B/vec")
    rows = []
    for name in args.types:
        rows += bench_type(name, x, q, exact, args, args.nlist, header["exact_qps"])
    header["load_after"] = os.getloadavg()[0]
    header["seconds"] = time.perf_counter() - start
    print(f"load avg after: {header['load_after']:.2f}; {header['seconds']:.0f} s in all")
    if args.json:
        merge_json(Path(args.json), header, rows)


if __name__ == "__main__":
    main()
