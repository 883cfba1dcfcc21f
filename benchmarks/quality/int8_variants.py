"""The int8 variants of a multilingual encoder and how they are measured, shared by
`benchmarks.quality.multilingual_int8` (the untouched multilingual-e5-small) and
`benchmarks.quality.multilingual_int8_teacher` (the trained multi-task teachers): the six encoders (fp32 / int8,
torch / onnxruntime, one weight scale per matrix or per output channel), their latency, their vectors' agreement
with fp32 torch, their quality on the held-out sets, the verdict against the bar, the plot and the run fields
every result JSON records."""

from __future__ import annotations

import argparse
import dataclasses
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from benchmarks.common.machine import versions
from benchmarks.common.plotting import pyplot, save_figure
from benchmarks.quality import multilingual_scores as item
from benchmarks.quality.multilingual import QUERY_ROLES, encoder
from benchmarks.quality.multilingual_e5 import COLUMNS, row_metrics
from madr.data.records import MultilingualData
from madr.export.onnx import OnnxQueryEncoder, export_onnx
from madr.export.quantize import Int8QueryEncoder, count_int8_linears, quantize_onnx_int8
from madr.modeling.model import BiEncoder
from madr.search.query_encoder import LeanQueryEncoder

FP32 = "fp32 torch (peer)"
INT8 = "int8 torch (dynamic qint8 Linear)"
ONNX = "fp32 onnxruntime"
ONNX_INT8 = "int8 onnxruntime (dynamic int8 MatMul)"
INT8_PC = "int8 torch, per-channel scales"
ONNX_INT8_PC = "int8 onnxruntime, per-channel scales"
VARIANTS = (FP32, INT8, INT8_PC, ONNX, ONNX_INT8, ONNX_INT8_PC)
SIDES = ("query", "doc")
# int8 variant -> (per-channel weight scales, its label in the build timings[, its ONNX file suffix])
INT8_SCALES = {INT8: (False, ""), INT8_PC: (True, " per channel")}
ONNX_INT8_SCALES = {ONNX_INT8: (False, "", "int8"), ONNX_INT8_PC: (True, " per channel", "int8pc")}
HEADLINE = ("click_auc", "xling_top1")
ISSUE_ASK = (
    "issue 27 item 2: >= 97% of the 12-layer model's click AUC and x-ling top-1 at >= 2x its query speed"
)
Encoders = dict[str, LeanQueryEncoder]  # side -> encoder


# ---- the six encoders ------------------------------------------------------------------------------------------


def untouched_e5(run) -> BiEncoder:
    """multilingual-e5-small through madr, untrained: mean pooling, e5's prefixes, 64 tokens on both sides (the
    length `e5_reference_embedder` cuts at)."""
    cfg = run.cfg
    cfg = dataclasses.replace(
        cfg, model=dataclasses.replace(cfg.model, max_query_length=cfg.model.max_doc_length)
    )
    return encoder(cfg, run.tokenizer, 0, "mean").eval()


def build_variants(
    model: BiEncoder, workdir: Path, names: Sequence[str] = VARIANTS
) -> tuple[dict[str, Encoders], dict[str, float]]:
    """variant -> {side: encoder} for the `names` variants (default all six, in VARIANTS' order), and the
    seconds each took to build (export, quantisation) and file sizes."""
    names = [v for v in VARIANTS if v in names]
    out: dict[str, Encoders] = {v: {} for v in names}
    seconds: dict[str, float] = {}
    onnx_names = {ONNX, ONNX_INT8, ONNX_INT8_PC} & set(names)
    for side in SIDES:
        if FP32 in out:
            out[FP32][side] = LeanQueryEncoder(model, side=side)
        for name, (per_channel, label) in INT8_SCALES.items():
            if name in out:
                t0 = time.perf_counter()
                out[name][side] = Int8QueryEncoder(model, side=side, per_channel=per_channel)
                seconds[f"{side}: quantise torch{label}"] = time.perf_counter() - t0
        if not onnx_names:
            continue
        t0 = time.perf_counter()
        fp32_path = export_onnx(model, workdir / f"{side}.onnx", side)
        seconds[f"{side}: export onnx"] = time.perf_counter() - t0
        seconds[f"{side}: onnx fp32 MiB"] = fp32_path.stat().st_size / 2**20
        if ONNX in out:
            out[ONNX][side] = OnnxQueryEncoder(model, fp32_path, side, threads=1)
        for name, (per_channel, label, suffix) in ONNX_INT8_SCALES.items():
            if name in out:
                t0 = time.perf_counter()
                path = quantize_onnx_int8(
                    fp32_path, workdir / f"{side}.{suffix}.onnx", per_channel=per_channel
                )
                seconds[f"{side}: quantise onnx{label}"] = time.perf_counter() - t0
                seconds[f"{side}: onnx int8{label} MiB"] = path.stat().st_size / 2**20
                out[name][side] = OnnxQueryEncoder(model, path, side, threads=1)
    torch_int8 = next((out[v]["query"].tower for v in (INT8, INT8_PC) if v in out), None)
    linears = count_int8_linears(torch_int8) if torch_int8 is not None else 0
    print(f"built: {seconds}; int8 Linear layers per torch tower: {linears}", flush=True)
    return out, seconds


