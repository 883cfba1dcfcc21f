"""The rows of the multi-aspect product-search tables (paper 000 Tables 4 / 7, paper 001 Table 3): each trained row
is a `ModelConfig` variant of the config's `model:`; the references are not trained."""

from __future__ import annotations

import dataclasses
from typing import Any

from madr.config import ExperimentConfig, StageConfig

# key -> (row label, ModelConfig fields over the config's `model:`)
ROWS: dict[str, tuple[str, dict[str, Any]]] = {
    "bibert": ("BiBERT", {"name": "bibert"}),
    "mpbert": ("MpBERT", {"name": "mpbert", "fusion": "presence"}),
    "mtbert": ("MtBERT", {"name": "mtbert"}),
    "madr": ("MADR", {"name": "madr", "fusion": "presence"}),
    "madral_ws": ("MADRAL (Weighted Sum)", {"name": "madral", "fusion": "weighted_sum"}),
    "madral_pw": ("MADRAL (Presence Weighting)", {"name": "madral", "fusion": "presence"}),
    "madral_cls": ("MADRAL (CLS-Gating)", {"name": "madral", "fusion": "cls_gating"}),
    "mur": ("MUR", {"name": "mur"}),
    "mural": ("MURAL", {"name": "mural"}),
}
# key -> (label, model row, changes of `train.<stage>`) for the rows that differ from their model's row in training
ROW_TRAINING: dict[str, tuple[str, str, dict[str, dict[str, Any]]]] = {
    "bibert_mined": ("BiBERT, BM25-mined negatives", "bibert", {"finetune": {"negatives": "mined"}}),
}
# every trainable row: the papers' models and the training variants
TRAINED_ROWS = {**ROWS, **{key: (label, ROWS[base][1]) for key, (label, base, _) in ROW_TRAINING.items()}}


def training_changes(key: str) -> dict[str, dict[str, Any]]:
    """{stage: field changes} of row `key`'s training over the config's `train:` (empty for most rows)."""
    return ROW_TRAINING[key][2] if key in ROW_TRAINING else {}


def stage_config(cfg: ExperimentConfig, key: str, kind: str) -> StageConfig:
    """`train.<kind>` of the config with row `key`'s changes (`training_changes`)."""
    return dataclasses.replace(getattr(cfg.train, kind), **training_changes(key).get(kind, {}))


def model_config(cfg: ExperimentConfig, key: str):
    """Row `key` over the config's `model:`; `model.pooling` (e.g. e5's mean) applies to the rows whose head pools
    the tokens itself (BiBERT, MtBERT): the others define their own text vector and keep "cls"."""
    row = dataclasses.replace(cfg.model, **{"pooling": "cls", **TRAINED_ROWS[key][1]})
    return dataclasses.replace(row, pooling=cfg.model.pooling) if row.pooling_configurable else row
