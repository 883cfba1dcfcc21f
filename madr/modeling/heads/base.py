"""What every backbone-based head shares: running the encoder."""

from __future__ import annotations

import torch
from transformers import PreTrainedModel


def run_backbone(
    backbone: PreTrainedModel,
    input_ids: torch.Tensor | None,
    attention_mask: torch.Tensor,
    inputs_embeds: torch.Tensor | None = None,
) -> torch.Tensor:
    """Last hidden states [B, L, H] of `backbone` (paper 001 Eq. 1)."""
    if inputs_embeds is not None:
        out = backbone(inputs_embeds=inputs_embeds, attention_mask=attention_mask)
    else:
        out = backbone(input_ids=input_ids, attention_mask=attention_mask)
    return out.last_hidden_state
