"""The aspects stage: aspect heads trained on the frozen fine-tuned encoder, so the served model explains its matches
while its ranking stays exactly the encoder's (`madr.training.aspect_heads`).

`python -m pipelines.aspect_heads --config EXPERIMENT.yaml` (`train.aspects`, `madr.config.AspectHeadsConfig`):
1. loads the BiBERT of `train.aspects.init_from` (default the fine-tune stage's export) as an MtBERT with new aspect
   tables over the data stage's phrase vocabularies (`<output_dir>/data/vocab.json`);
2. trains the tables on the training split's annotated search terms and the products they judged, the encoder
   frozen (its vectors computed once per distinct text, for this and the calibration split: `FrozenVectors`);
3. fits their confidence temperatures on `train.aspects.calibrate_split` (`madr.recipes.aspects.calibration`) and
   reports Accuracy@1 and calibration error there;
4. saves the model to `<output_dir>/aspects/model` (what `index.model_stage: aspects` indexes: the encode job stores
   the products' calibrated aspect values, the tune stage chooses the aspect-match weight on dev, `/explain` shows
   the aspects) and the reports to `<output_dir>/aspects/result.json`.
No Ray: a linear probe over cached vectors is seconds of work once the texts are encoded.
"""

from __future__ import annotations

import json
import sys
import time

from madr.config import ExperimentConfig
from madr.layout import RunLayout
from pipelines.runtime import experiment_main


def run_aspect_heads(cfg: ExperimentConfig, log=print) -> dict:
    """Steps 1-4 of the module docstring; returns the reports written to result.json."""
    import torch

    from madr.modeling.aspect_vocabulary import AspectVocabularies
    from madr.recipes.aspects.calibration import calibrate, dev_texts
    from madr.recipes.aspects.experiment import load_catalog
    from madr.training.aspect_heads import FrozenVectors, train_aspect_heads, with_aspect_heads
    from pipelines.calibrate import format_report

    stage, layout = cfg.train.aspects, RunLayout.of(cfg)
    if stage.epochs == 0:
        raise ValueError("train.aspects.epochs is 0: the aspects stage has nothing to train")
    source = stage.init_from or str(layout.model("finetune"))
    if not layout.vocab.is_file():
        raise FileNotFoundError(f"{layout.vocab}: no aspect vocabularies (run the data stage)")
    torch.manual_seed(cfg.train.seed)
    model = with_aspect_heads(source, AspectVocabularies.load(layout.vocab))
    catalog = load_catalog(cfg)
    texts, annotations = dev_texts(catalog, "train")
    held_texts, held_annotations = dev_texts(catalog, stage.calibrate_split)
    t0 = time.perf_counter()
    vectors = FrozenVectors(model, log=log)
    for side in ("query", "doc"):  # one pass of the encoder over both splits' distinct texts
        log(f"[aspects] encoding the {side} texts of the training and {stage.calibrate_split} splits with the "
            f"frozen encoder of {source}")
        vectors.add(texts[side] + held_texts[side], side)
    try:
        trained = train_aspect_heads(model, texts, annotations, stage, seed=cfg.train.seed, vectors=vectors)
    except ValueError as e:
        raise ValueError(f"{e}; a catalog without aspect annotations runs without this stage: --set "
                         "train.aspects.epochs=0 --set index.model_stage=finetune") from e
    log(f"[aspects] {stage.epochs} epochs on the frozen vectors of {len(texts['query']):,} training queries and "
        f"{len(texts['doc']):,} products, encoding included, in {time.perf_counter() - t0:.1f} s:")
    for key, r in trained.items():
        log(f"  {key:<12} {r['items']:>7,} items  loss {r['loss_before']:.3f} -> {r['loss_after']:.3f}  "
            f"acc@1 {r['accuracy@1']:.3f}")
    fitted_on = (f"split {stage.calibrate_split}: {len(held_texts['query']):,} queries, "
                 f"{len(held_texts['doc']):,} products")
    model.calibration, fit = calibrate(model, held_texts, held_annotations, fitted_on,
                                       logits_of=vectors.phrase_logits)
    log(format_report(fit, f"[aspects] calibrated on {fitted_on}"))
    out = layout.model("aspects")
    model.save(out)
    result = {"init_from": source, "train": trained, "calibration": {"fitted_on": fitted_on, "report": fit}}
    (out.parent / "result.json").write_text(json.dumps(result, indent=1))
    log(f"[aspects] {out}")
    return result


def main(argv: list[str] | None = None) -> int:
    return experiment_main(argv, "python -m pipelines.aspect_heads", __doc__, run_aspect_heads)


if __name__ == "__main__":
    sys.exit(main())
