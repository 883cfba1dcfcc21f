"""The hybrid model the serving benchmarks time (paper 002: CLS dense vector + SPLADE sparse vector from the MLM
head): a packaged backbone, or a 1-layer, 64-wide BERT built from its config with a WordPiece trained on `texts`."""

from __future__ import annotations

from pathlib import Path

TINY = {"hidden_size": 64, "num_hidden_layers": 1, "num_attention_heads": 2, "intermediate_size": 128,
        "max_position_embeddings": 128}


def served_hybrid(backbone: str, texts: list[str], tokenizer_dir: str | Path):
    """A seeded hybrid `BiEncoder` (top-64 sparse terms, lambda 0.5, dot) on `backbone` ("tiny", or a name / path)."""
    import torch

    from madr.config import BackboneConfig, ModelConfig
    from madr.modeling.backbone import resolve_backbone_path
    from madr.modeling.model import build_model
    from madr.modeling.tokenization import load_tokenizer, train_wordpiece_tokenizer

    torch.manual_seed(0)
    if backbone == "tiny":
        tok = train_wordpiece_tokenizer(texts, vocab_size=2000, out_dir=str(tokenizer_dir))
        bb = BackboneConfig(tiny=dict(TINY))
    else:
        tok = load_tokenizer(resolve_backbone_path(backbone))
        bb = BackboneConfig(name_or_path=backbone)
    cfg = ModelConfig(name="hybrid", backbone=bb, sparse_top_k=64, max_query_length=32, max_doc_length=64,
                      hybrid_lambda=0.5, similarity="dot")
    return build_model(cfg, tok)
