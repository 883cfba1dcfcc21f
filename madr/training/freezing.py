"""Frozen parts of a backbone: a cheaper training step where the pretrained weights are kept as they are."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from torch import nn

from madr.config import StageConfig
from madr.modeling.model import BiEncoder


def backbone_frozen_parameters(backbone: nn.Module, word_embeddings: bool, layers: int) -> list[nn.Parameter]:
    """The word-embedding table (`word_embeddings`) and, with `layers` > 0, every embedding parameter and the
    lowest `layers` transformer layers of a Hugging Face encoder (`.embeddings`, `.encoder.layer`)."""
    params = [backbone.get_input_embeddings().weight] if word_embeddings else []
    if layers > 0:
        blocks = backbone.encoder.layer
        if layers > len(blocks):
            raise ValueError(f"cannot freeze {layers} layers of a {len(blocks)}-layer backbone")
        params += list(backbone.embeddings.parameters())
        params += [p for block in blocks[:layers] for p in block.parameters()]
    return params


def freeze_backbone(model: BiEncoder, word_embeddings: bool = True, layers: int = 0) -> int:
    """Stop training the word embeddings and / or the lowest `layers` layers of every tower's backbone; no
    gradient flows below the first trained layer, so backward skips the frozen ones (about 2/3 of a frozen
    layer's step cost on CPU). Returns the number of weights frozen (DSSM towers have no backbone: 0)."""
    frozen = 0
    for tower in model.towers():
        if tower.backbone is None:
            continue
        for p in backbone_frozen_parameters(tower.backbone, word_embeddings, layers):
            if p.requires_grad:
                p.requires_grad_(False)
                frozen += p.numel()
    return frozen


def stage_frozen_parameters(model: BiEncoder, stage: StageConfig) -> list[nn.Parameter]:
    """The trainable weights a stage keeps as they are: the word table and lowest layers it names
    (`freeze_word_embeddings` / `freeze_layers`), every backbone weight with `freeze_backbone`, and every weight
    whose name contains one of `freeze_params` (each weight once: shared towers name the same weights twice)."""
    params = [p for tower in model.towers() if tower.backbone is not None
              for p in (tower.backbone.parameters() if stage.freeze_backbone else
                        backbone_frozen_parameters(tower.backbone, stage.freeze_word_embeddings,
                                                   stage.freeze_layers))]
    params += [p for name, p in model.named_parameters() if any(x in name for x in stage.freeze_params)]
    return [p for p in {id(p): p for p in params}.values() if p.requires_grad]


def freeze_stage(model: BiEncoder, stage: StageConfig) -> int:
    """Stop training what the stage keeps as it is (`stage_frozen_parameters`), for good: a model built for one
    stage (the distributed job builds one per stage). Returns the number of weights frozen."""
    params = stage_frozen_parameters(model, stage)
    for p in params:
        p.requires_grad_(False)
    return sum(p.numel() for p in params)


@contextmanager
def stage_frozen(model: BiEncoder, stage: StageConfig) -> Iterator[int]:
    """Within the block what the stage keeps as it is (`stage_frozen_parameters`) is frozen; the previous
    `requires_grad` flags come back on exit, so a later stage trains what it names. Keeping the pretrained word
    table and lowest layers is what lets a 12-layer multilingual encoder fine-tune on a few thousand judged queries
    without drifting from its pretrained space; keeping the whole backbone trains an aspect model's heads alone.
    Yields the number of weights frozen."""
    params = stage_frozen_parameters(model, stage)
    for p in params:
        p.requires_grad_(False)
    try:
        yield sum(p.numel() for p in params)
    finally:
        for p in params:
            p.requires_grad_(True)
