"""Head internals: AEN masking (paper 000 Sec. 4) and MURAL token grouping (paper 001 Sec. 4.3)."""

import torch

from madr.modeling.heads import AspectExtractionNetwork, first_content_tokens, objective_token_index


def test_aen_gives_cls_and_padding_zero_attention():
    torch.manual_seed(0)
    aen = AspectExtractionNetwork(num_aspects=4, hidden=8)
    seq = torch.randn(2, 5, 8)
    mask = torch.tensor([[1, 1, 1, 1, 1], [1, 1, 1, 0, 0]])
    emb, attn = aen(seq, mask)
    assert emb.shape == (2, 4, 8) and attn.shape == (2, 4, 5)
    assert torch.all(attn[:, :, 0] == 0), f"CLS must get zero attention: {attn[:, :, 0]}"
    assert torch.all(attn[1, :, 3:] == 0), "padding must get zero attention"
    assert torch.allclose(attn.sum(-1), torch.ones(2, 4))


def test_aen_matches_equation_1_2_by_hand():
    torch.manual_seed(1)
    aen = AspectExtractionNetwork(num_aspects=2, hidden=4)
    seq = torch.randn(1, 3, 4)
    mask = torch.ones(1, 3, dtype=torch.long)
    emb, _ = aen(seq, mask)
    q = aen.queries @ aen.w_q.weight.T
    k = seq[0] @ aen.w_k.weight.T
    v = seq[0] @ aen.w_v.weight.T
    scores = q @ k.T / 2.0  # sqrt(H) = 2
    scores[:, 0] = float("-inf")  # CLS masked
    expected = torch.softmax(scores, -1) @ v
    assert torch.allclose(emb[0], expected, atol=1e-6)


def test_mural_grouping_token_counts():
    aspects, grans = ["brand", "color"], ["phrase", "word", "token"]
    names, idx = objective_token_index(aspects, grans, "single")
    assert len(names) == 6 and len(set(idx.values())) == 6
    names, idx = objective_token_index(aspects, grans, "granularity")
    assert names == grans and idx["brand/word"] == idx["color/word"] == 1
    names, idx = objective_token_index(aspects, grans, "aspect")
    assert names == aspects and idx["color/phrase"] == idx["color/token"] == 1


def test_first_content_tokens_take_positions_after_cls_and_mask_short_texts():
    """The "first-k" aspect embeddings of the MADRAL reproducibility study (ECIR 2024)."""
    seq = torch.randn(2, 4, 8)
    mask = torch.tensor([[1, 1, 1, 1], [1, 1, 0, 0]])
    comps, attn, comp_mask = first_content_tokens(seq, mask, 4)
    assert comps.shape == (2, 4, 8) and attn.shape == (2, 4, 4)
    assert torch.equal(comps[:, :3], seq[:, 1:4]) and torch.all(comps[:, 3] == 0)  # a 4th slot past the batch
    assert comp_mask.tolist() == [[1, 1, 1, 0], [1, 0, 0, 0]]
    assert torch.equal(torch.einsum("bkl,blh->bkh", attn, seq), comps)  # the one-hot attention picks them


def _aspect_model(tokenizer, vocabularies, **kw):
    from madr.config import BackboneConfig, ModelConfig
    from madr.modeling.model import build_model

    torch.manual_seed(0)
    tiny = {"hidden_size": 32, "num_hidden_layers": 1, "num_attention_heads": 2, "intermediate_size": 64,
            "max_position_embeddings": 96}
    cfg = ModelConfig(name="madral", backbone=BackboneConfig(tiny=tiny), max_query_length=16, max_doc_length=48,
                      **kw)
    return build_model(cfg, tokenizer, vocabularies)


def _encode_queries(model, catalog):
    from madr.modeling.batching import make_batch

    qs = catalog.queries[:6]
    batch = make_batch(model, [q.text for q in qs], "query", [q.aspects for q in qs])
    return batch, model.encode(batch.input_ids, batch.attention_mask, "query")


def test_other_from_cls_is_the_cls_encoding_and_the_aen_extracts_the_explicit_aspects(catalog, tokenizer,
                                                                                        vocabularies, tmp_path):
    from madr.modeling.model import BiEncoder

    model = _aspect_model(tokenizer, vocabularies, other_from="cls")
    model.eval()
    _, out = _encode_queries(model, catalog)
    head = model.query_tower.head
    assert out.component_names == ["category", "brand", "color", "other"]
    assert head.aen.queries.shape[0] == 3, "no learned query for OTHER"
    assert torch.equal(out.components[:, -1], out.cls)
    assert torch.all(out.attention[:, -1, 0] == 1) and out.attention.shape[1] == 4
    loaded = BiEncoder.load(model.save(tmp_path / "model")).eval()  # the setting travels with the saved model
    assert loaded.config.other_from == "cls"
    with torch.no_grad():
        assert torch.allclose(_encode_queries(loaded, catalog)[1].embedding, out.embedding, atol=1e-6)


def test_first_token_aspects_train_through_the_backbone_and_still_predict_aspects(catalog, tokenizer, vocabularies):
    from madr.training.objectives import aspect_loss

    model = _aspect_model(tokenizer, vocabularies, aspect_extraction="first_tokens")
    batch, out = _encode_queries(model, catalog)
    head = model.query_tower.head
    assert head.aen is None
    lengths = batch.attention_mask.sum(1)
    assert torch.equal(out.components, out.sequence_output[:, 1:5])
    short = lengths <= 4  # a text whose 4th content slot is padding gives that slot no fusion weight
    assert short.any(), "the sample needs a query of at most 3 content tokens"
    assert torch.all(out.fusion_weights[short][torch.arange(4)[None, :] >= (lengths[short, None] - 1)] == 0)
    loss, parts = aspect_loss(model, out, batch, "query")
    assert {"ap_category", "ap_brand", "ap_color"} <= set(parts), parts
    loss.backward()
    grads = [p.grad for p in model.query_tower.backbone.parameters() if p.grad is not None]
    assert grads and sum(float(g.abs().sum()) for g in grads) > 0, "the aspect loss must reach the encoder"


def test_aspect_extraction_settings_are_checked_at_load():
    import pytest

    from madr.config import ModelConfig

    with pytest.raises(ValueError, match="aspect_extraction"):
        ModelConfig(aspect_extraction="last_tokens")
    with pytest.raises(ValueError, match="other_from"):
        ModelConfig(other_from="mean")
    with pytest.raises(ValueError, match="pooled"):
        ModelConfig(aspect_init="pooled", aspect_extraction="first_tokens")
