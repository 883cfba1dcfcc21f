"""A random tiny BERT saved with the session's WordPiece tokenizer, loadable by path: the stand-in for
all-MiniLM / multilingual-e5-small in the benchmarks' end-to-end tests (they check wiring, not quality)."""

from __future__ import annotations

from pathlib import Path

import torch
from transformers import BertConfig, BertModel


def save_tiny_bert(path: Path, tokenizer, seed: int = 0, layers: int = 2, max_positions: int = 128,
                   pooling_layer: bool = True) -> str:
    """A seeded random BERT (hidden 32, 2 heads, `layers` layers) and `tokenizer` in `path`; returns the path."""
    torch.manual_seed(seed)
    config = BertConfig(vocab_size=len(tokenizer), hidden_size=32, num_hidden_layers=layers, num_attention_heads=2,
                        intermediate_size=64, max_position_embeddings=max_positions)
    BertModel(config, add_pooling_layer=pooling_layer).save_pretrained(str(path))
    tokenizer.save_pretrained(str(path))
    return str(path)
