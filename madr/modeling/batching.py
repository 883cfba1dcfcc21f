"""Turning texts and their aspect annotations into model tensors."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

from madr.modeling.model import BiEncoder, objective_keys


@dataclass
class TextBatch:
    """Tokenised texts for one tower plus aspect labels.

    aspect_labels: objective key -> [B, M] value ids padded with -1 (multi-valued annotations).
    aspect_present: [B, A] 1.0 where the text has any annotation of explicit aspect a (paper 000
        Sec. 6.2: "if an aspect does not have any annotations then that aspect is not presented").
    """

    input_ids: torch.Tensor
    attention_mask: torch.Tensor
    aspect_labels: dict[str, torch.Tensor] = field(default_factory=dict)
    aspect_present: torch.Tensor | None = None


def pad_labels(rows: Sequence[Sequence[int]]) -> torch.Tensor:
    width = max([len(r) for r in rows] + [1])
    out = torch.full((len(rows), width), -1, dtype=torch.long)
    for i, r in enumerate(rows):
        if r:
            out[i, : len(r)] = torch.tensor(list(r), dtype=torch.long)
    return out


def make_batch(model: BiEncoder, texts: Sequence[str], side: str,
               aspects: Sequence[dict[str, list[str]]] | None = None) -> TextBatch:
    """Tokenise `texts` for `side` and encode their annotations with the model's vocabularies, on the model's
    device."""
    enc = model.tokenize(list(texts), side)
    batch = TextBatch(enc["input_ids"], enc["attention_mask"])
    if aspects is None:
        return batch_to(batch, model_device(model))
    if len(aspects) != len(texts):
        raise ValueError(f"make_batch: {len(texts)} texts but {len(aspects)} aspect annotations")
    names = model.config.aspects
    batch.aspect_present = torch.tensor(
        [[1.0 if ann.get(a) else 0.0 for a in names] for ann in aspects], dtype=torch.float32
    )
    vocab = model.vocabularies
    for key, aspect, gran in objective_keys(model.config):
        voc = vocab.get(aspect, gran)
        batch.aspect_labels[key] = pad_labels([voc.encode(ann.get(aspect, [])) for ann in aspects])
    return batch_to(batch, model_device(model))


def model_device(model: torch.nn.Module) -> torch.device:
    """Where the model's weights are (the CPU for a model without any)."""
    return next(model.parameters(), torch.empty(0)).device


def batch_to(batch: TextBatch, device: torch.device) -> TextBatch:
    """`batch` with every tensor on `device` (itself when already there)."""
    if batch.input_ids.device == device:
        return batch
    return TextBatch(batch.input_ids.to(device), batch.attention_mask.to(device),
                     {k: v.to(device) for k, v in batch.aspect_labels.items()},
                     None if batch.aspect_present is None else batch.aspect_present.to(device))
