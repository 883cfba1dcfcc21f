"""Tower heads: what turns a backbone's sequence output into the retrieval vector (DESIGN.md)."""

from madr.heads.aspect_attention import AspectAttentionHead, AspectExtractionNetwork
from madr.heads.aspect_tokens import AspectTokensHead, objective_token_index
from madr.heads.base import run_backbone
from madr.heads.cls import ClsHead
from madr.heads.dssm import DSSMEncoder
from madr.heads.field_attention import FieldAttention, FieldAttentionOutput, concat_fields
from madr.heads.hybrid import HybridHead, term_weights, top_k_sparsify
from madr.heads.multi_pool import MultiPoolHead

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
    "objective_token_index",
    "run_backbone",
    "term_weights",
    "top_k_sparsify",
]
