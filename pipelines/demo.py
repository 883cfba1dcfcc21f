"""The README's main job on embedded defaults.

Today: the in-process experiment (synthetic multi-aspect catalog -> MADRAL pretrain + fine-tune ->
retrieval metrics before/after training). Later issues grow it into the full Ray pipeline.
"""

from __future__ import annotations

from madr.config import ExperimentConfig
from madr.experiment import run_experiment


def format_table(before: dict[str, float], after: dict[str, float]) -> str:
    keys = sorted(set(before) | set(after))
    width = max(len(k) for k in keys)
    lines = [f"{'metric':<{width}}  untrained   trained", "-" * (width + 22)]
    for k in keys:
        lines.append(f"{k:<{width}}  {before.get(k, float('nan')):9.4f} {after.get(k, float('nan')):9.4f}")
    return "\n".join(lines)


def run_demo(cfg: ExperimentConfig) -> int:
    print(f"madr demo: model={cfg.model.name} backbone={cfg.model.backbone.name_or_path or 'tiny random BERT'} "
          f"output={cfg.output_dir}", flush=True)
    result = run_experiment(cfg)
    print(format_table(result.before, result.after))
    print(f"model saved to {result.model_dir} ({result.seconds:.0f} s)")
    return 0
