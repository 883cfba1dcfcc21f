"""Int8 of the trained multi-task e5 teachers (issue 27 item 2, `python -m benchmarks.quality.multilingual_int8
--model-dir DIR`): each seed's saved teacher (`benchmarks.quality.multilingual_e5` with `bench.save_models`) in fp32
torch (the peer) and the int8 variants on the held-out sets, scored as the teacher is in the published table,
the untouched e5 scored on the same items and timed in the same rounds, cached per seed; mean +- std over the
seeds and per-seed paired tests against the fp32 teacher and the untouched e5. The variants, metrics, latency
and plot are `benchmarks.quality.int8_variants`'s."""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from benchmarks.common.stats import seed_mean_std
from benchmarks.quality import multilingual_scores as item
from benchmarks.quality.int8_variants import (
    E5_PEER,
    FP32,
    HEADLINE,
    INT8_PC,
    ISSUE_ASK,
    ONNX_INT8_PC,
    SIDES,
    VARIANT_KEYS,
    VARIANTS,
    Encoders,
    agreement,
    build_variants,
    embedder,
    latency,
    plot,
    quality,
    run_fields,
    untouched_e5,
    verdict,
)
from benchmarks.quality.multilingual import seed_runs, settings, write_result
from benchmarks.quality.multilingual_e5 import COLUMNS, row_metrics
from madr.data.records import MultilingualData
from madr.modeling.model import BiEncoder
from madr.recipes.multitask.data import doc_text
from madr.search.query_encoder import LeanQueryEncoder

# ---- trained teachers (--model-dir) ----------------------------------------------------------------------------

TEACHER_VARIANTS = (FP32, INT8_PC, ONNX_INT8_PC)
PUBLISHED_PAIR = "distilled serving pair (published, at its speed-up)"


def untouched_scores(
    run, encoders: Encoders, data: MultilingualData, cache: Path | None, key: str
) -> dict[str, np.ndarray]:
    """Item scores of the untouched e5 (`encoders`: fp32 torch of `untouched_e5`, its own recipe), read from
    `cache` (an .npz) when it holds the same `key`, else computed and written there."""
    if cache is not None and cache.is_file():
        stored = np.load(cache)
        if str(stored["key"]) == key:
            print(f"untouched e5 scores: cached in {cache}", flush=True)
            return {k: stored[k] for k in stored.files if k != "key"}
    t0 = time.perf_counter()
    scores = item.item_scores(embedder(encoders, "e5"), data, run.cfg.tasks.click.field_order)
    print(f"untouched e5 scored in {time.perf_counter() - t0:.0f} s", flush=True)
    if cache is not None:
        cache.parent.mkdir(parents=True, exist_ok=True)
        np.savez(cache, key=np.array(key), **scores)
    return scores


def teacher_seed(run, model_dir: Path, seed: int, names: Sequence[str], e5: dict, rounds: int) -> dict:
    """One saved teacher (`model_dir`/seed<N>/teacher, as `multilingual_e5` with `bench.save_models` writes it)
    through the `names` variants, evaluated the way the teacher is (madr's sides, `embedder(.., "madr")`): metrics,
    kept fractions, paired bootstrap vs its fp32 torch and vs the untouched e5 (`e5`: its models and item scores),
    latency with the untouched e5's fp32 torch encoders timed in the same rounds, agreement with fp32."""
    data, cfg, bench = run.data, run.cfg, run.bench
    t0 = time.perf_counter()
    model = BiEncoder.load(model_dir / f"seed{seed}" / "teacher").eval()
    n = int(bench["latency_texts"])
    queries = [r.query for r in data.clicks_eval][:n]
    docs = [doc_text(r, cfg.tasks.click.field_order) for r in data.clicks_eval][:n]
    with tempfile.TemporaryDirectory(prefix="madr-int8-teacher-") as tmp:
        variants, build_s = build_variants(model, Path(tmp), names)
        agree = agreement(variants, queries, docs)
        lat = latency({**variants, E5_PEER: e5["encoders"]}, queries, docs, rounds)
        print(f"seed {seed} latency: {lat}", flush=True)
        rows = quality(
            variants,
            data,
            cfg.tasks.click.field_order,
            cfg.eval.ndcg_at,
            int(bench["bootstrap"]),
            "madr",
            {"e5": e5["scores"]},
            seed,
        )
    return {
        "seed": seed,
        "rows": {v: r["metrics"] for v, r in rows.items()},
        "variants": rows,
        "latency": lat,
        "agreement": agree,
        "build_seconds": build_s,
        "verdict": verdict(rows, lat),
        "seconds": time.perf_counter() - t0,
    }


