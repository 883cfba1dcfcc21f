"""The one structured output every tower returns: the vector plus what explains it.

Paper 000 Table 8 is the shape of the explanation: per-aspect predictions with confidence, presence
probabilities and fusion weights. `/explain` serves these fields.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch


@dataclass
class TowerOutput:
    """Output of one tower (query or document) for a batch of B texts.

    embedding: [B, d] the final vector used for search (after the optional projection).
    cls: [B, H] the CLS hidden state (None for DSSM).
    sequence_output: [B, L, H] last hidden states of the content (None for DSSM).
    component_names: names of the K fused components (aspects + "other", "tok0".., "category/phrase"..).
    components: [B, K, H] the component embeddings before fusion (None for single-vector heads); [B, K, d]
        when the head projects them (MADR / MADRAL with `projection_dim` d, paper 000 Sec. 8.2).
    fusion_weights: [B, K] weights used to fuse the components (rows sum to one).
    presence_logits: [B, K] pre-sigmoid aspect presence (Presence Weighting, paper 000 Eq. 5).
    attention: [B, K, L] Aspect Extraction Network attention over tokens (paper 000 Table 2).
    aspect_repr: objective key ("brand" or "brand/word") -> [B, H] (or projected [B, d]) representation
        that predicts it.
    aspect_logits: the same keys -> [B, |V|] scores over the aspect's value vocabulary (filled by the
        bi-encoder's shared aspect predictor).
    sparse: [B, vocab] lexical term weights, top-k sparsified, zeros elsewhere (hybrid head, paper 002).
    """

    embedding: torch.Tensor
    cls: torch.Tensor | None = None
    sequence_output: torch.Tensor | None = None
    component_names: list[str] = field(default_factory=list)
    components: torch.Tensor | None = None
    fusion_weights: torch.Tensor | None = None
    presence_logits: torch.Tensor | None = None
    attention: torch.Tensor | None = None
    aspect_repr: dict[str, torch.Tensor] = field(default_factory=dict)
    aspect_logits: dict[str, torch.Tensor] = field(default_factory=dict)
    sparse: torch.Tensor | None = None

    @property
    def presence(self) -> torch.Tensor | None:
        return None if self.presence_logits is None else torch.sigmoid(self.presence_logits)
