"""Paper 004 Sec. IV as a multi-task config option: `tasks.click.field_attention` (Eq. 8-9) reaches the encoder,
the click task's training, the held-out scoring and the saved model; concatenation stays the default."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from madr.modeling.heads.field_attention import FieldAttention
from madr.modeling.model import FIELD_ATTENTION_FILE, BiEncoder
from madr.recipes.multitask.config import MultiTaskExperimentConfig, load_multitask_config
from madr.recipes.multitask.data import build_data
from madr.recipes.multitask.encoders import build_encoder, build_tasks, build_tokenizer, train_encoder
from madr.recipes.multitask.evaluation import click_pair_scores

TINY = {"hidden_size": 32, "num_hidden_layers": 1, "num_attention_heads": 2, "intermediate_size": 64,
        "max_position_embeddings": 48, "hidden_dropout_prob": 0.0, "attention_probs_dropout_prob": 0.0}
SMALL = {"steps": 6,
         "data": {"click_queries": 40, "click_products": 120, "nli_train": 60, "nli_eval": 30, "parallel_train": 60,
                  "parallel_eval": 30},
         "model": {"backbone": {"tiny": TINY}, "doc_layers": 1, "projection_dim": 16, "max_doc_length": 24,
                   "max_query_length": 12, "tokenizer_vocab_size": 600},
         "schedule": {"batch_size": 8}, "optimizer": {"learning_rate": 1e-3, "warmup_steps": 0},
         "student": {"enabled": False}}


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """The synthetic data and a WordPiece of the tiny config (shared by both variants)."""
    cfg = load_multitask_config(None, SMALL)
    data = build_data(cfg)
    return cfg, data, build_tokenizer(cfg, data, tmp_path_factory.mktemp("tok"))


def _with(scorer: str | None) -> MultiTaskExperimentConfig:
    return load_multitask_config(None, {**SMALL, "tasks": {"click": {"field_attention": scorer}}})


def test_option_loads_from_yaml_and_unknown_values_are_refused(tmp_path):
    path = tmp_path / "mt.yaml"
    path.write_text("tasks:\n  click:\n    field_attention: additive\n")
    assert load_multitask_config(path).tasks.click.field_attention == "additive"
    path.write_text("tasks:\n  click:\n    field_attention: bilinear\n")
    assert load_multitask_config(path).tasks.click.field_attention == "bilinear"
    path.write_text("tasks:\n  click:\n    field_attention: mlp\n")
    with pytest.raises(ValueError, match=r"mt.yaml: tasks.click.field_attention: 'mlp' is not one of additive"):
        load_multitask_config(path)
    with pytest.raises(ValueError, match="tasks.click.field_attention"):
        load_multitask_config(None, {"tasks.click.field_attention": "concat"})


def test_concatenation_is_the_default_as_in_paper_004_sec_iv():
    """Sec. IV: concatenation gives the fixed, indexable document vector (first-stage retrieval); attention is
    proposed for the later ranking stages. Both shipped configs keep the default."""
    assert MultiTaskExperimentConfig().tasks.click.field_attention is None
    for path in ("configs/multitask.yaml", "configs/real/multitask.yaml"):
        assert "field_attention: null" in open(path).read(), f"{path} states the option"
    assert load_multitask_config("configs/multitask.yaml").tasks.click.field_attention is None


def test_concatenated_documents_by_default(tiny):
    cfg, data, tokenizer = tiny
    model = build_encoder(cfg, tokenizer, 0)
    click, records = build_tasks(cfg, model, data, ["click"], 0)["click"]
    batch = click.make_batch([r for r in records if r.clicked][:8])
    assert model.field_attention is None and click.field_attention is None
    assert "doc" in batch.texts and "fields" not in batch.texts, "one concatenated text per document"


def test_click_documents_are_embedded_by_field_attention_and_it_learns(tiny):
    cfg, data, tokenizer = tiny
    cfg = _with("additive")
    model = build_encoder(cfg, tokenizer, 0)
    assert isinstance(model.field_attention, FieldAttention) and model.field_attention.scorer == "additive"
    click, records = build_tasks(cfg, model, data, ["click", "nli"], 0)["click"]
    assert click.field_attention is model.field_attention, "the click task trains the model's attention"
    batch = click.make_batch([r for r in records if r.clicked][:8])
    assert "fields" in batch.texts and batch.tensors["field_mask"].shape == (8, 2), "title and description apart"
    loss, _ = click.loss(model, batch)
    loss.backward()
    grads = {n: p.grad for n, p in model.field_attention.named_parameters()}
    assert grads and all(g is not None and g.abs().sum() > 0 for g in grads.values()), "Eq. 9 scorer gets gradients"

    trained, trainer = train_encoder(cfg, tokenizer, data, ["click"], 0)
    start = build_encoder(cfg, tokenizer, 0).field_attention.state_dict()
    moved = {k: float((v - start[k]).abs().max()) for k, v in trained.field_attention.state_dict().items()}
    assert all(m > 0 for m in moved.values()), f"every attention weight is trained: {moved}"
    optimised = {id(p) for group in trainer.optimisation.optimizer.param_groups for p in group["params"]}
    assert all(id(p) in optimised for p in trained.field_attention.parameters())


def test_held_out_scores_and_saved_model_use_the_attention(tiny, tmp_path):
    cfg, data, tokenizer = tiny
    cfg = _with("bilinear")
    torch.manual_seed(1)
    model = build_encoder(cfg, tokenizer, 0).eval()
    with torch.no_grad():  # a non-identity W, so that a lost or re-initialised W would show
        model.field_attention.bilinear.add_(0.3 * torch.randn_like(model.field_attention.bilinear))
    records, order = [r for r in data.clicks_eval if r.clicked][:12], cfg.tasks.click.field_order
    fields = [[r.fields.get(n) or "" for n in order] for r in records]
    queries = [r.query for r in records]
    out = model.encode_field_documents(queries, fields, batch_size=5)
    assert out.embedding.shape == (12, model.embedding_dim) and out.weights.shape == (12, 2)
    assert torch.allclose(out.weights.sum(-1), torch.ones(12))

    # the training computation (ClickTask.loss: grid over the batch) gives the same vectors on its diagonal
    click, _ = build_tasks(cfg, model, data, ["click"], 0)["click"]
    batch = click.make_batch(records)
    with torch.no_grad():
        q = F.normalize(model.encode(**batch.texts["query"], side="query").embedding, dim=-1)
        f = model.encode(**batch.texts["fields"], side="doc").embedding.view(12, 2, -1)
        grid = model.field_attention.grid(q, f, batch.tensors["field_mask"]).embedding
    assert torch.allclose(F.normalize(grid[torch.arange(12), torch.arange(12)], dim=-1), out.embedding, atol=1e-5)

    scores = click_pair_scores(model, records, order, 5)
    expected = (model.encode_texts(queries, "query") * out.embedding).sum(-1).numpy()
    assert scores == pytest.approx(expected, abs=1e-5), "held-out click pairs are scored through Eq. 8-9"

    loaded = BiEncoder.load(model.save(tmp_path / "m"))
    assert isinstance(loaded.field_attention, FieldAttention) and loaded.field_attention.scorer == "bilinear"
    assert torch.equal(loaded.field_attention.bilinear, model.field_attention.bilinear)
    assert torch.allclose(loaded.encode_field_documents(queries, fields).embedding, out.embedding, atol=1e-5)

    build_encoder(load_multitask_config(None, SMALL), tokenizer, 0).save(tmp_path / "m")
    assert not (tmp_path / "m" / FIELD_ATTENTION_FILE).exists()
    assert BiEncoder.load(tmp_path / "m").field_attention is None, "a concatenation model saved over it has none"
    with pytest.raises(ValueError, match="no field attention"):
        BiEncoder.load(tmp_path / "m").encode_field_documents(queries, fields)