def seed_summary(runs: list[dict], e5_metrics: dict[str, float]) -> tuple[dict, dict]:
    """Mean and sample std over the seeds of each variant's metrics, kept fractions (kept_<metric>), ms per
    query / document and query speed-up, and the untouched e5's row (its metrics, its latency in each run)."""
    per_seed = []
    for r in runs:
        lat = r["latency"]
        flat = {
            v: {
                **row["metrics"],
                **{f"kept_{k}": x for k, x in row["kept"].items()},
                "query_ms": lat[v]["query_ms"],
                "doc_ms": lat[v]["doc_ms"],
                "speed_up": lat[FP32]["query_ms"] / lat[v]["query_ms"],
            }
            for v, row in r["variants"].items()
        }
        flat[E5_PEER] = {
            **e5_metrics,
            **{f"kept_{k}": e5_metrics[k] / r["rows"][FP32][k] for k, _ in COLUMNS},
            "query_ms": lat[E5_PEER]["query_ms"],
            "doc_ms": lat[E5_PEER]["doc_ms"],
            "speed_up": lat[FP32]["query_ms"] / lat[E5_PEER]["query_ms"],
        }
        per_seed.append(flat)
    return seed_mean_std(per_seed)


def _pm(mean: dict, std: dict, key: str, fmt: str = ".3f") -> str:
    return f"{mean[key]:{fmt}} ± {std[key]:{fmt}}"


def _diff(p: dict) -> str:
    pv = "p < 0.001" if p["p_bootstrap"] < 0.001 else f"p {p['p_bootstrap']:.3f}"
    return f"{p['diff']:+.3f} [{p['ci_low']:+.3f}, {p['ci_high']:+.3f}] {pv}"


def teacher_tables(mean: dict, std: dict, runs: list[dict]) -> str:
    """Markdown: mean ± std over the seeds (kept fraction of the teacher's fp32 in brackets), latency, speed-up;
    then per seed the verdict and the paired differences to the fp32 teacher and to the untouched e5."""
    head = [h for _, h in COLUMNS] + ["ms / query", "ms / doc", "query speed-up"]
    lines = ["| encoder | " + " | ".join(head) + " |", "|---|" + "---|" * len(head)]
    for v, m in mean.items():
        cells = [f"{_pm(m, std[v], k)} ({100 * m[f'kept_{k}']:.1f}%)" for k, _ in COLUMNS]
        cells += [_pm(m, std[v], "query_ms", ".2f"), _pm(m, std[v], "doc_ms", ".2f"), f"{m['speed_up']:.2f}x"]
        lines.append(f"| {v} | " + " | ".join(cells) + " |")
    lines += [
        "",
        "| seed | encoder | kept click AUC | kept x-ling top-1 | query speed-up | meets the bar | "
        "click AUC minus fp32 teacher | x-ling minus fp32 teacher | click AUC minus untouched e5 | "
        "x-ling minus untouched e5 | NLI 3-way minus untouched e5 |",
        "|---|" + "---|" * 10,
    ]
    for r in runs:
        for v, row in r["variants"].items():
            ver, e5 = r["verdict"][v], row["paired_minus_e5"]
            fp = row.get("paired_minus_fp32")
            vs_fp = [_diff(fp[k]) if fp else "0" for k in HEADLINE]
            lines.append(
                f"| {r['seed']} | {v} | {100 * ver['kept_click_auc']:.1f}% | "
                f"{100 * ver['kept_xling_top1']:.1f}% | {ver['speed_up']:.2f}x | "
                f"{'yes' if ver['meets'] else 'no'} | "
                + " | ".join(vs_fp)
                + " | "
                + " | ".join(_diff(e5[k]) for k in (*HEADLINE, "nli_auc_all3"))
                + " |"
            )
    return "\n".join(lines)


def published_pair(path: Path) -> dict | None:
    """The distilled serving pair's mean metrics and its query speed-up over its teacher from
    `multilingual_e5`'s published JSON (None when it is missing)."""
    if not path.is_file():
        return None
    from benchmarks.quality.multilingual_e5 import PAIR, TEACHER

    raw = json.loads(path.read_text())
    if PAIR not in raw.get("mean", {}):
        return None
    lat = raw["latency"]
    return {
        "metrics": raw["mean"][PAIR],
        "speed_up": lat[TEACHER]["query_ms"] / lat[PAIR]["query_ms"],
        "source": str(path),
    }


