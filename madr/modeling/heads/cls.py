"""CLS head: BiBERT (paper 000 Sec. 8.2) and MtBERT (CLS also predicts every aspect)."""

from __future__ import annotations

import torch
from torch import nn
from transformers import PreTrainedModel

from madr.modeling.heads.base import run_backbone
from madr.modeling.outputs import TowerOutput


def mean_pool(seq: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
    """Masked mean of token states [B, L, H] -> [B, H]; padding positions do not count."""
    mask = attention_mask.unsqueeze(-1).to(seq.dtype)
    return (seq * mask).sum(1) / mask.sum(1).clamp_min(1.0)


class ClsHead(nn.Module):
    """The CLS hidden state (or, with `pooling="mean"`, the masked mean of the token states) is the text vector.

    With `predict_aspects` (MtBERT) the same vector is the representation every aspect is
    predicted from, which is what paper 001 Sec. 4.1 criticises: CLS mixes aspect and content.
    """

    def __init__(self, aspects: list[str], predict_aspects: bool, pooling: str = "cls") -> None:
        super().__init__()
        if pooling not in ("cls", "mean"):
            raise ValueError(f"pooling must be 'cls' or 'mean', got {pooling!r}")
        self.aspects = list(aspects) if predict_aspects else []
        self.pooling = pooling

    def forward(self, backbone: PreTrainedModel, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> TowerOutput:
        seq = run_backbone(backbone, input_ids, attention_mask)
        cls = seq[:, 0]
        vec = mean_pool(seq, attention_mask) if self.pooling == "mean" else cls
        return TowerOutput(embedding=vec, cls=cls, sequence_output=seq,
                           aspect_repr={a: vec for a in self.aspects})
