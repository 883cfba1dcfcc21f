"""MpBERT: pool the encodings of the first K tokens with an aspect fusion network (paper 000 Sec. 8.2).

"We implement both models using the same number of tokens/aspects for pooling/fusion using the same
AFN": K equals MADRAL's number of aspects (including OTHER) and the fusion network is the same class.
"""

from __future__ import annotations

import torch
from torch import nn
from transformers import PreTrainedModel

from madr.modeling.fusion import build_fusion
from madr.modeling.heads.base import run_backbone
from madr.modeling.outputs import TowerOutput


class MultiPoolHead(nn.Module):
    def __init__(self, num_tokens: int, hidden: int, fusion: str) -> None:
        super().__init__()
        self.num_tokens = num_tokens
        self.fusion = build_fusion(fusion, num_tokens, hidden)

    def forward(self, backbone: PreTrainedModel, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> TowerOutput:
        seq = run_backbone(backbone, input_ids, attention_mask)
        k = self.num_tokens
        comps = seq[:, :k]
        mask = attention_mask[:, :k]
        if comps.shape[1] < k:  # every text in the batch is shorter than K tokens
            pad = k - comps.shape[1]
            comps = nn.functional.pad(comps, (0, 0, 0, pad))
            mask = nn.functional.pad(mask, (0, pad))
        fused = self.fusion(comps, seq[:, 0], mask)
        return TowerOutput(embedding=fused.embedding, cls=seq[:, 0], sequence_output=seq,
                           component_names=[f"tok{i}" for i in range(k)], components=comps,
                           fusion_weights=fused.weights, presence_logits=fused.presence_logits)
