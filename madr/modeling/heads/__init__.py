"""Tower heads: what turns a backbone's sequence output into the retrieval vector (one module per head;
`base` holds what they share)."""

from madr.modeling.heads.aspect_attention import (
    AspectAttentionHead,
    AspectExtractionNetwork,
    first_content_tokens,
)
from madr.modeling.heads.aspect_tokens import AspectTokensHead, objective_token_index
from madr.modeling.heads.base import run_backbone
from madr.modeling.heads.cls import ClsHead
from madr.modeling.heads.dssm import DSSMEncoder
from madr.modeling.heads.field_attention import FieldAttention, FieldAttentionOutput, concat_fields
from madr.modeling.heads.hybrid import HybridHead, term_weights, top_k_sparsify
from madr.modeling.heads.multi_pool import MultiPoolHead

__all__ = [
    "AspectAttentionHead",
    "AspectExtractionNetwork",
    "AspectTokensHead",
    "ClsHead",
    "DSSMEncoder",
    "FieldAttention",
    "FieldAttentionOutput",
    "HybridHead",
    "MultiPoolHead",
    "concat_fields",
    "first_content_tokens",
    "objective_token_index",
    "run_backbone",
    "term_weights",
    "top_k_sparsify",
]