def embedder(encoders: Encoders, recipe: str = "e5") -> item.Embedder:
    """Held-out texts through madr encoders. "e5": e5's own recipe, ads / passages through the doc side
    ("passage: "), all else "query: "; "madr": how a trained madr model is evaluated (`madr_item_scores`):
    queries, hypotheses and translation sources through the query side, ads, premises and English candidates
    through the doc side (each side's prefix and token limit)."""
    if recipe not in ("e5", "madr"):
        raise ValueError(f"recipe must be 'e5' or 'madr', got {recipe!r}")

    def side(role: str) -> str:
        if recipe == "e5":
            return "doc" if role == "ad" else "query"
        return "query" if role in QUERY_ROLES else "doc"

    def embed(texts: list[str], role: str) -> torch.Tensor:
        dense, _ = encoders[side(role)].encode(list(texts))
        return F.normalize(torch.from_numpy(dense), dim=-1)

    return embed


# ---- latency and agreement --------------------------------------------------------------------------------------


def per_text_ms(encode: Callable[[list[str]], object], texts: Sequence[str], batch: int) -> list[float]:
    """Milliseconds per text of `encode` on `texts` in chunks of `batch`, one number per chunk."""
    out = []
    for i in range(0, len(texts), batch):
        chunk = list(texts[i : i + batch])
        t0 = time.perf_counter()
        encode(chunk)
        out.append((time.perf_counter() - t0) * 1000 / len(chunk))
    return out


def latency(
    variants: dict[str, Encoders], queries: list[str], docs: list[str], rounds: int
) -> dict[str, dict]:
    """Median ms per query (one at a time) and per document (batches of 64) of each variant, the variants
    alternating in each round after one warm-up pass each."""
    times = {v: {"query": [], "doc": []} for v in variants}
    for enc in variants.values():  # warm-up
        enc["query"].encode(queries[:8], batch_size=1)
        enc["doc"].encode(docs[:64], batch_size=64)
    for _ in range(rounds):
        for v, enc in variants.items():
            times[v]["query"] += per_text_ms(lambda t, e=enc: e["query"].encode(t, batch_size=1), queries, 1)
            times[v]["doc"] += per_text_ms(lambda t, e=enc: e["doc"].encode(t, batch_size=64), docs, 64)
    return {
        v: {
            "query_ms": float(np.median(t["query"])),
            "doc_ms": float(np.median(t["doc"])),
            "query_ms_p90": float(np.percentile(t["query"], 90)),
            "doc_ms_p90": float(np.percentile(t["doc"], 90)),
        }
        for v, t in times.items()
    }


def cosine_to(reference: np.ndarray, other: np.ndarray) -> dict[str, float]:
    """Mean and minimum row cosine of `other` to `reference`."""
    a = reference / np.linalg.norm(reference, axis=1, keepdims=True)
    b = other / np.linalg.norm(other, axis=1, keepdims=True)
    cos = (a * b).sum(axis=1)
    return {"mean_cosine": float(cos.mean()), "min_cosine": float(cos.min())}


def agreement(variants: dict[str, Encoders], queries: list[str], docs: list[str]) -> dict[str, dict]:
    """Each variant's query and document vectors against fp32 torch's on the same texts."""
    want = {s: variants[FP32][s].encode(t)[0] for s, t in (("query", queries), ("doc", docs))}
    return {
        v: {s: cosine_to(want[s], enc[s].encode(t)[0]) for s, t in (("query", queries), ("doc", docs))}
        for v, enc in variants.items()
    }


# ---- quality ------------------------------------------------------------------------------------------------------


