"""Issue 27 item 2: int8 multilingual-e5-small, quality kept per metric against encode latency on this CPU.

The untouched 12-layer multilingual-e5-small with its own recipe (the "untouched" row of
`benchmarks.quality.multilingual_e5`: mean pooling, "passage: " on ads / passages, "query: " on every other text,
64 tokens) run six ways through madr's serving encoders (`madr.search.query_encoder.LeanQueryEncoder` and
its ONNX / int8 versions, `madr.export.quantize`):

- fp32 torch: the peer, what Serve runs by default;
- int8 torch: the Linear layers dynamically quantised to qint8 (`Int8QueryEncoder`), one scale per matrix;
- fp32 onnxruntime: the tower exported (`madr.export.onnx`), to separate the backend from the precision;
- int8 onnxruntime: that graph's MatMul weights dynamically quantised by onnxruntime (`quantize_onnx_int8`), one
  scale per matrix;
- both int8 ones again with a weight scale per output channel (`per_channel`, the library's and serving's default).

Held-out data, splits and metrics are `multilingual_e5`'s (`prepare` with `configs/real/multitask_e5.yaml`):
click AUC on QADSM + QAM dev (2,000 pairs), SNLI / XNLI-de / 3-way NLI AUC, cross-lingual top-1 over
Tatoeba's 112 languages (2,240 sources against 2,101 English sentences). Each variant: every metric, the
fraction of fp32 torch's it keeps, the paired bootstrap difference to fp32 torch (`bench.bootstrap` resamples
of the held-out items), the vectors' cosine to fp32 torch's on the timed texts, and encode latency (1 thread:
`--threads 1` for torch, 1 intra-op thread for onnxruntime): ms per query one at a time and ms per document in
batches of 64, on `bench.latency_texts` held-out click texts, the variants alternating over `--rounds` rounds
(median per text). A check that madr's fp32 path is e5's own recipe: its vectors against the plain
transformers e5 (`e5_reference_embedder`) on the timed texts.

    OMP_NUM_THREADS=1 python -m benchmarks.quality.multilingual_int8 --threads 1

Writes benchmarks/results/<tag>.json (default tag real_multilingual_int8) and benchmarks/plots/<tag>.png
(click AUC and cross-lingual top-1 against ms per query). The ONNX files go to a temporary directory.
"""

from __future__ import annotations

import argparse
import dataclasses
import tempfile
from pathlib import Path

import numpy as np

from benchmarks.common.config import ROOT, RUN_OUT, add_run_args
from benchmarks.common.machine import versions
from benchmarks.quality.int8_variants import (
    FP32,
    ISSUE_ASK,
    VARIANT_KEYS,
    Encoders,
    agreement,
    build_variants,
    cosine_to,
    embedder,
    latency,
    plot,
    quality,
    run_fields,
    untouched_e5,
    verdict,
)
from benchmarks.quality.multilingual import e5_reference_embedder, prepare, write_result
from benchmarks.quality.multilingual_e5 import COLUMNS
from benchmarks.quality.multilingual_int8_teacher import teachers_main
from madr.data.records import MultilingualData
from madr.modeling.backbone import resolve_backbone_path
from madr.recipes.multitask.data import doc_text


def reference_check(
    run, variants: dict[str, Encoders], queries: list[str], docs: list[str]
) -> dict[str, dict]:
    """madr's fp32 path against the plain transformers e5 with its own recipe, on the timed texts."""
    cfg = run.cfg
    path = resolve_backbone_path(cfg.model.backbone.name_or_path)
    e5 = e5_reference_embedder(path, cfg.model.max_doc_length, cfg.eval.batch_size)
    ours = embedder(variants[FP32])
    return {
        role: cosine_to(e5(texts, role).numpy(), ours(texts, role).numpy())
        for role, texts in (("query", queries), ("ad", docs))
    }


