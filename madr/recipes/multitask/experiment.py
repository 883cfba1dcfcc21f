"""The multilingual multi-task experiment of paper 004 in process: data -> tokenizer -> encoders -> Table III.

Steps (`run_multitask_experiment`):

1. Data (`data.build_data`): a position-biased click log over a synthetic catalog (train queries give the
   training clicks; held-out queries keep every shown document with the catalog's graded relevance), NLI
   pairs and WikiMatrix-like parallel pairs (score-filtered at the WikiMatrix threshold), each with a held-out
   set drawn from another seed and cleared of pairs seen in training. With `data.clicks`, a raw click log's
   debiased (query, document) pairs replace the training clicks (`click_log.apply_click_log`, files under
   `output_dir/data/clicks`).
2. Tokenizer (`encoders.build_tokenizer`): the backbone's own, a given one, or a WordPiece trained on the
   training text only (lowercased, accents kept, no alphabet limit: Latin, Cyrillic, CJK and Arabic survive).
3. Encoders (`encoders.train_encoder`), all from the same initial weights (same seed): the untrained
   encoder, the multi-task encoder (`tasks.enabled`, the schedule of Sec. III-B) and the single-task
   click-only encoder (`tasks.baseline`) with the same number of steps, the same optimiser and batch size.
4. The query tower of the multi-task encoder distilled into a `student.num_layers`-layer student with an
   L2 loss (Sec. V-A; `encoders.distil_query_student`), served with the teacher's document tower
   (`madr.training.distill.attach_query_student`).
5. Evaluation on held-out data (`evaluation.encoder_metrics`), the columns of paper 004 Table III plus
   cross-lingual retrieval:
   * click relevance: NDCG@k of each held-out query's shown documents re-ranked by the model, graded by the
     catalog's ground truth (unbiased, like the paper's judged relevance set), exp2 gains; a document is its
     fields concatenated, or with `tasks.click.field_attention` its fields attended by the query (Sec. IV,
     Eq. 8-9; the encoder holds the attention, the click task trains it: `click_pair_scores`);
   * NLI ROC AUC with the cosine as the score (Table III "SNLI / XNLI Val. RoC"): entailment vs neutral
     (the two classes Eq. 2 trains on), English pairs ("SNLI-like") and the other languages ("XNLI-like");
     plus entailment vs neutral + contradiction over all languages;
   * cross-lingual top-1: each held-out non-English sentence retrieves its English translation among all
     held-out English sentences (cosine), averaged over the languages.
   Training-free baselines (`baselines.baseline_rows`): random scores, the logged old-ranker order,
   token-level BM25 on the tokenizer's word pieces (paper 004 Sec. VI-D) and minimum edit distance; like
   the paper, they get no NLI AUC (their scores are relative to a query, not a calibrated similarity).

Texts go through the query side (click queries, NLI hypotheses, non-English sentences) or the doc side
(documents, premises, English sentences), so the distilled student is evaluated exactly where it serves.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import math
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from madr.recipes.multitask.baselines import baseline_rows
from madr.recipes.multitask.click_log import CLICKS_DIR, apply_click_log
from madr.recipes.multitask.config import MultiTaskExperimentConfig
from madr.recipes.multitask.data import build_data
from madr.recipes.multitask.encoders import (
    build_encoder,
    build_tokenizer,
    distil_query_student,
    train_encoder,
)
from madr.recipes.multitask.evaluation import encoder_metrics

log = logging.getLogger(__name__)

UNTRAINED = "Untrained encoder"


@dataclass
class MultiTaskResult:
    """Rows of the Table III-shaped comparison (model -> metric -> value) and what produced them."""

    rows: dict[str, dict[str, float]]
    sizes: dict[str, int]
    seconds: dict[str, float]
    distillation: dict[str, float] = field(default_factory=dict)
    final_losses: dict[str, dict[str, float]] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def _mean_last(history: dict[str, list[dict[str, float]]], n: int = 20) -> dict[str, float]:
    return {task: float(np.mean([h["loss"] for h in rows[-n:]])) for task, rows in history.items() if rows}


def row_labels(cfg: MultiTaskExperimentConfig) -> tuple[str, str]:
    """Row names of the single-task (baseline) and the multi-task encoder."""
    return (f"Single-task ({' + '.join(cfg.tasks.baseline)})", f"Multi-task ({' + '.join(cfg.tasks.enabled)})")


def student_label(cfg: MultiTaskExperimentConfig) -> str:
    return f"{row_labels(cfg)[1]}, {cfg.student.num_layers}-layer query student"


def run_multitask_experiment(cfg: MultiTaskExperimentConfig, write: bool = True) -> MultiTaskResult:
    """Train and evaluate every row of the comparison (see the module docstring); JSON to `output_dir`."""
    clock = {"start": time.perf_counter()}
    out_dir = Path(cfg.output_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    data = build_data(cfg)
    if cfg.data.clicks is not None:
        data, _ = apply_click_log(data, cfg.data.clicks, out_dir / CLICKS_DIR, cfg.tasks.click.field_order[0])
    tokenizer = build_tokenizer(cfg, data, out_dir)
    seconds: dict[str, float] = {}
    rows = baseline_rows(data, tokenizer, cfg)
    rows[UNTRAINED] = encoder_metrics(build_encoder(cfg, tokenizer, cfg.seed), data, cfg)
    seconds["data_baselines"] = time.perf_counter() - clock["start"]
    single, multi = row_labels(cfg)
    losses, models = {}, {}
    for name, tasks in ((single, cfg.tasks.baseline), (multi, cfg.tasks.enabled)):
        t0 = time.perf_counter()
        models[name], trainer = train_encoder(cfg, tokenizer, data, tasks, cfg.seed)
        seconds[f"train {name}"] = time.perf_counter() - t0
        rows[name] = encoder_metrics(models[name], data, cfg)
        losses[name] = _mean_last(trainer.history)
    distilled: dict[str, float] = {}
    if cfg.student.enabled:
        t0 = time.perf_counter()
        served, distilled = distil_query_student(cfg, models[multi], data, cfg.seed)
        seconds["distill"] = time.perf_counter() - t0
        rows[student_label(cfg)] = encoder_metrics(served, data, cfg)
    seconds["total"] = time.perf_counter() - clock["start"]
    result = MultiTaskResult(rows, data.sizes(), seconds, distilled, losses)
    if write:
        cfg.save(out_dir / "experiment.yaml")
        (out_dir / "metrics.json").write_text(json.dumps(result.to_dict(), indent=2, default=float))
    return result


COLUMNS = (("click_auc", "Click AUC"), ("ndcg@5", "Click NDCG@5"), ("ndcg@10", "Click NDCG@10"),
           ("nli_auc_en", "NLI AUC en"), ("nli_auc_xx", "NLI AUC xx"), ("nli_auc_all3", "NLI AUC 3-way"),
           ("xling_top1", "X-ling top-1"))


def format_table(rows: dict[str, dict[str, float]], spread: dict[str, dict[str, float]] | None = None) -> str:
    """A markdown table of `rows` in Table III's column order; '-' where a row has no such metric."""
    lines = ["| model | " + " | ".join(h for _, h in COLUMNS) + " |", "|---|" + "---|" * len(COLUMNS)]
    for name, metrics in rows.items():
        cells = []
        for key, _ in COLUMNS:
            value = metrics.get(key)
            if value is None or (isinstance(value, float) and math.isnan(value)):
                cells.append("-")
            elif spread and key in spread.get(name, {}):
                cells.append(f"{value:.3f} ± {spread[name][key]:.3f}")
            else:
                cells.append(f"{value:.3f}")
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return "\n".join(lines)
