"""CLS head: BiBERT (paper 000 Sec. 8.2) and MtBERT (CLS also predicts every aspect)."""

from __future__ import annotations

import torch
from torch import nn
from transformers import PreTrainedModel

from madr.heads.base import run_backbone
from madr.outputs import TowerOutput


class ClsHead(nn.Module):
    """The CLS hidden state is the text vector.

    With `predict_aspects` (MtBERT) the same CLS vector is the representation every aspect is
    predicted from, which is what paper 001 Sec. 4.1 criticises: CLS mixes aspect and content.
    """

    def __init__(self, aspects: list[str], predict_aspects: bool) -> None:
        super().__init__()
        self.aspects = list(aspects) if predict_aspects else []

    def forward(self, backbone: PreTrainedModel, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> TowerOutput:
        seq = run_backbone(backbone, input_ids, attention_mask)
        cls = seq[:, 0]
        return TowerOutput(embedding=cls, cls=cls, sequence_output=seq,
                           aspect_repr={a: cls for a in self.aspects})
