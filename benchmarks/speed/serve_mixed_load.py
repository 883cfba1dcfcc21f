"""Good and bad requests mixed under load (`CLIENTS` clients, `BAD_FRACTION` bad), bursts of good requests
(`BURSTS`), and replica deaths (`--light-kill`, `--burst-kill`, `--kill-at`), on the plain app and the Ray Serve apps
(`--apps`) over `speed.serve_api`'s index (`DOCS` documents, `INDEX`) and the tiny random hybrid model:
answers by status, latency of the good ones, 503s with and without `Retry-After`. Serve runs with `ServeSettings`'
timeouts, queue bound and batch sizes (`--route-timeout` aside).

    python -m benchmarks.speed.serve_mixed_load --duration 5 --burst-kill 0   # smoke
    python -m benchmarks.speed.serve_mixed_load --light-kill --burst-kill 140 --json out.json
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import signal
import time
from collections import Counter
from pathlib import Path

import numpy as np

from benchmarks.common.config import parser, write_json
from benchmarks.common.machine import load_average
from benchmarks.speed.serve_api import (
    Answer,
    bench_queries,
    build_corpus_index,
    build_model,
    closed_loop,
    direct_url,
    machine_info,
    percentile,
    post,
    start_plain,
    start_serve,
    stop_apps,
    wait_ready,
)

DOCS, INDEX, OUT = 20_000, "Flat", Path("/tmp/madr_bench_serve_mixed")
CLIENTS, BAD_FRACTION = 16, 0.3  # the steady phase's closed-loop clients and share of bad requests
BURSTS, BURST_PAUSE, BURST_KILL_AT = (140, 140, 140, 140, 500), 3.0, 1.0  # sizes, s before each, a kill's s into one

# kind -> (path, JSON body or raw bytes); every one is answered 422 by both apps
BAD: dict[str, tuple[str, object]] = {
    "encode_unpaired_surrogate": ("/encode", {"texts": ["red shoes", "\ud800"]}),
    "explain_doc_id_2^63": ("/explain", {"query": "red shoes", "doc_id": 2**63}),
    "malformed_json": ("/search", b'{"query": "red shoes", '),
    "not_utf8": ("/search", b'{"query": "red sh\xffoes"}'),
    "k_as_string": ("/search", {"query": "red shoes", "k": "10"}),
    "zero_width_query": ("/search", {"query": "\u200b\u200c\u200d"}),
}


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
FRONT = {"max_ongoing_requests": 128, "max_queued_requests": 256}  # the ingress's / Colocated's (then Serve's queue)


def serve_apps(manifest: Path, port: int, args: argparse.Namespace, topologies: list[str]) -> dict[str, str]:
    """`start_serve` with the route timeout and searcher replicas of the arguments."""
    from serve.config import DeploymentSettings

    return start_serve(manifest, port, topologies, direct=args.throughput_mode, route_timeout_s=args.route_timeout,
                       encoder=DeploymentSettings(num_cpus=0.5, max_ongoing_requests=128),
                       searcher=DeploymentSettings(num_cpus=0.25, max_ongoing_requests=128,
                                                   num_replicas=args.searcher_replicas),
                       ingress=DeploymentSettings(num_cpus=0.25, **FRONT),
                       colocated=DeploymentSettings(num_cpus=1.0, **FRONT))


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
        return Answer("good", t - start, time.perf_counter() - t, status, retry, body)

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
        "why_not_200": dict(Counter(f"{a.status} {_why(a.body)}" for a in answers if a.status != 200)),
        "elapsed_s": elapsed,
    }


def run_bursts(url: str, queries: list[str]) -> list[dict]:
    out = []
    for n in BURSTS:
        time.sleep(BURST_PAUSE)
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


def light_kill(app: str, url: str, queries: list[str]) -> dict:
    """4 clients for 15 s, a replica SIGKILLed 5 s in."""
    log: dict = {}
    answers, elapsed = asyncio.run(closed_loop(url, queries, 4, 15.0, on_start=killer(app, 5.0, log)))
    return after_kill(answers, log, elapsed)


def burst_kill(app: str, url: str, queries: list[str], n: int) -> dict:
    """A burst of `n`, a replica SIGKILLed `BURST_KILL_AT` s in."""
    log: dict = {}
    answers, elapsed = asyncio.run(burst(url, queries, n, killer(app, BURST_KILL_AT, log)))
    return after_kill(answers, log, elapsed) | {"burst": burst_summary(answers, elapsed)}


def parse_args() -> argparse.Namespace:
    p = parser(__spec__.name, __doc__)
    p.add_argument("--duration", type=float, default=30.0, help="steady mixed load per app, s (0: skip)")
    p.add_argument("--light-kill", action="store_true", help="Serve apps: SIGKILL a replica under 4 clients")
    p.add_argument("--burst-kill", type=int, default=140, help="Serve apps: a burst of N with a replica SIGKILLed "
                   f"{BURST_KILL_AT:g} s in (0: none)")
    p.add_argument("--bursts-after-kills", action="store_true",
                   help="the --kill-apps: the bursts again after the kills, on the replaced replicas")
    p.add_argument("--kill-apps", default="fanout", help="the Serve apps the kill phases run on")
    p.add_argument("--searcher-replicas", type=int, default=1)
    p.add_argument("--kill-at", type=float, default=None, help="--kill-apps' steady runs: SIGKILL a replica at S s")
    p.add_argument("--route-timeout", type=float, default=1.0, help="Serve: route_timeout_s (no live replica: 503)")
    p.add_argument("--apps", default="plain,fanout,colocated", help="plain, fanout, colocated, colocated-direct")
    p.add_argument("--throughput-mode", action="store_true", help="Serve's throughput mode (colocated-direct: on)")
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
        answers, elapsed = asyncio.run(closed_loop(url, queries, CLIENTS, args.duration, bad=BAD,
                                                   bad_fraction=BAD_FRACTION, on_start=on_start))
        r["steady"] = summary(answers, elapsed) | {"load_average_before": load, "load_average_after": load_average()}
        if kill_log:
            r["steady"]["kill"] = after_kill(answers, kill_log, elapsed)
            wait_ready(url, 120, query=queries[0])
        print(f"{name} steady: {json.dumps(r['steady'])}", flush=True)
    print(f"{name} bursts:", flush=True)
    r["bursts"] = run_bursts(url, queries)
    if kills and args.light_kill:
        time.sleep(BURST_PAUSE)
        r["light_kill"] = light_kill(name, url, queries)
        print(f"{name} light-load kill: {json.dumps(r['light_kill'])}", flush=True)
        wait_ready(url, 120, query=queries[0])
    if kills and args.burst_kill:
        time.sleep(BURST_PAUSE)
        r["burst_kill"] = burst_kill(name, url, queries, args.burst_kill)
        print(f"{name} kill during a burst: {json.dumps(r['burst_kill'])}", flush=True)
        wait_ready(url, 120, query=queries[0])
    if kills and args.bursts_after_kills:  # the same bursts on the replaced replicas
        time.sleep(BURST_PAUSE)
        print(f"{name} bursts after the kills:", flush=True)
        r["bursts_after_kills"] = run_bursts(url, queries)
    return r


def main() -> None:
    args = parse_args()
    OUT.mkdir(parents=True, exist_ok=True)
    print(machine_info(), flush=True)
    manifest = build_corpus_index(OUT, DOCS, INDEX, "tiny", build_model(OUT, "tiny"))
    queries = bench_queries()
    apps = args.apps.split(",")
    args.throughput_mode = args.throughput_mode or DIRECT in apps
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
    print(f"\n{DOCS:,} docs ({INDEX}), tiny backbone; Serve: searcher replicas {args.searcher_replicas}, ingress / "
          f"Colocated {FRONT}, route_timeout_s {args.route_timeout:g}; Serve's throughput mode "
          f"{'on' if args.throughput_mode else 'off'}; Ray worker niceness {os.environ.get('RAY_worker_niceness')}")
    steady = {n: r["steady"] for n, r in results.items() if "steady" in r}
    if steady:
        print(f"\nSteady: {CLIENTS} clients x {args.duration:g} s per app, {BAD_FRACTION:.0%} bad")
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
    print("\nBursts (good POST /search, all sent at once; why not 200: each burst's line above)")
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
        for key, what in (("light_kill", "4 clients"), ("burst_kill", f"a burst of {args.burst_kill}")):
            if (k := r.get(key)) is None:
                continue
            print(f"\n{name}: a {k['deployment']} replica of {k['replicas_before']} SIGKILLed {k['at_s']:.1f} s into "
                  f"{what}: after the kill {_counts(k['after'])}; slowest {k['slowest_after_s']:.2f} s, slowest 503 "
                  f"{k['slowest_503_s']:.2f} s; 503 without Retry-After {k['503_without_retry_after']}, 500s "
                  f"{k['500']}; the last non-200 {k['normal_after_s']:.1f} s after the kill")
    if args.json:
        settings = {"docs": DOCS, "index": INDEX, "backbone": "tiny", "clients": CLIENTS, "bad_fraction": BAD_FRACTION,
                    "bursts": BURSTS, "burst_pause": BURST_PAUSE, "burst_kill_at": BURST_KILL_AT, **FRONT}
        write_json(args.json, {"args": {**vars(args), **settings}, "machine": machine_info(), "results": results})


if __name__ == "__main__":
    main()
