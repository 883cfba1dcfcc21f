"""MADR / MADRAL head: the Aspect Extraction Network (paper 000 Sec. 4) + an Aspect Fusion Network (Sec. 6)."""

from __future__ import annotations

import math

import torch
from torch import nn
from transformers import PreTrainedModel

from madr.modeling.fusion import build_fusion
from madr.modeling.heads.base import run_backbone
from madr.modeling.outputs import TowerOutput

OTHER = "other"


class AspectExtractionNetwork(nn.Module):
    """Eq. 1-2: E_A = softmax((Q W^Q)(phi W^K)^T / sqrt(H)) (phi W^V).

    Q [K, H] are input-independent, learned aspect queries (one per aspect, plus OTHER). The CLS
    position is masked out so no aspect attends to it (Sec. 4, "we mask the CLS token"), and so is
    padding. Returns the aspect embeddings [B, K, H] and the attention [B, K, L].
    """

    def __init__(self, num_aspects: int, hidden: int) -> None:
        super().__init__()
        self.hidden = hidden
        self.queries = nn.Parameter(torch.randn(num_aspects, hidden) * hidden**-0.5)
        self.w_q = nn.Linear(hidden, hidden, bias=False)
        self.w_k = nn.Linear(hidden, hidden, bias=False)
        self.w_v = nn.Linear(hidden, hidden, bias=False)

    @torch.no_grad()
    def start_as_mean_pooling(self, scale: float = 1e-3) -> None:
        """W^V = I and W^Q scaled by `scale`, so that every aspect attends near-uniformly and E_a starts as the
        mean of the token states (CLS excluded): with any fusion of Sec. 6 (weights normalised over the
        components) the untrained head is then the backbone's mean pooling, the convention of sentence
        encoders such as e5, and aspect learning specialises the components from there."""
        self.w_v.weight.copy_(torch.eye(self.hidden))
        self.w_q.weight.mul_(scale)

    def forward(self, sequence_output: torch.Tensor, attention_mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        q = self.w_q(self.queries)  # [K, H]
        k = self.w_k(sequence_output)  # [B, L, H]
        v = self.w_v(sequence_output)
        scores = torch.einsum("kh,blh->bkl", q, k) / math.sqrt(self.hidden)
        allowed = attention_mask.bool().clone()
        allowed[:, 0] = False  # CLS
        # A text of only [CLS] would leave nothing to attend to; let it attend to CLS rather than NaN.
        empty = ~allowed.any(dim=1)
        allowed[empty, 0] = True
        scores = scores.masked_fill(~allowed[:, None, :], float("-inf"))
        attn = torch.softmax(scores, dim=-1)
        return torch.einsum("bkl,blh->bkh", attn, v), attn


def first_content_tokens(sequence_output: torch.Tensor, attention_mask: torch.Tensor,
                         k: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The encodings of the first `k` content tokens (positions 1..k, after CLS) as aspect embeddings [B, k, H]:
    the "first-k" variant of the MADRAL reproducibility study (Bi et al., ECIR 2024, arXiv 2401.03648, Sec. 4),
    which replaces the learned aspect queries with positions the pretrained encoder already fills. Returns the
    embeddings, the one-hot attention [B, k, L] that picks them, and their mask [B, k] (0 where a text is
    shorter than k tokens: those positions hold padding and take no fusion weight; a slot past the batch's
    longest text is zeros)."""
    batch, length, hidden = sequence_output.shape
    stop = min(k + 1, length)
    comps, mask = sequence_output[:, 1:stop], attention_mask[:, 1:stop]
    missing = k - comps.shape[1]
    if missing > 0:
        comps = nn.functional.pad(comps, (0, 0, 0, missing))
        mask = nn.functional.pad(mask, (0, missing))
    attn = torch.zeros(batch, k, length, dtype=sequence_output.dtype, device=sequence_output.device)
    rows = torch.arange(stop - 1, device=sequence_output.device)
    attn[:, rows, rows + 1] = 1.0
    return comps, attn, mask


class AspectAttentionHead(nn.Module):
    """AEN over the backbone's sequence output, then fusion into one vector.

    Components are the explicit aspects in config order followed by OTHER (when `use_other`), which
    captures what the explicit aspects miss and never receives an aspect loss (Sec. 4 and Eq. 7).
    MADRAL predicts the explicit aspects from their embeddings (Sec. 5); MADR has no aspect learning.

    With `projection_dim` d, the aspect embeddings are projected to d before anything uses them (Sec. 8.2:
    "the aspect, query and document embeddings are projected to 128 dimensions"): fusion combines the
    projected E_a, so the query / document embedding (Eq. 4) is d-wide without a second projection; Presence
    Weighting's sigmoid layer reads the projected E_a (Eq. 5); and the aspect prediction softmax(E_a U_a^T +
    b_a) (Sec. 5) scores the projected E_a against d-wide value tables (`aspect_dim`). CLS-Gating still
    reads the H-wide CLS encoding (Sec. 6.3). One projection per tower serves every aspect.

    The reproducibility study of MADRAL (Bi et al., ECIR 2024, arXiv 2401.03648) found that learning OTHER from
    scratch hurts and proposed two alternatives, both here: `other_from="cls"` takes the CLS encoding as the OTHER
    component ("cls-as-other"), and `extraction="first_tokens"` takes the explicit aspects (and OTHER, unless
    from CLS) from the first content tokens' encodings instead of the AEN ("first-k", `first_content_tokens`).
    """

    def __init__(self, aspects: list[str], use_other: bool, hidden: int, fusion: str, predict_aspects: bool,
                 projection_dim: int | None = None, extraction: str = "attention", other_from: str = "extraction") -> None:
        super().__init__()
        self.component_names = list(aspects) + ([OTHER] if use_other else [])
        self.predicted = list(aspects) if predict_aspects else []
        self.extraction = extraction
        self.other_from_cls = use_other and other_from == "cls"
        extracted = len(self.component_names) - int(self.other_from_cls)
        self.aen = AspectExtractionNetwork(extracted, hidden) if extraction == "attention" else None
        self.num_extracted = extracted
        self.projection = nn.Linear(hidden, projection_dim) if projection_dim else None
        self.aspect_dim = projection_dim or hidden
        self.fusion = build_fusion(fusion, len(self.component_names), self.aspect_dim, cls_dim=hidden)

    def forward(self, backbone: PreTrainedModel, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> TowerOutput:
        seq = run_backbone(backbone, input_ids, attention_mask)
        if self.aen is not None:
            comps, attn = self.aen(seq, attention_mask)
            mask = None
        else:
            comps, attn, mask = first_content_tokens(seq, attention_mask, self.num_extracted)
        if self.other_from_cls:  # OTHER is the CLS encoding: it "attends" to position 0
            comps = torch.cat([comps, seq[:, :1]], dim=1)
            attn = torch.cat([attn, nn.functional.one_hot(torch.zeros_like(attn[:, :1, 0], dtype=torch.long),
                                                          attn.shape[-1]).to(attn.dtype)], dim=1)
            if mask is not None:
                mask = torch.cat([mask, attention_mask[:, :1]], dim=1)
        if self.projection is not None:
            comps = self.projection(comps)
        fused = self.fusion(comps, seq[:, 0], mask)
        index = {name: i for i, name in enumerate(self.component_names)}
        return TowerOutput(
            embedding=fused.embedding, cls=seq[:, 0], sequence_output=seq,
            component_names=list(self.component_names), components=comps,
            fusion_weights=fused.weights, presence_logits=fused.presence_logits, attention=attn,
            aspect_repr={a: comps[:, index[a]] for a in self.predicted},
        )