def teachers_main(args: argparse.Namespace, run) -> dict:
    """`--model-dir`: each seed's saved teacher, cached per seed in results/<tag>.partial.json."""
    model_dir = Path(args.model_dir)
    data, cfg = run.data, run.cfg
    names = [VARIANT_KEYS[k] for k in args.variants] if args.variants else list(TEACHER_VARIANTS)
    if FP32 not in names:
        names.insert(0, FP32)
    names = [v for v in VARIANTS if v in names]
    seeds = run.seeds
    key = json.dumps(
        {
            **settings(run),
            "model_dir": str(model_dir),
            "variants": names,
            "rounds": args.rounds,
            "click_subset": args.click_subset,
        },
        sort_keys=True,
        default=str,
    )
    data_key = json.dumps(
        {
            **settings(run)["real_data"],
            "model": run.cfg.to_dict()["model"],
            "click_subset": args.click_subset,
        },
        sort_keys=True,
        default=str,
    )
    e5_model = untouched_e5(run)
    e5_enc = {side: LeanQueryEncoder(e5_model, side=side) for side in SIDES}
    e5_scores = untouched_scores(run, e5_enc, data, model_dir / "untouched_e5_scores.npz", data_key)
    e5_metrics = row_metrics(e5_scores, data, cfg.eval.ndcg_at)
    e5 = {"scores": e5_scores, "encoders": e5_enc}
    merged = {r["seed"] for path in args.merge for r in json.loads(Path(path).read_text())["runs"]}
    seeds = [s for s in seeds if s not in merged]
    ready = [s for s in seeds if (model_dir / f"seed{s}" / "teacher" / "heads.safetensors").is_file()]
    if args.ready_only and ready != list(seeds):
        print(f"teachers saved for seeds {ready} of {list(seeds)}: running those", flush=True)
        seeds = ready
    runs = seed_runs(
        seeds,
        lambda seed: teacher_seed(run, model_dir, seed, names, e5, args.rounds),
        Path(args.out_dir) / "results" / f"{args.tag}.partial.json",
        data.summary,
        args.merge,
        key,
    )
    if (
        not runs
    ):  # --ready-only before any teacher is saved: the untouched e5's scores are cached, nothing else
        print(f"no teacher saved under {model_dir} for seeds {list(run.seeds)}", flush=True)
        return {"seeds": [], "untouched_e5": e5_metrics}
    mean, std = seed_summary(runs, e5_metrics)
    text = teacher_tables(mean, std, runs)
    print(text)
    every = {v: all(r["verdict"][v]["meets"] for r in runs) for v in names}
    beats = {
        v: {
            k: all(
                r["variants"][v]["paired_minus_e5"][k]["diff"] > 0
                and r["variants"][v]["paired_minus_e5"][k]["p_bootstrap"] < 0.01
                for r in runs
            )
            for k in HEADLINE
        }
        for v in names
    }
    pair = published_pair(Path(args.out_dir) / "results" / "real_multitask_e5.json")
    result = write_result(
        run,
        __spec__.name,
        runs,
        args.out_dir,
        args.tag,
        issue=ISSUE_ASK + " (of the trained multi-task teacher: configs/real/multitask_e5.yaml)",
        model_dir=str(model_dir),
        variants=names,
        mean=mean,
        std=std,
        untouched_e5=e5_metrics,
        meets_every_seed=every,
        beats_untouched_e5_every_seed_p01=beats,
        published_pair=pair,
        **run_fields(args, text, data),
    )
    rows = {f"teacher, {v}": {"metrics": mean[v]} for v in names}
    lat = {f"teacher, {v}": {"query_ms": mean[v]["query_ms"]} for v in names}
    rows[E5_PEER], lat[E5_PEER] = {"metrics": mean[E5_PEER]}, {"query_ms": mean[E5_PEER]["query_ms"]}
    if pair is not None:
        rows[PUBLISHED_PAIR] = {"metrics": pair["metrics"]}
        lat[PUBLISHED_PAIR] = {"query_ms": mean[FP32]["query_ms"] / pair["speed_up"]}
    png = Path(args.out_dir) / "plots" / f"{args.tag}.png"
    if plot(
        rows,
        lat,
        png,
        f"multi-task e5 teacher: fp32 / int8 (1 thread; mean over seeds {result['seeds']})",
        peer=f"teacher, {FP32}",
    ):
        print(f"plot: {png}")
    return result
