"""`benchmarks.speed.ingest`'s results: best runs, Ray / loop ratios, the crossing size and the sweep's plot."""

from __future__ import annotations

import argparse
import math

from benchmarks.common.plotting import pyplot, save_figure


def _rate(r: dict) -> float:
    return r["rows"] / r["seconds"]


def report(mode: str, runs: list[dict], good: int) -> dict:
    """Print and return the best run of `mode` (Ray: its best cold, best warm and best cold + init)."""
    for r in runs:
        assert r["rows"] == good and r["balanced"], f"{mode}: {r['rows']} good rows, expected {good}"
    best = dict(min(runs, key=lambda r: r["seconds"]))
    times = ", ".join(f"{r['seconds']:.1f}" for r in runs)
    others = ", ".join(f"{r['others_cores']:.2f}" for r in runs)
    line = (f"{mode:<13} {_rate(best):>8,.0f} rows/s  {best['seconds']:6.2f} s (runs: {times})  CPU "
            f"{best['cpu']:6.1f} s ({1e6 * best['cpu'] / good:.0f} us/row)  peak PSS {best['peak_bytes'] / 2**20:,.0f} "
            f"MiB  first batch {best['first_batch']:.2f} s  others' load {others} cores  quarantined {best['bad']}")
    if "warm" in best:
        warm = min((r["warm"] for r in runs), key=lambda r: r["seconds"])
        assert all(r["warm"]["rows"] == good and r["warm"]["balanced"] for r in runs)
        assert warm["tokens"] == best["tokens"]
        with_init = min(runs, key=lambda r: r["seconds"] + r["init"])
        best.update(warm_best=warm, init_best=min(r["init"] for r in runs),
                    with_init_seconds=with_init["seconds"] + with_init["init"])
        line += (f"\n{'':<13} warm: {_rate(warm):>8,.0f} rows/s  {warm['seconds']:6.2f} s  CPU {warm['cpu']:6.1f} s "
                 f"({1e6 * warm['cpu'] / good:.0f} us/row)  first batch {warm['first_batch']:.2f} s  others' load "
                 f"{warm['others_cores']:.2f} cores; cold + ray.init: {good / best['with_init_seconds']:,.0f} rows/s "
                 f"(ray.init {best['init_best']:.1f} s)")
        line += "".join(f"\n{'':<15}{s}" for s in warm["stats"])
    if "stages" in best:
        line += f"\n{'':<13} stages (s): " + ", ".join(f"{k} {v:.2f}" for k, v in best["stages"].items())
    print(line, flush=True)
    return best


def ratios(results: dict[str, dict], args: argparse.Namespace) -> dict[str, float]:
    """Throughput of each Ray figure over each loop's (>1: Ray is faster), and the 1 -> N worker scaling."""
    out: dict[str, float] = {}
    for base in ("loop", "loop_threads"):
        for mode in [m for m in results if m.startswith("ray")]:
            if base not in results:
                continue
            b = results[base]["seconds"]
            out[f"{mode}/{base} cold"] = b / results[mode]["seconds"]
            out[f"{mode}/{base} warm"] = b / results[mode]["warm_best"]["seconds"]
            out[f"{mode}/{base} cold+init"] = b / results[mode]["with_init_seconds"]
    if "ray_tasks" in results and "ray_tasks_w1" in results:
        one, many = results["ray_tasks_w1"]["warm_best"]["seconds"], results["ray_tasks"]["warm_best"]["seconds"]
        out[f"ray_tasks {args.workers} workers / 1 worker warm"] = one / many
    return out


def crossings(sizes: list[int], per_size: dict[int, dict[str, dict]]) -> dict[str, float | None]:
    """The row count where ray_tasks' throughput reaches the loop's, per Ray figure (log-linear interpolation
    of the ratio between the two neighbouring sizes; None when it never does, the smallest size when always)."""
    out: dict[str, float | None] = {}
    for key, seconds in (("warm", lambda r: r["warm_best"]["seconds"]), ("cold", lambda r: r["seconds"]),
                         ("cold+init", lambda r: r["with_init_seconds"])):
        ratio = [per_size[n]["loop"]["seconds"] / seconds(per_size[n]["ray_tasks"]) for n in sizes]
        out[key] = None
        for i, r in enumerate(ratio):
            if r >= 1.0:
                if i == 0:
                    out[key] = float(sizes[0])
                else:
                    lo, hi = math.log(sizes[i - 1]), math.log(sizes[i])
                    frac = (1.0 - ratio[i - 1]) / (r - ratio[i - 1])
                    out[key] = float(math.exp(lo + frac * (hi - lo)))
                break
    return out


def plot(path: str, sizes: list[int], per_size: dict[int, dict[str, dict]], title: str) -> None:
    plt = pyplot()
    if plt is None:
        return

    fig, ax = plt.subplots(figsize=(7, 4.2))
    modes = list(per_size[sizes[0]])
    for mode in modes:
        ax.plot(sizes, [_rate(per_size[n][mode]) for n in sizes], marker="o",
                label=mode if mode.startswith("loop") else f"{mode} cold")
        if mode.startswith("ray"):
            ax.plot(sizes, [per_size[n][mode]["rows"] / per_size[n][mode]["warm_best"]["seconds"] for n in sizes],
                    marker="s", linestyle="--", label=f"{mode} warm")
            ax.plot(sizes, [per_size[n][mode]["rows"] / per_size[n][mode]["with_init_seconds"] for n in sizes],
                    marker="^", linestyle=":", label=f"{mode} cold + ray.init")
    ax.set_xscale("log")
    ax.set_xlabel("input rows (SNLI-layout JSONL, 3% bad)")
    ax.set_ylabel("good rows/s (read + validate + tokenise)")
    ax.set_title(title, fontsize=9)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8)
    save_figure(fig, path, dpi=110)
