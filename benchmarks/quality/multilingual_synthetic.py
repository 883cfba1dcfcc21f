"""Quality: multilingual multi-task vs click-only sentence encoder on synthetic data (paper 004 Table III shape).

Data (`madr.data.synthetic.multilingual`): a position-biased click log over the synthetic catalog (en / de /
fr / es queries), XNLI-like NLI pairs in 7 languages (contradictions dropped for training, Eq. 2) and
WikiMatrix-like parallel pairs in 6 languages across Latin, Cyrillic, CJK and Arabic scripts (filtered at
the WikiMatrix margin threshold). Model: a 6-layer, 64-wide BERT trained from scratch over a WordPiece
tokenizer trained on the training text, CLS projected to 32 dimensions, one encoder for queries and
documents; its query tower is then distilled into a 3-layer student with an L2 loss (paper 004 Sec. V-A).
Rows: random scores, the logged old ranker, token BM25, minimum edit distance, the untrained encoder,
the click-only encoder, the multi-task encoder (same steps) and its 3-layer query student.
Everything comes from `configs/multitask.yaml` via `madr.recipes.multitask.experiment.run_multitask_experiment`.

    python -m benchmarks.quality.multilingual_synthetic                   # 1 seed, a few minutes on 2 cores
    python -m benchmarks.quality.multilingual_synthetic --seeds 0 1 2     # mean ± sample std over seeds
    python -m benchmarks.quality.multilingual_synthetic --seeds 1 --out s1.json --merge s0.json   # seeds join

Prints the table, sizes, machine, versions and timings; writes JSON to benchmarks/results/ and a PNG to
benchmarks/plots/ (when matplotlib is installed).
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

from benchmarks.common.config import PLOTS, RESULTS, ROOT
from benchmarks.common.machine import load_1min, load_average, machine_info, run_command, versions
from benchmarks.common.plotting import pyplot, save_figure
from benchmarks.common.stats import seed_mean_std
from madr.recipes.multitask.config import load_multitask_config
from madr.recipes.multitask.experiment import COLUMNS, MultiTaskResult, format_table, run_multitask_experiment


def aggregate(results: list[MultiTaskResult]) -> tuple[dict, dict]:
    """Mean and sample std (over seeds) of every metric of every row; no std (an empty dict) for one seed."""
    mean, std = seed_mean_std([r.rows for r in results])
    return mean, std if len(results) > 1 else {}


def plot(mean: dict, std: dict, path: Path, title: str) -> bool:
    """Grouped bars: one group per metric, one bar per row; False when matplotlib is missing."""
    plt = pyplot()
    if plt is None:
        return False
    rows = [r for r in mean if r not in ("Old ranker (logged order)",)]
    fig, ax = plt.subplots(figsize=(13, 4.8))
    width = 0.8 / len(rows)
    x = np.arange(len(COLUMNS))
    for i, row in enumerate(rows):
        values = [mean[row].get(k, np.nan) for k, _ in COLUMNS]
        errors = [std.get(row, {}).get(k, 0.0) for k, _ in COLUMNS]
        ax.bar(x + (i - (len(rows) - 1) / 2) * width, values, width, yerr=errors if std else None, label=row)
    ax.set_xticks(x, [h for _, h in COLUMNS])
    ax.set_ylim(0, 1)
    ax.axhline(0.5, color="gray", lw=0.6, ls=":")
    ax.set_title(title, fontsize=9)
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    ax.grid(axis="y", alpha=0.3)
    save_figure(fig, path)
    return True


def load_runs(paths: list[str]) -> tuple[list[int], list[MultiTaskResult], list[dict]]:
    """Seeds, per-seed results and run records (command, machine, time) of earlier JSON outputs."""
    seeds, results, runs = [], [], []
    for path in paths:
        data = json.loads(Path(path).read_text())
        if len(data.get("seeds", [])) != len(data.get("per_seed", [])):
            raise SystemExit(f"{path}: 'seeds' and 'per_seed' differ in length")
        seeds += data["seeds"]
        results += [MultiTaskResult(**r) for r in data["per_seed"]]
        runs += data.get("runs") or [{"seeds": data["seeds"], "wall_seconds": data.get("wall_seconds"),
                                      "machine": data.get("machine")}]
    return seeds, results, runs


def main() -> None:
    parser = argparse.ArgumentParser(prog=f"python -m {__spec__.name}", description=__doc__.splitlines()[0])
    parser.add_argument("--config", default=str(ROOT / "configs" / "multitask.yaml"))
    parser.add_argument("--seeds", type=int, nargs="*", default=[0], help="experiment seeds (data + weights)")
    parser.add_argument("--merge", nargs="+", default=[], metavar="JSON",
                        help="earlier outputs of this script: their seeds join this run's in the mean (one "
                             "seed per command keeps each measured command short)")
    parser.add_argument("--steps", type=int, default=None, help="override the config's training steps")
    parser.add_argument("--threads", type=int, default=1, help="torch intra-op threads (1: robust on shared cores)")
    parser.add_argument("--out", default=str(RESULTS / "quality_multitask_synthetic.json"))
    parser.add_argument("--plot", default=str(PLOTS / "quality_multitask_synthetic.png"))
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    start, cpu_start, load_start = time.perf_counter(), time.process_time(), load_average()
    seeds, results, runs = load_runs(args.merge)
    if set(seeds) & set(args.seeds):
        raise SystemExit(f"seeds {sorted(set(seeds) & set(args.seeds))} are both merged and run")
    if not seeds and not args.seeds:
        raise SystemExit("nothing to do: give --seeds or --merge")
    for seed in args.seeds:
        overrides = {"seed": seed, "data.seed": seed, "output_dir": tempfile.mkdtemp(prefix=f"madr_mt_{seed}_")}
        if args.steps is not None:
            overrides["steps"] = args.steps
        cfg = load_multitask_config(args.config, overrides)
        result = run_multitask_experiment(cfg)
        print(f"\nseed {seed}: {json.dumps({k: round(v, 1) for k, v in result.seconds.items()})}")
        print(format_table(result.rows))
        seeds.append(seed)
        results.append(result)
    wall, cpu = time.perf_counter() - start, time.process_time() - cpu_start
    info = machine_info(load_average_1min_at_end=f"{load_1min():.1f}", tokenizers=versions("tokenizers")["tokenizers"])
    info["load_average_start"] = load_start
    if args.seeds:
        runs.append({"command": run_command(__spec__.name), "seeds": args.seeds, "wall_seconds": wall,
                     "cpu_seconds": cpu, "machine": info})
    mean, std = aggregate(results)
    print(f"\n## mean over seeds {seeds} ({'± sample std' if std else 'one seed'})\n")
    print(format_table(mean, std))
    print(f"\nsizes (seed {seeds[0]}): {json.dumps(results[0].sizes)}")
    print(f"distillation (per seed): {[{k: round(v, 3) for k, v in r.distillation.items()} for r in results]}")
    print(f"final training losses (seed {seeds[0]}): {json.dumps(results[0].final_losses)}")
    print(f"time: {wall:.0f} s wall, {cpu:.0f} s CPU (all threads of this process) in this command; wall per seed: "
          f"{dict(zip(seeds, [round(r.seconds['total']) for r in results], strict=True))} s")
    print(f"machine: {json.dumps(info)}")
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"config": args.config, "seeds": seeds, "mean": mean, "std": std,
                               "per_seed": [r.to_dict() for r in results], "runs": runs}, indent=2))
    print(f"wrote {out}")
    title = f"paper 004 Table III shape, synthetic multilingual data, seeds {seeds}"
    if plot(mean, std, Path(args.plot), title):
        print(f"wrote {args.plot}")


if __name__ == "__main__":
    main()
