"""The baseline stage: the untrained backbone indexed beside the trained model, the reference a user would pick
instead of training (`eval.references: [untrained]`).

`python -m pipelines.baseline --config EXPERIMENT.yaml`:
1. saves the model before any training (`pipelines.train.job.save_initial_model`: the backbone's weights, fresh
   heads from `train.seed`, the tokenizer the training stages use) to `<output_dir>/baseline/model`;
2. encodes the data stage's corpus with it into `<output_dir>/baseline/index`: the encode job with the encode
   stage's own settings (shards, index factory, BM25 part), only the model and the output differ;
3. when the index has a BM25 part and the tune stage runs, chooses the baseline's own fusion on the dev queries
   (`pipelines.tune.run_tune`: its weight and normalisation are tuned as the trained model's are, so the reference
   is the untrained backbone at its best fusion, not at the trained model's), report under
   `<output_dir>/baseline/tune`.
The evaluate stage then searches that index as the run `untrained+bm25` (`untrained` for a dense-only index).
"""

from __future__ import annotations

import sys

from madr.config import ExperimentConfig
from madr.layout import RunLayout
from pipelines.runtime import experiment_main


def run_baseline(cfg: ExperimentConfig, log=print) -> int:
    """Steps 1-3 of the module docstring; the encode job's exit status."""
    from madr.recipes.aspects.experiment import load_catalog
    from pipelines.encode.cli import main as encode_main
    from pipelines.jobs.checks import not_applicable
    from pipelines.jobs.experiment import write_stage_config
    from pipelines.train.job import save_initial_model
    from pipelines.tune import run_tune

    layout = RunLayout.of(cfg)
    path = save_initial_model(cfg, load_catalog(cfg), layout.baseline_model)
    log(f"[baseline] the untrained model {cfg.model.backbone.name_or_path} -> {path}")
    stage_config = write_stage_config(cfg, "baseline-encode")
    log(f"[baseline] encode: config {stage_config}")
    status = encode_main(["--config", str(stage_config)])
    if status != 0:
        return status
    if not_applicable("tune", cfg.to_dict()) is None:
        run_tune(cfg, log, layout.baseline_manifest, layout.baseline / "tune")
    return 0


def main(argv: list[str] | None = None) -> int:
    return experiment_main(argv, "python -m pipelines.baseline", __doc__, run_baseline)


if __name__ == "__main__":
    sys.exit(main())
