"""`python -m pipelines.calibrate`: fit a trained aspect model's confidence temperatures on a catalog split.

    python -m pipelines.calibrate MODEL_DIR --catalog CATALOG_DIR [--split dev] [--check test]

Runs the model over the split's search terms and the products they judged, fits one temperature per aspect
and side (`madr.modeling.calibration`: the predicted values and every score stay as they are), saves it in
MODEL_DIR (`aspect_calibration.json`, read by `BiEncoder.load`, so the served `/explain` reports calibrated
confidences), and prints per aspect Accuracy@1, mean confidence and expected calibration error before and
after, and the share of items an aspect filter would act on (calibrated confidence >= 0.7) with their
Accuracy@1; `--check` also scores the fitted temperatures on another split (held out from the fit). No Ray: the
logic is `madr.recipes.aspects.calibration`; `python -m pipelines.cli experiment` fits it after training.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path


def format_report(report: dict[str, dict[str, float]], title: str) -> str:
    at = next(iter(report.values()), {}).get("confident_at", 0.0)
    lines = [title, f"{'side/aspect':<22} {'items':>6} {'T':>7} {'acc@1':>6} {'conf':>13} {'ECE':>13} "
                    f"{f'conf>={at:g}: share':>16} {'acc@1':>6}"]
    for key, r in report.items():
        lines.append(f"{key:<22} {r['items']:>6} {r['temperature']:>7.4f} {r['accuracy@1']:>6.3f} "
                     f"{r['confidence_before']:>5.3f} -> {r['confidence_after']:.3f} "
                     f"{r['ece_before']:>5.3f} -> {r['ece_after']:.3f} "
                     f"{r['confident_share']:>16.3f} {_number(r['confident_accuracy@1']):>6}")
    return "\n".join(lines)


def _number(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f}"


def run_calibration(model_dir: str, catalog_dir: str, split: str = "dev", check: str | None = None,
                    batch_size: int = 128) -> dict:
    """Fit on `split`, save into `model_dir`; returns {"fit": report, "check": report on `check` (if given)}."""
    from madr.data.schema import Catalog
    from madr.modeling.model import BiEncoder
    from madr.recipes.aspects.calibration import calibrate, calibration_report, dev_texts, labelled_logits

    model = BiEncoder.load(model_dir).eval()
    catalog = Catalog.read(catalog_dir)
    texts, annotations = dev_texts(catalog, split)
    fitted_on = f"{Path(catalog_dir).name} split {split}: {len(texts['query']):,} queries, {len(texts['doc']):,} products"
    model.calibration, fit = calibrate(model, texts, annotations, fitted_on, batch_size)
    model.calibration.save(model_dir)
    result = {"fitted_on": fitted_on, "fit": fit}
    if check:
        held_texts, held_annotations = dev_texts(catalog, check)
        result["check"] = calibration_report(labelled_logits(model, held_texts, held_annotations, batch_size),
                                             model.calibration)
    return result


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m pipelines.calibrate", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("model_dir", help="a saved madr aspect model directory (MADRAL, MtBERT, MURAL ...)")
    p.add_argument("--catalog", required=True, help="a catalog directory (Catalog.write / data.catalog_dir layout)")
    p.add_argument("--split", default="dev", help="the queries' split to fit on (default dev)")
    p.add_argument("--check", default=None, help="also report the fitted temperatures on this split (e.g. test)")
    p.add_argument("--batch-size", type=int, default=128)
    p.add_argument("--json", default=None, help="write the reports here as JSON")
    args = p.parse_args(argv)
    try:
        result = run_calibration(args.model_dir, args.catalog, args.split, args.check, args.batch_size)
    except (ValueError, FileNotFoundError) as err:
        print(f"calibrate: {err}", file=sys.stderr)
        return 2
    print(format_report(result["fit"], f"fitted on {result['fitted_on']} (saved in {args.model_dir})"))
    if "check" in result:
        print(format_report(result["check"], f"held out: split {args.check}"))
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
