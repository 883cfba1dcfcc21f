"""The trained rows of the product-search tables (paper 000 Tables 4 / 7, paper 001 Table 3), each a `ModelConfig`
variant of the config's `model:`, and their training from the shared start weights (`train_row`)."""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np
import torch

from madr.config import ExperimentConfig, StageConfig
from madr.data.schema import Catalog
from madr.modeling.model import BiEncoder
from madr.recipes.aspects.experiment import build_catalog_model
from madr.training.freezing import freeze_backbone
from madr.training.loop import catalog_sampler, stage_runs, train_stage

# key -> (row label, ModelConfig fields over the config's `model:`)
ROWS: dict[str, tuple[str, dict[str, Any]]] = {
    "bibert": ("BiBERT", {"name": "bibert"}),
    "mpbert": ("MpBERT", {"name": "mpbert", "fusion": "presence"}),
    "mtbert": ("MtBERT", {"name": "mtbert"}),
    "madr": ("MADR", {"name": "madr", "fusion": "presence"}),
    "madral_ws": ("MADRAL (Weighted Sum)", {"name": "madral", "fusion": "weighted_sum"}),
    "madral_pw": ("MADRAL (Presence Weighting)", {"name": "madral", "fusion": "presence"}),
    "madral_cls": ("MADRAL (CLS-Gating)", {"name": "madral", "fusion": "cls_gating"}),
    # the alternatives of the MADRAL reproducibility study (Bi et al., ECIR 2024): OTHER as the CLS encoding,
    # and the aspects from the first content tokens with CLS as OTHER
    "madral_cls_other": ("MADRAL (PW), CLS as OTHER", {"name": "madral", "fusion": "presence", "other_from": "cls"}),
    "madral_first_tokens": ("MADRAL (PW), first tokens + CLS", {"name": "madral", "fusion": "presence",
                                                                "aspect_extraction": "first_tokens",
                                                                "other_from": "cls"}),
    "mur": ("MUR", {"name": "mur"}),
    "mural": ("MURAL", {"name": "mural"}),
}
# key -> (label, model row, changes of `train.<stage>`) for the rows that differ from their model's row in training:
# every row also fine-tuned on BM25-mined negatives (`<row>_mined`), as the product-search recipe is
ROW_TRAINING: dict[str, tuple[str, str, dict[str, dict[str, Any]]]] = {
    f"{key}_mined": (f"{label}, BM25-mined negatives", key, {"finetune": {"negatives": "mined"}})
    for key, (label, _) in ROWS.items()
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
    """Row `key` over the config's `model:` (`model.pooling` for the rows whose head pools tokens; else "cls")."""
    row = dataclasses.replace(cfg.model, **{"pooling": "cls", **TRAINED_ROWS[key][1]})
    return dataclasses.replace(row, pooling=cfg.model.pooling) if row.pooling_configurable else row


def train_row(key: str, cfg: ExperimentConfig, catalog: Catalog, tokenizer, vocab, seed: int,
              freeze_embeddings: bool, freeze_layers: int = 0, device: str | torch.device = "cpu") -> tuple[BiEncoder, dict]:
    """Row `key` built with torch seeded by `seed` (the word embeddings and lowest `freeze_layers` frozen), then
    pretrained (when `stage_runs`) and fine-tuned, each stage as `train.<stage>` says; the rows share the config's
    `train:`, so `train.pretrain.memoise_backbone` holds for the rows whose backbone input is text alone (not MUR /
    MURAL: their aspect tokens enter the backbone)."""
    mcfg = model_config(cfg, key)
    torch.manual_seed(seed)
    model = build_catalog_model(mcfg, catalog, tokenizer, vocab).to(device)
    # word embeddings: 12M of all-MiniLM's 23M weights, a third of the step time on 2 CPU cores
    freeze_backbone(model, freeze_embeddings, freeze_layers)
    stages = {kind: stage_config(cfg, key, kind) for kind in ("pretrain", "finetune")}
    if mcfg.uses_granularities:
        stages["pretrain"] = dataclasses.replace(stages["pretrain"], memoise_backbone=False)
    sampler = catalog_sampler(catalog, stages["finetune"], tokenizer, seed)
    history = {kind: train_stage(model, sampler, stage, kind, seed=seed)
               for kind, stage in stages.items() if stage_runs(kind, stage, mcfg)}
    info = {kind: {"steps": len(h), "final_loss": float(np.mean([r["loss"] for r in h[-20:]]))}
            for kind, h in history.items()}
    info["parameters"] = sum(p.numel() for p in model.parameters())
    info["trained_parameters"] = sum(p.numel() for p in model.parameters() if p.requires_grad)
    return model, info
