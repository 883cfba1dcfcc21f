"""Good and bad requests mixed under load, bursts of good requests, and replica deaths (`--light-kill`,
`--burst-kill`, `--kill-at`), on the plain app and the Ray Serve apps (`--apps`) over `speed.serve_api`'s index
and model: answers by status, latency of the good ones, 503s with and without `Retry-After`.

    python -m benchmarks.speed.serve_mixed_load --duration 5 --bursts 140 --burst-kill 0   # smoke, ~2 min
    python -m benchmarks.speed.serve_mixed_load --light-kill --burst-kill 140 --json out.json
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import re
import signal
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from benchmarks.common.config import parser, write_json
from benchmarks.common.machine import load_average
from benchmarks.common.process import add_ray_niceness_arg, set_ray_worker_niceness
from benchmarks.speed.serve_api import (
    build_corpus_index,
    build_model,
    direct_url,
    machine_info,
    percentile,
    post,
    start_plain,
    start_serve,
    stop_apps,
    wait_ready,
)

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
    detail: str = ""  # a non-200 answer's message (bursts)


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
            t = time.perf_counter()
            status, retry, _ = await post(session, url + path, body)
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
        "good_p50_ms": percentile(ok, 50), "good_p99_ms": percentile(ok, 99),
        "bad": {k: dict(Counter(a.status for a in answers if a.kind == k)) for k in BAD},
        "bad_not_422": sum(a.status != 422 for a in answers if a.kind != "good"),
        "requests": len(answers),
    }


SERVE_APPS = ("fanout", "colocated")
DIRECT = "colocated-direct"  # the co-located app called at its replica's own port (`serve.direct_ingress`)
KILL_TARGET = {"fanout": "searcher-0", "colocated": "Colocated"}  # the deployment a kill phase hits
INGRESS_MAX_ONGOING = 128  # the ingress's / Colocated's max_ongoing_requests (then --max-queued in Serve's queue)


def serve_apps(manifest: Path, port: int, args: argparse.Namespace, topologies: list[str]) -> dict[str, str]:
    """`start_serve` with the timeouts, queue and replicas of the arguments."""
    from serve.config import DeploymentSettings

    set_ray_worker_niceness(args.ray_worker_niceness)  # the proxy and replicas at the client's and plain app's priority
    front = {"max_ongoing_requests": INGRESS_MAX_ONGOING, "max_queued_requests": args.max_queued}
    return start_serve(manifest, port, topologies, request_timeout_s=args.request_timeout,
                       route_timeout_s=args.route_timeout, queue_timeout_s=args.queue_timeout,
                       encoder_max_batch_size=args.batch_size, searcher_max_batch_size=args.batch_size,
                       encoder=DeploymentSettings(num_cpus=0.5, max_ongoing_requests=128),
                       searcher=DeploymentSettings(num_cpus=0.25, max_ongoing_requests=128,
                                                   num_replicas=args.searcher_replicas),
                       ingress=DeploymentSettings(num_cpus=0.25, **front),
                       colocated=DeploymentSettings(num_cpus=1.0, **front))


def killer(app: str, at_s: float, log: dict):
    """A coroutine that SIGKILLs one replica of `app`'s `KILL_TARGET` deployment `at_s` s after it starts."""
    from ray._private.state import actors as actor_table

    async def kill() -> None:
        t0 = time.perf_counter()  # the load starts now too
        name = f"ServeReplica:madr_{app}:{KILL_TARGET[app]}"  # from Ray's actor table: no handle bound to a loop
        table = await asyncio.to_thread(actor_table, actor_state_name="ALIVE")
        actors = [a for a in table.values() if a["ActorClassName"] == name]
        pid = min(int(a["Pid"]) for a in actors)
        await asyncio.sleep(max(0.0, at_s - (time.perf_counter() - t0)))
        os.kill(pid, signal.SIGKILL)
        log.update({"deployment": KILL_TARGET[app], "pid": pid, "at_s": time.perf_counter() - t0,
                    "replicas_before": len(actors)})

    return kill


async def burst(url: str, queries: list[str], n: int, on_start=None) -> tuple[list[Answer], float]:
    """`n` good POST /search sent at once, each on its own connection; every answer recorded."""
    import aiohttp

    start = time.perf_counter()

    async def one(session: aiohttp.ClientSession, i: int) -> Answer:
        t = time.perf_counter()
        status, retry, body = await post(session, url + "/search", {"query": queries[i % len(queries)], "k": 10})
        detail = "" if status == 200 else _why(body)
        return Answer("good", t - start, time.perf_counter() - t, status, retry, detail)

    conn = aiohttp.TCPConnector(limit=n)
    async with aiohttp.ClientSession(connector=conn, timeout=aiohttp.ClientTimeout(total=120)) as session:
        extra = [asyncio.create_task(on_start())] if on_start is not None else []
        answers = await asyncio.gather(*[one(session, i) for i in range(n)])
        await asyncio.gather(*extra)
    return list(answers), time.perf_counter() - start