def quality(
    variants: dict[str, Encoders],
    data: MultilingualData,
    order,
    ks,
    draws: int,
    recipe: str = "e5",
    references: dict[str, dict[str, np.ndarray]] | None = None,
    seed: int = 0,
    scores: dict[str, dict[str, np.ndarray]] | None = None,
) -> dict[str, dict]:
    """Per variant: the metrics, the fraction of fp32's kept, the paired bootstrap vs fp32 (and vs each of
    `references`' item scores: `paired_minus_<name>`), eval seconds. `scores`, when given, receives each
    variant's item scores."""
    scores = {} if scores is None else scores
    out = {}
    for v, enc in variants.items():
        t0 = time.perf_counter()
        scores[v] = item.item_scores(embedder(enc, recipe), data, order)
        out[v] = {"metrics": row_metrics(scores[v], data, ks), "eval_s": time.perf_counter() - t0}
        print(
            f"{v}: {out[v]['eval_s']:.0f} s " + " ".join(f"{k} {out[v]['metrics'][k]:.4f}" for k in HEADLINE),
            flush=True,
        )
    base = out[FP32]["metrics"]
    for v in variants:
        out[v]["kept"] = {k: out[v]["metrics"][k] / base[k] for k, _ in COLUMNS if k in base}
        if v != FP32:
            out[v]["paired_minus_fp32"] = item.paired_bootstrap(scores[v], scores[FP32], data, draws, seed)
        for name, ref in (references or {}).items():
            out[v][f"paired_minus_{name}"] = item.paired_bootstrap(scores[v], ref, data, draws, seed)
    return out


def verdict(rows: dict[str, dict], lat: dict[str, dict]) -> dict[str, dict]:
    """Whether each variant meets issue 27's bar: >= 97% of click AUC and x-ling top-1 at >= 2x query speed."""
    return {
        v: {
            "speed_up": lat[FP32]["query_ms"] / lat[v]["query_ms"],
            **{f"kept_{k}": rows[v]["kept"][k] for k in HEADLINE},
            "meets": all(rows[v]["kept"][k] >= 0.97 for k in HEADLINE)
            and lat[FP32]["query_ms"] / lat[v]["query_ms"] >= 2.0,
        }
        for v in rows
    }


def plot(rows: dict[str, dict], lat: dict[str, dict], path: Path, title: str, peer: str = FP32) -> bool:
    """Click AUC and x-ling top-1 against ms per query, with issue 27's bar: 97% of the `peer` row's value
    (dashed; default fp32 torch) and half its query time (dotted); the points up and to the left of both meet
    it."""
    plt = pyplot()
    if plt is None:
        return False
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2))
    for ax, (key, label) in zip(
        axes, (("click_auc", "Click AUC (QADSM + QAM)"), ("xling_top1", "X-ling top-1")), strict=True
    ):
        for v, r in rows.items():
            ax.scatter(lat[v]["query_ms"], r["metrics"][key], s=30)
            ax.annotate(
                v.split(" (")[0],
                (lat[v]["query_ms"], r["metrics"][key]),
                fontsize=7,
                xytext=(4, 3),
                textcoords="offset points",
            )
        ax.axhline(0.97 * rows[peer]["metrics"][key], ls="--", c="grey", lw=0.8, label=f"97% of {peer}")
        ax.axvline(lat[peer]["query_ms"] / 2, ls=":", c="grey", lw=0.8, label=f"2x {peer}'s query speed")
        ax.set_xlabel("query encode ms (1 thread, one query at a time)")
        ax.set_ylabel(label)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7, loc="lower right")
    fig.suptitle(title, fontsize=9)
    save_figure(fig, path)
    return True


def run_fields(args: argparse.Namespace, text: str, data: MultilingualData) -> dict:
    """What every result JSON of this benchmark records of its run: timing rounds, the table, thread counts, the
    click sample and the onnxruntime versions."""
    return {
        "rounds": args.rounds,
        "table": text,
        "threads": {"torch": torch.get_num_threads(), "onnxruntime_intra_op": 1},
        "click_subset": args.click_subset,
        "held_out_clicks": len(data.clicks_eval),
        "versions": versions("onnxruntime", "onnx", "onnxscript"),
    }


E5_PEER = "untouched e5, fp32 torch"  # the trained-teacher runs' second peer (multilingual_int8_teacher)
VARIANT_KEYS = {
    "fp32": FP32,
    "int8": INT8,
    "int8_pc": INT8_PC,
    "onnx": ONNX,
    "onnx_int8": ONNX_INT8,
    "onnx_int8_pc": ONNX_INT8_PC,
}
