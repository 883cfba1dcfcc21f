"""The rows of the multi-aspect product-search tables (paper 000 Tables 4-7, paper 001 Tables 3 and 5): each
trained row is a `ModelConfig` variant of the config's `model:`; the references are not trained."""

from __future__ import annotations

import dataclasses
from typing import Any

from madr.config import ExperimentConfig, StageConfig

# key -> (row label, ModelConfig fields over the config's `model:`)
ROWS: dict[str, tuple[str, dict[str, Any]]] = {
    "dssm": ("DSSM", {"name": "dssm"}),
    "bibert": ("BiBERT", {"name": "bibert"}),
    "mpbert": ("MpBERT", {"name": "mpbert", "fusion": "presence"}),
    "mtbert": ("MtBERT", {"name": "mtbert"}),
    "madr": ("MADR", {"name": "madr", "fusion": "presence"}),
    "madral_ws": ("MADRAL (Weighted Sum)", {"name": "madral", "fusion": "weighted_sum"}),
    "madral_pw": ("MADRAL (Presence Weighting)", {"name": "madral", "fusion": "presence"}),
    "madral_cls": ("MADRAL (CLS-Gating)", {"name": "madral", "fusion": "cls_gating"}),
    "mur": ("MUR", {"name": "mur"}),
    "mural": ("MURAL", {"name": "mural"}),
    # paper 002's sparse head (a lean MLM head over the catalog's pieces) on the same backbone
    "bibert_sparse": ("BiBERT + sparse head (Eq. 1)", {"name": "bibert", "sparse_head": True}),
    "madral_pw_sparse": ("MADRAL (Presence Weighting) + sparse head (Eq. 1)",
                         {"name": "madral", "fusion": "presence", "sparse_head": True}),
}
GRANULARITIES = ("phrase", "word", "token")
# key -> changes of `train.<stage>` for the rows that differ from their model's row in training only
ROW_TRAINING: dict[str, tuple[str, str, dict[str, dict[str, Any]]]] = {
    "bibert_mined": ("BiBERT, BM25-mined negatives", "bibert", {"finetune": {"negatives": "mined"}}),
    "madral_pw_mined": ("MADRAL (Presence Weighting), BM25-mined negatives", "madral_pw",
                        {"finetune": {"negatives": "mined"}}),
    "mural_mined": ("MURAL, BM25-mined negatives", "mural", {"finetune": {"negatives": "mined"}}),
}


def ablation_rows(aspects: list[str]) -> dict[str, tuple[str, dict[str, Any]]]:
    """Paper 000 Table 6: MADRAL (Presence Weighting) without one aspect, without OTHER, or with aspect learning
    on one side only; paper 001 Table 5: MURAL learning one aspect, or one granularity, only."""
    pw = {"name": "madral", "fusion": "presence"}
    rows = {f"madral_no_{a}": (f"MADRAL −{a}", {**pw, "aspects": [x for x in aspects if x != a]}) for a in aspects}
    rows["madral_no_other"] = ("MADRAL −other", {**pw, "use_other": False})
    rows["madral_no_query"] = ("MADRAL −query (aspect learning on documents only)", {**pw, "aspect_sides": ["doc"]})
    rows["madral_no_doc"] = ("MADRAL −doc (aspect learning on queries only)", {**pw, "aspect_sides": ["query"]})
    rows |= {f"mural_only_{a}": (f"MURAL only {a}", {"name": "mural", "aspects": [a]}) for a in aspects}
    rows |= {f"mural_only_{g}": (f"MURAL only {g}", {"name": "mural", "granularities": [g]}) for g in GRANULARITIES}
    return rows


def trained_rows(cfg: ExperimentConfig) -> dict[str, tuple[str, dict[str, Any]]]:
    """Every trainable row for the config's aspects: the papers' models (ROWS), the ablations and the training
    variants (ROW_TRAINING)."""
    variants = {key: (label, ROWS[base][1]) for key, (label, base, _) in ROW_TRAINING.items()}
    return {**ROWS, **ablation_rows(list(cfg.model.aspects)), **variants}


def training_changes(key: str) -> dict[str, dict[str, Any]]:
    """{stage: field changes} of row `key`'s training over the config's `train:` (empty for most rows)."""
    return ROW_TRAINING[key][2] if key in ROW_TRAINING else {}


def stage_config(cfg: ExperimentConfig, key: str, kind: str) -> StageConfig:
    """`train.<kind>` of the config with row `key`'s changes (`training_changes`)."""
    return dataclasses.replace(getattr(cfg.train, kind), **training_changes(key).get(kind, {}))


def model_config(cfg: ExperimentConfig, key: str):
    """Row `key` over the config's `model:`; `model.pooling` (e.g. e5's mean) applies to the rows whose head pools
    the tokens itself (BiBERT, MtBERT): the others define their own text vector and keep "cls"."""
    changes = trained_rows(cfg)[key][1]
    row = dataclasses.replace(cfg.model, **{"pooling": "cls", **changes})
    return dataclasses.replace(row, pooling=cfg.model.pooling) if row.pooling_configurable else row
