"""Training one row of the multi-aspect product-search tables (`train_row`) from the shared start weights."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Sequence

import numpy as np
import torch

from benchmarks.quality.aspect_models.rows import model_config, stage_config
from madr.config import ExperimentConfig
from madr.data.schema import Catalog
from madr.modeling.model import BiEncoder
from madr.recipes.aspects.experiment import build_catalog_model
from madr.training.freezing import backbone_frozen, freeze_backbone
from madr.training.loop import catalog_sampler, stage_runs, train_stage
from madr.training.memoised_backbone import memoised_backbones


def train_row(key: str, cfg: ExperimentConfig, catalog: Catalog, tokenizer, vocab, seed: int,
              freeze_embeddings: bool, freeze_layers: int = 0,
              on_log: Callable[[BiEncoder, str, int, dict], None] | None = None,
              pretrain_frozen: bool = False, pretrain_frozen_params: Sequence[str] = (),
              device: str | torch.device = "cpu") -> tuple[BiEncoder, dict]:
    """Build row `key` from the shared start weights with torch seeded by `seed` (word embeddings frozen when
    `freeze_embeddings`, and the lowest `freeze_layers` layers, `madr.training.freezing`), then pretrain (when
    `madr.training.loop.stage_runs`; never DSSM, as `run_experiment`) and fine-tune on the train queries.
    `on_log(model, stage, step, losses)` is called every `log_every` steps of each stage (a learning curve).
    `pretrain_frozen`: the whole backbone stays frozen while pretraining and each distinct text runs through it
    once (`madr.training.memoised_backbone`): the heads train on cached token states; the weights named by
    `pretrain_frozen_params` (substrings, e.g. "aen.w_v") stay frozen too. MUR / MURAL put their aspect tokens
    into the backbone's input, so their frozen backbone runs every step (no memo): the aspect tokens and heads
    train through it. `device`: where the model trains (the batches follow the model)."""
    mcfg = model_config(cfg, key)
    torch.manual_seed(seed)
    model = build_catalog_model(mcfg, catalog, tokenizer, vocab).to(device)
    # word embeddings: 12M of all-MiniLM's 23M weights, a third of the step time on 2 CPU cores
    freeze_backbone(model, freeze_embeddings, freeze_layers)
    stages = {kind: stage_config(cfg, key, kind) for kind in ("pretrain", "finetune")}
    sampler = catalog_sampler(catalog, stages["finetune"], tokenizer, seed)
    if on_log is not None:
        on_log(model, "start", 0, {})
    history = {}
    for kind, stage in stages.items():
        if stage_runs(kind, stage, mcfg):
            hook = None if on_log is None else (lambda step, rec, kind=kind: on_log(model, kind, step, rec))
            with contextlib.ExitStack() as frozen:
                if kind == "pretrain":
                    frozen.enter_context(backbone_frozen(model, pretrain_frozen, pretrain_frozen_params))
                    if pretrain_frozen and not mcfg.uses_granularities:  # heads only, on cached token states
                        frozen.enter_context(memoised_backbones(model))
                history[kind] = train_stage(model, sampler, stage, kind, seed=seed, on_log=hook)
    info = {kind: {"steps": len(h), "final_loss": float(np.mean([r["loss"] for r in h[-20:]]))}
            for kind, h in history.items()}
    info["parameters"] = sum(p.numel() for p in model.parameters())
    info["trained_parameters"] = sum(p.numel() for p in model.parameters() if p.requires_grad)
    return model, info