def _why(body: bytes) -> str:
    """A non-200 answer's reason, without the numbers that vary (e.g. "Colocated: no live replica for # s")."""
    try:
        text = str(json.loads(body).get("error", ""))
    except (ValueError, AttributeError):
        text = body.decode("utf-8", "replace")
    return re.sub(r"\d+(\.\d+)?", "#", text)[:90]


def burst_summary(answers: list[Answer], elapsed: float) -> dict:
    ok = np.array([a.took_s for a in answers if a.status == 200])
    shed = [a.took_s for a in answers if a.status == 503]
    return {
        "n": len(answers), "by_status": dict(Counter(a.status for a in answers)),
        "ok_fraction": len(ok) / max(len(answers), 1),
        "ok_p50_s": percentile(ok, 50), "ok_p99_s": percentile(ok, 99), "ok_max_s": percentile(ok, 100),
        "503_max_s": max(shed, default=float("nan")), "503_p50_s": percentile(shed, 50),
        "503_within_1s": sum(t <= 1.0 for t in shed),
        "slowest_s": max((a.took_s for a in answers), default=float("nan")),
        "5xx_without_retry_after": sum(a.status in (503, 504) and a.retry_after != "1" for a in answers),
        "500": sum(a.status == 500 for a in answers), "no_answer": sum(a.status == 0 for a in answers),
        "why_not_200": dict(Counter(f"{a.status} {a.detail}" for a in answers if a.status != 200)),
        "elapsed_s": elapsed,
    }


def run_bursts(url: str, queries: list[str], sizes: list[int], pause_s: float) -> list[dict]:
    out = []
    for n in sizes:
        time.sleep(pause_s)
        load = load_average()
        answers, elapsed = asyncio.run(burst(url, queries, n))
        r = burst_summary(answers, elapsed) | {"load_average_before": load}
        print(f"  burst of {n}: {json.dumps(r)}", flush=True)
        out.append(r)
    return out


def after_kill(answers: list[Answer], kill_log: dict, elapsed: float) -> dict:
    """What the answers after the kill were (`kill_log` from `killer`)."""
    at = kill_log["at_s"]
    after = [a for a in answers if a.sent + a.took_s >= at and a.kind == "good"]
    bad = [a for a in after if a.status != 200]
    return kill_log | {
        "after": dict(Counter(a.status for a in after)),
        "slowest_after_s": max((a.took_s for a in after), default=float("nan")),
        "slowest_503_s": max((a.took_s for a in bad if a.status == 503), default=float("nan")),
        "503_without_retry_after": sum(a.status == 503 and a.retry_after != "1" for a in after),
        "500": sum(a.status == 500 for a in after),
        "normal_after_s": max((a.sent + a.took_s - at for a in bad), default=0.0),
        "elapsed_s": elapsed,
    }


def light_kill(app: str, url: str, queries: list[str], seed: int) -> dict:
    """4 clients for 15 s, a replica SIGKILLed 5 s in."""
    log: dict = {}
    answers, elapsed = asyncio.run(closed_loop(url, queries, 4, 15.0, 0.0, seed, killer(app, 5.0, log)))
    return after_kill(answers, log, elapsed)


def burst_kill(app: str, url: str, queries: list[str], n: int, at_s: float) -> dict:
    """A burst of `n`, a replica SIGKILLed `at_s` in."""
    log: dict = {}
    answers, elapsed = asyncio.run(burst(url, queries, n, killer(app, at_s, log)))
    return after_kill(answers, log, elapsed) | {"burst": burst_summary(answers, elapsed)}


