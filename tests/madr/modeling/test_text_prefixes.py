"""`ModelConfig.text_prefixes` (the e5 convention "query: " / "passage: "): put before each side's texts where
the model tokenises them, validated by side, kept through save / load."""

from __future__ import annotations

import pytest
import torch

from madr.config import BackboneConfig, ModelConfig
from madr.modeling.model import BiEncoder, build_model

TINY = {"hidden_size": 32, "num_hidden_layers": 1, "num_attention_heads": 2, "intermediate_size": 64,
        "max_position_embeddings": 64}


def _model(tokenizer, prefixes):
    torch.manual_seed(0)
    cfg = ModelConfig(name="bibert", pooling="mean", backbone=BackboneConfig(tiny=TINY), max_query_length=16,
                      max_doc_length=16, text_prefixes=prefixes)
    return build_model(cfg, tokenizer, None)


def test_each_side_gets_its_prefix(tokenizer, tmp_path):
    model = _model(tokenizer, {"query": "query: ", "doc": "passage: "})
    for side, prefix in (("query", "query: "), ("doc", "passage: ")):
        got = model.tokenize(["red socks"], side)["input_ids"][0].tolist()
        assert got == tokenizer(prefix + "red socks")["input_ids"]
        assert got != tokenizer("red socks")["input_ids"]
    plain = _model(tokenizer, {})
    assert plain.tokenize(["red socks"], "doc")["input_ids"][0].tolist() == tokenizer("red socks")["input_ids"]
    loaded = BiEncoder.load(model.save(tmp_path / "m"))
    assert loaded.config.text_prefixes == {"query": "query: ", "doc": "passage: "}
    torch.testing.assert_close(loaded.encode_texts(["red socks"], "query"), model.encode_texts(["red socks"], "query"))


def test_unknown_side_is_an_error():
    with pytest.raises(ValueError, match="text_prefixes"):
        ModelConfig(name="bibert", text_prefixes={"passage": "passage: "})
