"""Benchmark: good and bad requests mixed under load, on the plain app and the Ray Serve app (issue 24).

``--clients`` closed-loop clients for ``--duration`` s against each app in turn (plain first, then Serve; both
up at once, as `benchmarks.speed.serve_api` starts them, on the same index and model). Each request is bad
with probability ``--bad-fraction``: one of `BAD` (every kind a 422 the API rejects: an unpaired surrogate in an
``/encode`` list, ``doc_id`` >= 2^63, malformed / non-UTF-8 JSON, a wrong type, an invisible-only query);
otherwise a good ``POST /search {"query", "k": 10}``. Reported per app: answers per status for good requests
and per bad kind, good requests that did not get 200, p50 / p99 latency and queries/s of the good ones.

``--kill-at S`` (Serve only) SIGKILLs one replica of ``searcher-0`` S seconds into the Serve run (with
``--searcher-replicas 2`` the other keeps answering): the answers after the kill are reported apart, with the
slowest, so a replica death under load is measured, not assumed.

    python -m benchmarks.speed.serve_mixed_load --duration 5                 # smoke, ~1.5 min
    python -m benchmarks.speed.serve_mixed_load                              # 16 clients, 30 s each, 30% bad
    python -m benchmarks.speed.serve_mixed_load --searcher-replicas 2 --kill-at 10
    python -m benchmarks.speed.serve_mixed_load --apps serve --searcher-replicas 1 --kill-at 10 --route-timeout 0.5
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import signal
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from benchmarks.common.machine import load_average
from benchmarks.speed.serve_api import build_corpus_index, build_model, machine_info, start_plain, wait_ready

# kind -> (path, JSON body or raw bytes); every one is answered 422 by both apps
BAD: dict[str, tuple[str, object]] = {
    "encode_unpaired_surrogate": ("/encode", {"texts": ["red shoes", "\ud800"]}),
    "explain_doc_id_2^63": ("/explain", {"query": "red shoes", "doc_id": 2**63}),
    "malformed_json": ("/search", b'{"query": "red shoes", '),
    "not_utf8": ("/search", b'{"query": "red sh\xffoes"}'),
    "k_as_string": ("/search", {"query": "red shoes", "k": "10"}),
    "zero_width_query": ("/search", {"query": "\u200b\u200c\u200d"}),
}


@dataclass
class Answer:
    kind: str  # "good" or a BAD key
    sent: float  # seconds since the run started
    took_s: float
    status: int  # 0: no HTTP answer
    retry_after: str | None


async def closed_loop(url: str, queries: list[str], clients: int, duration: float, bad_fraction: float,
                      seed: int, on_start=None) -> tuple[list[Answer], float]:
    import aiohttp

    answers: list[Answer] = []
    start = time.perf_counter()
    stop = start + duration

    async def client(session: aiohttp.ClientSession, i: int) -> None:
        rng = random.Random(seed * 1000 + i)
        n = i
        while time.perf_counter() < stop:
            if rng.random() < bad_fraction:
                kind = rng.choice(list(BAD))
                path, body = BAD[kind]
            else:
                kind, path, body = "good", "/search", {"query": queries[n % len(queries)], "k": 10}
                n += clients
            kw = {"data": body, "headers": {"Content-Type": "application/json"}} if isinstance(body, bytes) \
                else {"json": body}
            t = time.perf_counter()
            try:
                async with session.post(url + path, **kw) as r:
                    await r.read()
                    status, retry = r.status, r.headers.get("Retry-After")
            except (aiohttp.ClientError, asyncio.TimeoutError):
                status, retry = 0, None
            answers.append(Answer(kind, t - start, time.perf_counter() - t, status, retry))

    conn = aiohttp.TCPConnector(limit=clients)
    async with aiohttp.ClientSession(connector=conn, timeout=aiohttp.ClientTimeout(total=60)) as session:
        tasks = [asyncio.create_task(client(session, i)) for i in range(clients)]
        if on_start is not None:
            tasks.append(asyncio.create_task(on_start()))
        await asyncio.gather(*tasks)
    return answers, time.perf_counter() - start


def summary(answers: list[Answer], elapsed: float) -> dict:
    good = [a for a in answers if a.kind == "good"]
    ok = np.array([a.took_s for a in good if a.status == 200]) * 1000
    return {
        "good": dict(Counter(a.status for a in good)),
        "good_failed": sum(a.status != 200 for a in good),
        "good_qps": len(ok) / elapsed,
        "good_p50_ms": float(np.percentile(ok, 50)) if ok.size else float("nan"),
        "good_p99_ms": float(np.percentile(ok, 99)) if ok.size else float("nan"),
        "bad": {k: dict(Counter(a.status for a in answers if a.kind == k)) for k in BAD},
        "bad_not_422": sum(a.status != 422 for a in answers if a.kind != "good"),
        "requests": len(answers),
    }


def start_serve(manifest: Path, port: int, searcher_replicas: int, route_timeout_s: float = 1.0) -> None:
    import ray

    from serve.app import run_local
    from serve.config import DeploymentSettings, ServeSettings

    ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False, configure_logging=False)
    settings = ServeSettings(manifest_path=str(manifest), port=port, api_key_env="MADR_BENCH_NO_KEY",
                             topology="fanout", request_timeout_s=30, route_timeout_s=route_timeout_s,
                             log_level="WARNING", access_log=False,
                             encoder=DeploymentSettings(num_cpus=0.5, max_ongoing_requests=128),
                             searcher=DeploymentSettings(num_cpus=0.25, max_ongoing_requests=128,
                                                         num_replicas=searcher_replicas),
                             ingress=DeploymentSettings(num_cpus=0.25, max_ongoing_requests=256))
    run_local(settings)


def killer(at_s: float, log: dict):
    """A coroutine that SIGKILLs one replica of searcher-0 `at_s` seconds in (its pid and time into `log`)."""
    from ray import serve

    from serve.app import APP_NAME

    async def kill() -> None:
        await asyncio.sleep(at_s)
        handle = serve.get_deployment_handle("searcher-0", app_name=APP_NAME)
        infos = await handle.broadcast("info").results_async()
        pid = min(int(i["pid"]) for i in infos)
        os.kill(pid, signal.SIGKILL)
        log.update({"pid": pid, "at_s": at_s, "replicas_before": len(infos)})

    return kill


def main() -> None:
    p = argparse.ArgumentParser(prog=f"python -m {__spec__.name}", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--docs", type=int, default=20_000)
    p.add_argument("--shards", type=int, default=2)
    p.add_argument("--index", default="Flat")
    p.add_argument("--doc-terms", type=int, default=32)
    p.add_argument("--backbone", default="tiny", help="'tiny' (random 1-layer model) or a packaged backbone")
    p.add_argument("--clients", type=int, default=16)
    p.add_argument("--duration", type=float, default=30.0)
    p.add_argument("--bad-fraction", type=float, default=0.3)
    p.add_argument("--searcher-replicas", type=int, default=1)
    p.add_argument("--kill-at", type=float, default=None, help="Serve run: SIGKILL a searcher-0 replica at S s")
    p.add_argument("--route-timeout", type=float, default=1.0, help="Serve: route_timeout_s (503 after it)")
    p.add_argument("--apps", default="plain,serve")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default="/tmp/madr_bench_serve_mixed")
    p.add_argument("--json", default=None, help="also write the summary here")
    args = p.parse_args()
    Path(args.out).mkdir(parents=True, exist_ok=True)
    print(machine_info(), flush=True)
    from madr.data.synthetic.catalog import generate_catalog

    model_dir = build_model(Path(args.out), args.backbone)
    args.nprobe = None
    manifest = build_corpus_index(args, model_dir)
    queries = [q.text for q in generate_catalog(300, 500, seed=1).queries]
    apps = args.apps.split(",")
    ports = {"plain": 18441, "serve": 18442}
    urls = {name: f"http://127.0.0.1:{port}" for name, port in ports.items()}
    plain = start_plain(manifest, ports["plain"], None) if "plain" in apps else None
    results: dict[str, dict] = {}
    try:
        if "serve" in apps:
            start_serve(manifest, ports["serve"], args.searcher_replicas, args.route_timeout)
            wait_ready(urls["serve"], 600)
        if plain is not None:
            wait_ready(urls["plain"], 600, plain)
        for name in apps:
            kill_log: dict = {}
            on_start = killer(args.kill_at, kill_log) if name == "serve" and args.kill_at is not None else None
            load = load_average()
            answers, elapsed = asyncio.run(closed_loop(urls[name], queries, args.clients, args.duration,
                                                       args.bad_fraction, args.seed, on_start))
            r = summary(answers, elapsed) | {"load_average_before": load, "load_average_after": load_average()}
            if kill_log:
                after = [a for a in answers if a.sent >= kill_log["at_s"]]
                slow = max((a.took_s for a in after if a.kind == "good"), default=float("nan"))
                r["kill"] = kill_log | {"after": summary(after, elapsed - kill_log["at_s"]),
                                        "slowest_good_after_s": slow,
                                        "slowest_503_after_s": max((a.took_s for a in after if a.status == 503),
                                                                   default=float("nan")),
                                        "503_after_ms_p50_p99": [float(np.percentile(t, q)) * 1000 for q in (50, 99)]
                                        if (t := [a.took_s for a in after if a.status == 503]) else [],
                                        "503_without_retry_after": sum(a.status == 503 and a.retry_after != "1"
                                                                       for a in after)}
            results[name] = r
            print(f"{name}: {json.dumps(r)}", flush=True)
    finally:
        if plain is not None:
            plain.send_signal(signal.SIGTERM)
            plain.wait(timeout=30)
        if "serve" in apps:
            from ray import serve

            serve.shutdown()
    report(args, results)


def report(args: argparse.Namespace, results: dict) -> None:
    print(f"\n{args.docs:,} docs, {args.shards} shards ({args.index}), backbone {args.backbone}; {args.clients} "
          f"clients x {args.duration:g} s per app, {args.bad_fraction:.0%} bad; Serve searcher replicas "
          f"{args.searcher_replicas}" + (f", one SIGKILLed at {args.kill_at:g} s" if args.kill_at else "")
          + f"; route_timeout_s {args.route_timeout:g}")
    print("| app (load avg before -> after) | good: answers by status | good failed | good q/s | good p50 / p99 ms "
          "| bad: answers by status | bad not 422 |")
    print("|---|---|---|---|---|---|---|")
    for name, r in results.items():
        bad = Counter()
        for counts in r["bad"].values():
            bad.update(counts)
        fmt = lambda c: ", ".join(f"{s}: {n}" for s, n in sorted(c.items()))  # noqa: E731
        print(f"| {name} ({r['load_average_before'].split(' / ')[0]} -> {r['load_average_after'].split(' / ')[0]}) "
              f"| {fmt(r['good'])} | {r['good_failed']} | {r['good_qps']:.1f} | {r['good_p50_ms']:.0f} / "
              f"{r['good_p99_ms']:.0f} | {fmt(bad)} | {r['bad_not_422']} |")
    if args.json:
        Path(args.json).write_text(json.dumps({"args": vars(args), "results": results}, indent=1))


if __name__ == "__main__":
    main()
