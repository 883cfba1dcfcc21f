"""MUR / MURAL head: aspect tokens inserted after CLS, fused by CLS-gating (paper 001 Sec. 4.1, 4.3, 4.4).

The input becomes X = (x_0, o_1..o_K, x_1..x_n): K learned token embeddings are placed between CLS and
the content, so they attend to (and are attended by) the content in every layer and also learn from
MLM (Sec. 4.1). K depends on the grouping (Sec. 4.3):
  single (Eq. 3): one token per (aspect, granularity) objective, K = |A| * |G|;
  granularity (Eq. 4): one token per granularity shared by all aspects, K = |G|;
  aspect (Eq. 5): one token per aspect shared by all granularities, K = |A|.
The final vector is sum_k w_k h(o_k) with w = softmax(U h(x_0) + b) (Eq. 6-7).
"""

from __future__ import annotations

import torch
from torch import nn
from transformers import PreTrainedModel

from madr.modeling.fusion import CLSGating
from madr.modeling.heads.base import run_backbone
from madr.modeling.outputs import TowerOutput


def objective_token_index(aspects: list[str], granularities: list[str], grouping: str) -> tuple[list[str], dict[str, int]]:
    """Token names and, for every objective key "aspect/granularity", the token that carries it."""
    if grouping == "single":
        names = [f"{a}/{g}" for a in aspects for g in granularities]
        return names, {n: i for i, n in enumerate(names)}
    if grouping == "granularity":
        names = list(granularities)
        return names, {f"{a}/{g}": names.index(g) for a in aspects for g in granularities}
    if grouping == "aspect":
        names = list(aspects)
        return names, {f"{a}/{g}": names.index(a) for a in aspects for g in granularities}
    raise ValueError(f"grouping {grouping!r} is not one of single, granularity, aspect")


class AspectTokensHead(nn.Module):
    def __init__(self, aspects: list[str], granularities: list[str], grouping: str, hidden: int,
                 predict_aspects: bool) -> None:
        super().__init__()
        self.component_names, self.objective_token = objective_token_index(aspects, granularities, grouping)
        self.predict_aspects = predict_aspects
        k = len(self.component_names)
        self.aspect_tokens = nn.Parameter(torch.randn(k, hidden) * 0.02)
        self.fusion = CLSGating(k, hidden)

    @property
    def num_tokens(self) -> int:
        return len(self.component_names)

    def forward(self, backbone: PreTrainedModel, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> TowerOutput:
        k = self.num_tokens
        embeds = backbone.get_input_embeddings()(input_ids)
        b = embeds.shape[0]
        tokens = self.aspect_tokens.unsqueeze(0).expand(b, -1, -1).to(embeds.dtype)
        embeds = torch.cat([embeds[:, :1], tokens, embeds[:, 1:]], dim=1)
        mask = torch.cat([attention_mask[:, :1], attention_mask.new_ones(b, k), attention_mask[:, 1:]], dim=1)
        seq = run_backbone(backbone, None, mask, inputs_embeds=embeds)
        cls, comps = seq[:, 0], seq[:, 1:1 + k]
        content = torch.cat([seq[:, :1], seq[:, 1 + k:]], dim=1)
        fused = self.fusion(comps, cls)
        repr_ = {key: comps[:, i] for key, i in self.objective_token.items()} if self.predict_aspects else {}
        return TowerOutput(embedding=fused.embedding, cls=cls, sequence_output=content,
                           component_names=list(self.component_names), components=comps,
                           fusion_weights=fused.weights, aspect_repr=repr_)