def parse_args() -> argparse.Namespace:
    p = parser(__spec__.name, __doc__)
    p.add_argument("--docs", type=int, default=20_000)
    p.add_argument("--shards", type=int, default=2)
    p.add_argument("--index", default="Flat")
    p.add_argument("--doc-terms", type=int, default=32)
    p.add_argument("--backbone", default="tiny", help="'tiny' (random 1-layer model) or a packaged backbone")
    p.add_argument("--clients", type=int, default=16)
    p.add_argument("--duration", type=float, default=30.0, help="steady mixed load per app, s (0: skip)")
    p.add_argument("--bad-fraction", type=float, default=0.3)
    p.add_argument("--bursts", default="140,140,140,140,500", help="burst sizes, comma-separated ('': none)")
    p.add_argument("--burst-pause", type=float, default=3.0, help="seconds before each burst")
    p.add_argument("--light-kill", action="store_true", help="Serve apps: SIGKILL a replica under 4 clients")
    p.add_argument("--burst-kill", type=int, default=140, help="Serve apps: a burst of N with a replica SIGKILLed "
                   "--burst-kill-at s in (0: none)")
    p.add_argument("--burst-kill-at", type=float, default=1.0)
    p.add_argument("--bursts-after-kills", action="store_true",
                   help="the --kill-apps: the bursts again after the kills, on the replaced replicas")
    p.add_argument("--kill-apps", default="fanout", help="the Serve apps the kill phases run on")
    p.add_argument("--searcher-replicas", type=int, default=1)
    p.add_argument("--kill-at", type=float, default=None, help="--kill-apps' steady runs: SIGKILL a replica at S s")
    p.add_argument("--route-timeout", type=float, default=1.0, help="Serve: route_timeout_s (no live replica: 503)")
    p.add_argument("--request-timeout", type=float, default=10.0, help="Serve: request_timeout_s (504 after it)")
    p.add_argument("--max-queued", type=int, default=256, help="Serve: the ingress's max_queued_requests")
    p.add_argument("--batch-size", type=int, default=64, help="Serve: the encoder's and searchers' max batch size")
    p.add_argument("--queue-timeout", type=float, default=None, help="Serve: queue_timeout_s (half the request's)")
    p.add_argument("--apps", default="plain,fanout,colocated", help="plain, fanout, colocated, colocated-direct")
    p.add_argument("--throughput-mode", action="store_true", help="Serve's throughput mode (colocated-direct: on)")
    add_ray_niceness_arg(p)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default="/tmp/madr_bench_serve_mixed")
    p.add_argument("--json", default=None, help="also write the summary here")
    return p.parse_args()


def measure(name: str, url: str, queries: list[str], args: argparse.Namespace) -> dict:
    """Every phase the arguments ask for, on one app."""
    r: dict = {}
    kills = name in args.kill_apps.split(",")
    if args.duration > 0:
        kill_log: dict = {}
        on_start = killer(name, args.kill_at, kill_log) if kills and args.kill_at is not None else None
        load = load_average()
        answers, elapsed = asyncio.run(closed_loop(url, queries, args.clients, args.duration, args.bad_fraction,
                                                   args.seed, on_start))
        r["steady"] = summary(answers, elapsed) | {"load_average_before": load, "load_average_after": load_average()}
        if kill_log:
            r["steady"]["kill"] = after_kill(answers, kill_log, elapsed)
            wait_ready(url, 120, query=queries[0])
        print(f"{name} steady: {json.dumps(r['steady'])}", flush=True)
    sizes = [int(n) for n in args.bursts.split(",") if n.strip()]
    if sizes:
        print(f"{name} bursts:", flush=True)
        r["bursts"] = run_bursts(url, queries, sizes, args.burst_pause)
    if kills and args.light_kill:
        time.sleep(args.burst_pause)
        r["light_kill"] = light_kill(name, url, queries, args.seed)
        print(f"{name} light-load kill: {json.dumps(r['light_kill'])}", flush=True)
        wait_ready(url, 120, query=queries[0])
    if kills and args.burst_kill:
        time.sleep(args.burst_pause)
        r["burst_kill"] = burst_kill(name, url, queries, args.burst_kill, args.burst_kill_at)
        print(f"{name} kill during a burst: {json.dumps(r['burst_kill'])}", flush=True)
        wait_ready(url, 120, query=queries[0])
    if kills and sizes and args.bursts_after_kills:  # the same bursts on the replaced replicas
        time.sleep(args.burst_pause)
        print(f"{name} bursts after the kills:", flush=True)
        r["bursts_after_kills"] = run_bursts(url, queries, sizes, args.burst_pause)
    return r


def main() -> None:
    args = parse_args()
    Path(args.out).mkdir(parents=True, exist_ok=True)
    print(machine_info(), flush=True)
    from madr.data.synthetic.catalog import generate_catalog

    model_dir = build_model(Path(args.out), args.backbone)
    args.nprobe = None
    manifest = build_corpus_index(args, model_dir)
    queries = [q.text for q in generate_catalog(300, 500, seed=1).queries]
    apps = args.apps.split(",")
    args.throughput_mode = args.throughput_mode or DIRECT in apps
    if args.throughput_mode:  # before Ray starts: the mode is read by every Serve process (a cluster-wide setting)
        from serve.direct_ingress import throughput_env

        throughput_env()
    topologies = [a for a in SERVE_APPS if a in apps or (a == "colocated" and DIRECT in apps)]
    urls = {"plain": "http://127.0.0.1:18441"}
    plain = start_plain(manifest, 18441, None) if "plain" in apps else None
    results: dict[str, dict] = {}
    try:
        if topologies:
            urls |= serve_apps(manifest, 18442, args, topologies)
            for topology in topologies:
                wait_ready(urls[topology], 600)
        if plain is not None:
            wait_ready(urls["plain"], 600, plain)
        for name in apps:
            if name == DIRECT:  # asked now: a kill phase of the co-located app replaced its replica (a new port)
                urls[DIRECT] = direct_url("madr_colocated")
            results[name] = measure(name, urls[name], queries, args)
    finally:
        stop_apps(plain, 30)
    report(args, results)


