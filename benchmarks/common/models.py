"""The models the speed benchmarks build: a packaged backbone, or a tiny BERT built from its config with a WordPiece
trained on the benchmark's texts (`bench_model`); `served_hybrid` is the hybrid model the serving benchmarks time
(paper 002: CLS dense vector + SPLADE sparse vector from the MLM head)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

TINY = {"hidden_size": 64, "num_hidden_layers": 1, "num_attention_heads": 2, "intermediate_size": 128,
        "max_position_embeddings": 128}


def bench_model(backbone: str, tiny: dict | None, texts: list[str], tokenizer_dir: str | Path, vocab_size: int,
                **fields: Any):
    """A `BiEncoder` of `ModelConfig(**fields)`, torch seeded with 0: on `backbone` (a name / path) or, with `tiny`,
    on a random BERT of that config with a WordPiece of `vocab_size` trained on `texts` (in `tokenizer_dir`)."""
    import torch

    from madr.config import BackboneConfig, ModelConfig
    from madr.modeling.backbone import resolve_backbone_path
    from madr.modeling.model import build_model
    from madr.modeling.tokenization import load_tokenizer, train_wordpiece_tokenizer

    torch.manual_seed(0)
    if tiny is not None:
        tok = train_wordpiece_tokenizer(texts, vocab_size=vocab_size, out_dir=str(tokenizer_dir))
        bb = BackboneConfig(tiny=dict(tiny))
    else:
        tok = load_tokenizer(resolve_backbone_path(backbone))
        bb = BackboneConfig(name_or_path=backbone)
    return build_model(ModelConfig(backbone=bb, **fields), tok)


def served_hybrid(backbone: str, texts: list[str], tokenizer_dir: str | Path):
    """A seeded hybrid `BiEncoder` (top-64 sparse terms, lambda 0.5, dot) on `backbone` ("tiny": 1 layer, 64 wide,
    its WordPiece of 2,000 pieces trained on `texts`; or a name / path)."""
    return bench_model(backbone, TINY if backbone == "tiny" else None, texts, tokenizer_dir, 2000, name="hybrid",
                       sparse_top_k=64, max_query_length=32, max_doc_length=64, hybrid_lambda=0.5, similarity="dot")
