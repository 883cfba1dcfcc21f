"""`python -m pipelines.export`: a trained madr model out of madr (no Ray; the logic is `madr.export`).

    python -m pipelines.export MODEL_DIR --sentence-transformers OUT_DIR      # SentenceTransformer(OUT_DIR)
    python -m pipelines.export MODEL_DIR --onnx query.onnx                    # the query tower, onnxruntime

`--sentence-transformers`: a directory of sentence-transformers' own modules (`madr.export.sentence_transformers`),
loaded by `SentenceTransformer(OUT_DIR)` without madr: `encode_query` / `encode_document` give madr's query /
document vectors. BiBERT, MtBERT and the multi-task encoder (also its distilled serving pair); the other models
are refused with the reason (no sentence-transformers module computes their vector).
`--onnx`: the `--side` tower (default query) as one ONNX file, inputs `input_ids` / `attention_mask`, outputs
`dense` and, for the hybrid model, `sparse_values` / `sparse_ids` (the top-k SPLADE terms): `madr.export.onnx`.
Needs `pip install "madr[export]"`.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m pipelines.export", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("model_dir", help="a saved madr model directory (BiEncoder.save)")
    p.add_argument("--sentence-transformers", dest="st_dir", default=None, help="write a sentence-transformers "
                   "directory here (must not exist or be empty)")
    p.add_argument("--onnx", default=None, help="write the --side tower as an ONNX file here")
    p.add_argument("--side", choices=["query", "doc"], default="query", help="the tower --onnx exports")
    return p


def run_export(model_dir: str, st_dir: str | None = None, onnx: str | None = None, side: str = "query") -> list[str]:
    """Export `model_dir` as asked; returns what was written. ValueError (with the reason) when the model has
    no such form."""
    from madr.modeling.model import BiEncoder

    if st_dir is None and onnx is None:
        raise ValueError("nothing to export: give --sentence-transformers DIR and/or --onnx FILE")
    model = BiEncoder.load(model_dir).eval()
    written = []
    if st_dir is not None:
        from madr.export.sentence_transformers import export_sentence_transformers

        export_sentence_transformers(model, st_dir)
        written.append(f"sentence-transformers directory {st_dir} (SentenceTransformer({str(st_dir)!r}))")
    if onnx is not None:
        from madr.export.onnx import export_onnx

        path = export_onnx(model, onnx, side)
        written.append(f"ONNX {side} tower {path} ({path.stat().st_size / 2**20:.1f} MiB)")
    return written


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if not Path(args.model_dir).is_dir():
        raise SystemExit(f"export: model directory {args.model_dir!r} does not exist")
    try:
        written = run_export(args.model_dir, args.st_dir, args.onnx, args.side)
    except (ValueError, ImportError) as err:
        raise SystemExit(f"export: {args.model_dir}: {err}") from None
    for line in written:
        print(f"wrote {line}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