def _counts(c: dict) -> str:
    return ", ".join(f"{s}: {n}" for s, n in sorted(c.items(), key=lambda kv: int(kv[0])))


def report(args: argparse.Namespace, results: dict) -> None:
    print(f"\n{args.docs:,} docs, {args.shards} shards ({args.index}), backbone {args.backbone}; Serve: searcher "
          f"replicas {args.searcher_replicas}, ingress / Colocated max_ongoing_requests {INGRESS_MAX_ONGOING} + "
          f"max_queued_requests {args.max_queued}, route_timeout_s {args.route_timeout:g}, request_timeout_s "
          f"{args.request_timeout:g}, queue_timeout_s "
          f"{args.queue_timeout if args.queue_timeout is not None else args.request_timeout / 2:g}; Serve's "
          f"throughput mode {'on' if args.throughput_mode else 'off'}; Ray worker niceness {args.ray_worker_niceness}")
    steady = {n: r["steady"] for n, r in results.items() if "steady" in r}
    if steady:
        print(f"\nSteady: {args.clients} clients x {args.duration:g} s per app, {args.bad_fraction:.0%} bad")
        print("| app (load avg before -> after) | good: answers by status | good failed | good q/s "
              "| good p50 / p99 ms | bad: answers by status | bad not 422 |")
        print("|---|---|---|---|---|---|---|")
        for name, r in steady.items():
            bad = Counter()
            for counts in r["bad"].values():
                bad.update(counts)
            print(f"| {name} ({r['load_average_before'].split(' / ')[0]} -> "
                  f"{r['load_average_after'].split(' / ')[0]}) | {_counts(r['good'])} | {r['good_failed']} | "
                  f"{r['good_qps']:.1f} | {r['good_p50_ms']:.0f} / {r['good_p99_ms']:.0f} | {_counts(bad)} | "
                  f"{r['bad_not_422']} |")
    if any("bursts" in r for r in results.values()):
        print("\nBursts (good POST /search, all sent at once)")
        print("| app | burst | answers by status | 200 | 200 p50 / p99 / max s | 503 p50 / max s (within 1 s) "
              "| 503/504 without Retry-After | load before |")
        print("|---|---|---|---|---|---|---|---|")
        for name, r in results.items():
            for key, label in (("bursts", name), ("bursts_after_kills", f"{name}, after the kills")):
                for b in r.get(key, []):
                    print(f"| {label} | {b['n']} | {_counts(b['by_status'])} | {b['ok_fraction']:.1%} | "
                          f"{b['ok_p50_s']:.2f} / {b['ok_p99_s']:.2f} / {b['ok_max_s']:.2f} | "
                          f"{b['503_p50_s']:.2f} / {b['503_max_s']:.2f} ({b['503_within_1s']}) | "
                          f"{b['5xx_without_retry_after']} | {b['load_average_before'].split(' / ')[0]} |")
        for name, r in results.items():
            for b in r.get("bursts", []) + r.get("bursts_after_kills", []):
                if b["why_not_200"]:
                    print(f"  {name}, burst of {b['n']}, not 200: {b['why_not_200']}")
    for name, r in results.items():
        for key, what in (("light_kill", "4 clients"), ("burst_kill", f"a burst of {args.burst_kill}")):
            if (k := r.get(key)) is None:
                continue
            print(f"\n{name}: a {k['deployment']} replica of {k['replicas_before']} SIGKILLed {k['at_s']:.1f} s into "
                  f"{what}: after the kill {_counts(k['after'])}; slowest {k['slowest_after_s']:.2f} s, slowest 503 "
                  f"{k['slowest_503_s']:.2f} s; 503 without Retry-After {k['503_without_retry_after']}, 500s "
                  f"{k['500']}; the last non-200 {k['normal_after_s']:.1f} s after the kill")
    if args.json:
        write_json(args.json, {"args": vars(args), "machine": machine_info(), "results": results})


if __name__ == "__main__":
    main()