def table(rows: dict[str, dict], lat: dict[str, dict]) -> str:
    """Markdown: each metric (fraction of fp32 kept), ms per query / document and the query speed-up."""
    head = [h for _, h in COLUMNS] + ["ms / query", "ms / doc", "query speed-up"]
    lines = ["| encoder | " + " | ".join(head) + " |", "|---|" + "---|" * len(head)]
    for v, r in rows.items():
        cells = [f"{r['metrics'][k]:.3f} ({100 * r['kept'][k]:.1f}%)" for k, _ in COLUMNS]
        speed = lat[FP32]["query_ms"] / lat[v]["query_ms"]
        cells += [f"{lat[v]['query_ms']:.2f}", f"{lat[v]['doc_ms']:.2f}", f"{speed:.2f}x"]
        lines.append(f"| {v} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def click_subset(data: MultilingualData, n: int | None, seed: int = 0) -> MultilingualData:
    """`data` with `n` of its held-out click pairs, drawn without replacement with `seed` and kept in file order
    (None or >= all: every pair); the other held-out sets whole."""
    if n is None or n >= len(data.clicks_eval):
        return data
    keep = np.sort(np.random.default_rng(seed).choice(len(data.clicks_eval), n, replace=False))
    return dataclasses.replace(data, clicks_eval=[data.clicks_eval[i] for i in keep])


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(
        prog=f"python -m {__spec__.name}",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_run_args(p, ROOT / "configs" / "real" / "multitask_e5.yaml", "real_multilingual_int8")
    p.add_argument("--out-dir", default=str(RUN_OUT), help="results/ and plots/ go under it")
    p.add_argument(
        "--build-backbone", action="store_true", help="build the e5 directory first if it is missing"
    )
    p.add_argument("--rounds", type=int, default=2, help="timed passes over the latency texts per variant")
    p.add_argument(
        "--click-subset",
        type=int,
        default=None,
        help="score a seeded sample of this many held-out "
        "click pairs (default: all 2,000; a few hundred or more, or no query keeps both labels for NDCG); the "
        "NLI and translation sets stay whole",
    )
    p.add_argument(
        "--model-dir",
        default=None,
        help="a multilingual_e5 output_dir with seed<N>/teacher (bench.save_models): evaluate each seed's trained "
        "teacher (madr's sides) instead of the untouched e5, cached per seed; default tag "
        "real_multitask_e5_teacher_int8",
    )
    p.add_argument(
        "--variants",
        nargs="+",
        choices=sorted(VARIANT_KEYS),
        default=None,
        help="with --model-dir: the variants (fp32 always; default fp32 int8_pc onnx_int8_pc)",
    )
    p.add_argument(
        "--ready-only", action="store_true", help="with --model-dir: only the seeds whose teacher is saved"
    )
    p.add_argument(
        "--merge",
        nargs="+",
        default=[],
        metavar="JSON",
        help="with --model-dir: the seeds of these earlier results (e.g. one run per seed in parallel, each with "
        "its own --tag) are taken from them instead of run",
    )
    args = p.parse_args(argv)
    if args.model_dir is not None and args.tag == "real_multilingual_int8":
        args.tag = "real_multitask_e5_teacher_int8"
    run = prepare(args)
    run.data = data = click_subset(run.data, args.click_subset)
    if args.model_dir is not None:
        return teachers_main(args, run)
    bench, cfg = run.bench, run.cfg
    model = untouched_e5(run)
    n = int(bench["latency_texts"])
    queries = [r.query for r in data.clicks_eval][:n]
    docs = [doc_text(r, cfg.tasks.click.field_order) for r in data.clicks_eval][:n]
    with tempfile.TemporaryDirectory(prefix="madr-int8-bench-") as tmp:
        variants, build_s = build_variants(model, Path(tmp))
        check = reference_check(run, variants, queries[:64], docs[:64])
        print(f"madr fp32 vs transformers e5: {check}", flush=True)
        agree = agreement(variants, queries, docs)
        lat = latency(variants, queries, docs, args.rounds)
        print(f"latency: {lat}", flush=True)
        rows = quality(variants, data, cfg.tasks.click.field_order, cfg.eval.ndcg_at, int(bench["bootstrap"]))
    text = table(rows, lat)
    print(text)
    print(f"versions: {versions('torch', 'onnxruntime', 'onnx', 'onnxscript')}")
    result = write_result(
        run,
        __spec__.name,
        [{"seed": 0, "rows": {v: r["metrics"] for v, r in rows.items()}}],
        args.out_dir,
        args.tag,
        issue=ISSUE_ASK,
        variants=rows,
        latency=lat,
        agreement=agree,
        reference_check=check,
        build_seconds=build_s,
        verdict=verdict(rows, lat),
        **run_fields(args, text, data),
    )
    png = Path(args.out_dir) / "plots" / f"{args.tag}.png"
    if plot(
        rows,
        lat,
        png,
        "untouched multilingual-e5-small: fp32 / int8, torch / onnxruntime (1 thread)",
    ):
        print(f"plot: {png}")
    return result


if __name__ == "__main__":
    main()
