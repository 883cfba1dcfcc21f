"""Every model of the family: output shapes, gradients into backbone and head, exact save/load."""

import pytest
import torch

from madr.config import BackboneConfig, ModelConfig, StageConfig
from madr.modeling.batching import make_batch
from madr.modeling.model import BiEncoder, build_model, objective_keys
from madr.training.objectives import pretrain_loss
from madr.training.stage_module import FinetuneBatch, StageModule

TINY = {"hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 2, "intermediate_size": 64,
        "max_position_embeddings": 96}
MODELS = ["bibert", "mpbert", "mtbert", "dssm", "madr", "madral", "mur", "mural"]


def _cfg(name: str, **kw) -> ModelConfig:
    return ModelConfig(name=name, backbone=BackboneConfig(tiny=TINY), max_query_length=16, max_doc_length=48,
                       dssm_hidden=[32, 16], **kw)


def _batches(model, catalog, n=4):
    qs, ps = catalog.queries[:n], catalog.products[:n]
    qb = make_batch(model, [q.text for q in qs], "query", [q.aspects for q in qs])
    pb = make_batch(model, [catalog.product_text(p) for p in ps], "doc", [p.aspects for p in ps])
    return qb, pb


@pytest.mark.parametrize("name", MODELS)
def test_shapes_gradients_and_round_trip(name, catalog, tokenizer, vocabularies, tmp_path):
    torch.manual_seed(0)
    cfg = _cfg(name, projection_dim=24 if name in ("madral", "bibert") else None)
    model = build_model(cfg, tokenizer, vocabularies)
    qb, pb = _batches(model, catalog)
    out = model.encode(qb.input_ids, qb.attention_mask, "query")
    dim = model.embedding_dim
    assert out.embedding.shape == (4, dim), (name, out.embedding.shape)
    if name in ("mpbert", "madr", "madral", "mur", "mural"):
        k = len(out.component_names)
        assert out.fusion_weights.shape == (4, k)
        assert torch.allclose(out.fusion_weights.sum(-1), torch.ones(4), atol=1e-5)
    for key, aspect, gran in objective_keys(cfg):
        assert out.aspect_logits[key].shape == (4, len(vocabularies.get(aspect, gran))), key

    # gradients reach the backbone and the head through the fine-tuning and pretraining objectives
    model.train()
    stage = StageConfig(batch_size=4, aspect_weight=0.5)
    loss, _ = StageModule("finetune", stage, model, gather=False).loss(FinetuneBatch(qb, pb, None, torch.zeros(4)))
    if name != "dssm":
        loss = loss + pretrain_loss(model, qb, pb, stage, torch.Generator().manual_seed(0)).total
    loss.backward()
    tower = model.query_tower
    # BiBERT/MtBERT's CLS head has no weights of its own: its trainable head part is the projection
    # (bibert here) or the shared aspect tables (mtbert).
    head_params = [*tower.head.parameters(), *(tower.projection.parameters() if tower.projection else []),
                   *(model.aspect_predictor.parameters() if model.aspect_predictor is not None else [])]
    assert head_params, f"{name}: nothing trainable outside the backbone"
    assert any(p.grad is not None and p.grad.abs().sum() > 0 for p in head_params), f"{name}: no gradient in the head"
    if tower.backbone is not None:
        bb = [p.grad for p in tower.backbone.parameters()]
        assert any(g is not None and g.abs().sum() > 0 for g in bb), f"{name}: no gradient in the backbone"

    # save / load gives identical outputs
    model.eval()
    with torch.no_grad():
        before_q = model.encode(qb.input_ids, qb.attention_mask, "query")
        before_d = model.encode(pb.input_ids, pb.attention_mask, "doc")
    model.save(tmp_path / name)
    loaded = BiEncoder.load(tmp_path / name).eval()
    with torch.no_grad():
        after_q = loaded.encode(qb.input_ids, qb.attention_mask, "query")
        after_d = loaded.encode(pb.input_ids, pb.attention_mask, "doc")
    assert torch.equal(before_q.embedding, after_q.embedding), f"{name}: query embedding changed on reload"
    assert torch.equal(before_d.embedding, after_d.embedding), f"{name}: doc embedding changed on reload"
    for key in before_q.aspect_logits:
        assert torch.equal(before_q.aspect_logits[key], after_q.aspect_logits[key]), key


def test_saved_model_has_no_pickles(catalog, tokenizer, vocabularies, tmp_path):
    model = build_model(_cfg("madral"), tokenizer, vocabularies)
    path = model.save(tmp_path / "m")
    suffixes = {p.suffix for p in path.rglob("*") if p.is_file()}
    assert not suffixes & {".bin", ".pt", ".pkl", ".pth"}, suffixes
    assert (path / "heads.safetensors").is_file() and (path / "query_backbone" / "model.safetensors").is_file()


