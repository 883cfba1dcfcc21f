"""benchmarks.quality.aspect_models.rows: every paper row also trains with the recipe's BM25-mined negatives
(`<row>_mined`), and the MADRAL alternatives of the reproducibility study (ECIR 2024) train end to end."""

from __future__ import annotations

import pytest
import torch

from benchmarks.quality.aspect_models.rows import ROWS, TRAINED_ROWS, model_config, stage_config, train_row
from madr.config import BackboneConfig, ExperimentConfig, ModelConfig, StageConfig, TrainConfig

TINY = {"hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 2, "intermediate_size": 64,
        "max_position_embeddings": 96}


def _config() -> ExperimentConfig:
    model = ModelConfig(backbone=BackboneConfig(tiny=TINY), max_query_length=16, max_doc_length=48)
    train = TrainConfig(pretrain=StageConfig(steps=0),
                        finetune=StageConfig(steps=2, batch_size=8, hard_negatives=1, aspect_weight=0.1))
    return ExperimentConfig(model=model, train=train)


def test_every_row_has_a_mined_variant_that_changes_only_its_negatives():
    cfg = _config()
    for key in ROWS:
        mined = f"{key}_mined"
        assert mined in TRAINED_ROWS and model_config(cfg, mined) == model_config(cfg, key)
        assert stage_config(cfg, mined, "finetune").negatives == "mined"
        assert stage_config(cfg, key, "finetune").negatives == cfg.train.finetune.negatives != "mined"
        assert stage_config(cfg, mined, "pretrain") == stage_config(cfg, key, "pretrain")


@pytest.mark.parametrize("row", ["madral_cls_other_mined", "madral_first_tokens_mined"])
def test_the_reproducibility_studys_madral_variants_fine_tune_on_mined_negatives(row, catalog, tokenizer,
                                                                                   vocabularies):
    cfg = _config()
    model, info = train_row(row, cfg, catalog, tokenizer, vocabularies, seed=0, freeze_embeddings=True,
                            freeze_layers=1)
    assert info["finetune"]["steps"] == 2 and torch.isfinite(torch.tensor(info["finetune"]["final_loss"]))
    head = model.query_tower.head
    assert head.other_from_cls and (head.aen is None) == (row == "madral_first_tokens_mined")