def test_shared_towers_are_one_module(tokenizer, vocabularies):
    model = build_model(_cfg("mural", shared_towers=True), tokenizer, vocabularies)
    assert model.doc_tower is model.query_tower
    separate = build_model(_cfg("mural", shared_towers=False), tokenizer, vocabularies)
    assert separate.doc_tower is not separate.query_tower


def test_truncated_backbone_has_k_layers(tokenizer, tmp_path):
    cfg = _cfg("bibert")
    model = build_model(cfg, tokenizer)
    model.save(tmp_path / "full")
    cfg2 = ModelConfig(name="bibert", backbone=BackboneConfig(name_or_path=str(tmp_path / "full" / "query_backbone"),
                                                              num_layers=1), max_doc_length=48)
    model2 = build_model(cfg2, tokenizer)
    assert len(model2.query_tower.backbone.encoder.layer) == 1
    with pytest.raises(ValueError, match="num_layers"):
        build_model(ModelConfig(name="bibert", backbone=BackboneConfig(
            name_or_path=str(tmp_path / "full" / "query_backbone"), num_layers=9), max_doc_length=48), tokenizer)


def test_mural_value_embeddings_unshared_start_at_average_token_embedding(tokenizer, vocabularies):
    model = build_model(_cfg("mural"), tokenizer, vocabularies)
    pred = model.aspect_predictor
    key = "brand/phrase"
    value = vocabularies.get("brand", "phrase").values[0]
    ids = tokenizer(value, add_special_tokens=False)["input_ids"]
    expected = model.query_tower.word_embeddings[ids].mean(0)
    assert torch.allclose(pred.value_table(key)[0], expected, atol=1e-6)
    shared = build_model(_cfg("mural", value_embeddings="shared"), tokenizer, vocabularies)
    table = shared.aspect_predictor.value_table(key, shared.query_tower.word_embeddings)
    assert table.requires_grad and torch.allclose(table[0], shared.query_tower.word_embeddings[ids].mean(0))


def test_aspect_learning_models_need_vocabularies(tokenizer):
    with pytest.raises(ValueError, match="vocabularies"):
        build_model(_cfg("madral"), tokenizer, None)


@pytest.mark.parametrize("name", ["bibert", "mtbert"])
def test_mean_pooling_is_the_masked_token_mean_and_survives_save(name, catalog, tokenizer, vocabularies, tmp_path):
    torch.manual_seed(0)
    model = build_model(_cfg(name, pooling="mean"), tokenizer, vocabularies).eval()
    qb, _ = _batches(model, catalog)
    with torch.no_grad():
        out = model.encode(qb.input_ids, qb.attention_mask, "query")
        for i in range(qb.input_ids.shape[0]):  # each text alone, unpadded: padding must not change its vector
            n = int(qb.attention_mask[i].sum())
            alone = model.encode(qb.input_ids[i:i + 1, :n], qb.attention_mask[i:i + 1, :n], "query")
            expected = alone.sequence_output[0].mean(0)
            assert torch.allclose(out.embedding[i], expected, atol=1e-5), i
            assert not torch.allclose(out.embedding[i], out.cls[i])
        if name == "mtbert":
            assert all(torch.equal(r, out.embedding) for r in out.aspect_repr.values())
    model.save(tmp_path / "m")
    loaded = BiEncoder.load(tmp_path / "m").eval()
    assert loaded.config.pooling == "mean"
    with torch.no_grad():
        again = loaded.encode(qb.input_ids, qb.attention_mask, "query")
    assert torch.allclose(again.embedding, out.embedding, atol=1e-6)


def test_pooling_is_checked():
    with pytest.raises(ValueError, match="model.pooling"):
        _cfg("bibert", pooling="max")
    with pytest.raises(ValueError, match="bibert / mtbert only"):
        _cfg("madral", pooling="mean")


@pytest.mark.parametrize("fusion", ["weighted_sum", "presence", "cls_gating"])
def test_pooled_aspect_init_starts_as_mean_pooling(fusion, catalog, tokenizer, vocabularies):
    """`aspect_init: pooled`: the untrained MADRAL vector is the mean of the backbone's token states (CLS and
    padding excluded), whatever the fusion; `random` is not."""
    torch.manual_seed(0)
    model = build_model(_cfg("madral", fusion=fusion, aspect_init="pooled"), tokenizer, vocabularies).eval()
    qb, pb = _batches(model, catalog)
    with torch.no_grad():
        out = model.encode(pb.input_ids, pb.attention_mask, "doc")
        seq = out.sequence_output
        mask = pb.attention_mask.clone().float()
        mask[:, 0] = 0
        mean = (seq * mask[..., None]).sum(1) / mask.sum(1, keepdim=True)
        cos = torch.nn.functional.cosine_similarity(out.embedding, mean)
        assert cos.min() > 0.999, cos
        torch.manual_seed(0)
        random = build_model(_cfg("madral", fusion=fusion), tokenizer, vocabularies).eval()
        other = random.encode(pb.input_ids, pb.attention_mask, "doc").embedding
        assert torch.nn.functional.cosine_similarity(other, mean).max() < 0.9
