"""Tasks of paper 004's multi-task training: batching of hand-made records and each loss against its module."""

import dataclasses

import pytest
import torch
import torch.nn.functional as F

from madr.config import BackboneConfig, ModelConfig
from madr.data.records import ClickRecord, NLIRecord, ParallelRecord
from madr.losses import NLICosineLoss, TranslationLoss, TripletLoss
from madr.modeling.heads.field_attention import FieldAttention
from madr.modeling.model import BiEncoder
from madr.modeling.tokenization import train_wordpiece_tokenizer
from madr.recipes.multitask.tasks import (
    ClickTask,
    NLITask,
    SideTokenizer,
    Task,
    TranslationTask,
    grid_triplet_loss,
)

TINY = {"hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 2, "intermediate_size": 64,
        "max_position_embeddings": 64}

CLICKS = [
    ClickRecord("red running shoes", {"title": "Red running shoes", "description": "light shoes"}, True, doc_id="d1"),
    ClickRecord("running shoes", {"title": "Red running shoes", "description": "light shoes"}, True, doc_id="d1"),
    ClickRecord("bumble bee sounds", {"title": "The sound of bumblebees", "url": "youtube.com/bee"}, True, doc_id="d2"),
    ClickRecord("wedding songs", {"title": "Happy wedding songs", "description": "music"}, False, doc_id="d3"),
    ClickRecord("chi quadrat test", {"title": "Chi2 test", "description": "statistik"}, True, doc_id="d4"),
]
NLI = [
    NLIRecord("a man plays a guitar on stage", "a man plays music", "entailment"),
    NLIRecord("a man plays a guitar on stage", "a man is sleeping", "contradiction"),
    NLIRecord("two dogs run in a park", "dogs are playing", "neutral"),
    NLIRecord("a woman reads a book", "a person reads", "entailment"),
]
PARALLEL = [
    ParallelRecord("le chat dort", "the cat sleeps", "fr"),
    ParallelRecord("die katze schläft", "the cat sleeps", "de"),
    ParallelRecord("el perro corre", "the dog runs", "es"),
]


@pytest.fixture(scope="module")
def model():
    texts = [r.query for r in CLICKS] + [v for r in CLICKS for v in r.fields.values()]
    texts += [t for r in NLI for t in (r.premise, r.hypothesis)] + [t for r in PARALLEL for t in (r.source, r.target)]
    tok = train_wordpiece_tokenizer(texts * 3, vocab_size=300)
    torch.manual_seed(0)
    cfg = ModelConfig(name="bibert", backbone=BackboneConfig(tiny=TINY), projection_dim=16, max_query_length=12,
                      max_doc_length=24)
    return BiEncoder(cfg, tok).eval()


def _embed(model, texts, side):
    enc = model.tokenize(texts, side)
    return model.encode(enc["input_ids"], enc["attention_mask"], side).embedding


def test_click_batch_keeps_clicked_groups_documents_and_checks_types(model):
    task = ClickTask(SideTokenizer.from_model(model), field_order=["title", "description", "url"])
    assert isinstance(task, Task), "ClickTask must satisfy the Task protocol"
    batch = task.make_batch(CLICKS)
    assert batch.size == 4, "the unclicked record must be dropped"
    assert batch.tensors["doc_ids"].tolist() == [0, 0, 1, 2], "rows showing d1 must share an id"
    assert batch.texts["query"]["input_ids"].shape[0] == 4 and batch.texts["doc"]["input_ids"].shape[0] == 4
    assert batch.texts["doc"]["input_ids"].shape[1] <= 24, "documents are cut at max_doc_length"
    with pytest.raises(ValueError, match="record 1 is a NLIRecord"):
        task.make_batch([CLICKS[0], NLI[0]])
    with pytest.raises(ValueError, match="none of the 1 records"):
        task.make_batch([CLICKS[3]])


def test_click_loss_is_the_triplet_loss_on_the_towers(model):
    task = ClickTask(SideTokenizer.from_model(model), field_order=["title", "description", "url"])
    batch = task.make_batch(CLICKS)
    loss, parts = task.loss(model, batch)
    kept = [r for r in CLICKS if r.clicked]
    with torch.no_grad():
        q = F.normalize(_embed(model, [r.query for r in kept], "query"), dim=-1)
        docs = [" [SEP] ".join(v for k in ("title", "description", "url") if (v := r.fields.get(k))) for r in kept]
        d = F.normalize(_embed(model, docs, "doc"), dim=-1)
        expected = TripletLoss(distance="l1")(q, d, positive_ids=torch.tensor([0, 0, 1, 2]))
    assert torch.allclose(loss, expected, atol=1e-5), (loss, expected)
    assert parts["triplet"] == pytest.approx(float(expected), abs=1e-5)


@pytest.mark.parametrize("kwargs", [
    {"negatives": "batch_all"}, {"negatives": "batch_all", "batch_all_average": "loss"},
    {"negatives": "batch_all", "batch_all_normaliser": "paper"}, {"negatives": "hard"},
    {"negatives": "semi_hard"}, {"negatives": "semi_hard", "semi_hard_fallback": "skip"}, {"negatives": "random"},
    {"negatives": "hard", "distance": "cosine"},
])
def test_grid_triplet_equals_triplet_loss_for_query_independent_documents(kwargs):
    torch.manual_seed(1)
    q, d = torch.randn(6, 4), torch.randn(6, 4)
    ids = torch.tensor([0, 1, 1, 2, 3, 4])
    expected = TripletLoss(margin=2.0, generator=torch.Generator().manual_seed(3), **kwargs)(q, d, positive_ids=ids)
    grid = d[None].expand(6, 6, 4)
    got, positive = grid_triplet_loss(TripletLoss(margin=2.0, generator=torch.Generator().manual_seed(3), **kwargs),
                                      q, grid, ids[:, None] != ids[None, :])
    assert torch.allclose(got, expected, atol=1e-5), (kwargs, got, expected)
    assert torch.allclose(positive, (q - d).abs().sum(-1)) or kwargs.get("distance") == "cosine"


def test_click_task_with_field_attention_trains_the_attention(model):
    attention = FieldAttention(16)
    task = ClickTask(SideTokenizer.from_model(model), field_order=["title", "description", "url"],
                     field_attention=attention, loss=TripletLoss(negatives="batch_all", margin=3.0))
    batch = task.make_batch(CLICKS)
    assert batch.tensors["field_mask"].tolist() == [[True, True, False], [True, True, False], [True, False, True],
                                                   [True, True, False]], "missing fields must be masked"
    assert batch.texts["fields"]["input_ids"].shape[0] == 12, "one text per (record, field)"
    assert set(dict(task.named_parameters())) == {f"field_attention.{n}" for n, _ in attention.named_parameters()}
    model.train()
    try:
        loss, _ = task.loss(model, batch)
        loss.backward()
    finally:
        model.eval()
    assert loss > 0, "a margin of 3 on unit vectors must leave a positive loss"
    assert attention.query_proj.weight.grad.abs().sum() > 0, "no gradient reached the field attention"
    assert any(p.grad is not None and p.grad.abs().sum() > 0 for p in model.doc_tower.backbone.parameters())
    model.zero_grad()


def test_nli_drops_contradictions_and_uses_eq2_on_both_sides(model):
    task = NLITask(SideTokenizer.from_model(model))
    batch = task.make_batch(NLI)
    assert batch.size == 3 and batch.tensors["targets"].tolist() == [1.0, 0.0, 1.0]
    loss, parts = task.loss(model, batch)
    kept = [NLI[0], NLI[2], NLI[3]]
    with torch.no_grad():
        u = _embed(model, [r.premise for r in kept], "doc")
        v = _embed(model, [r.hypothesis for r in kept], "query")
        expected = NLICosineLoss()(u, v, torch.tensor([1.0, 0.0, 1.0]))
    assert torch.allclose(loss, expected, atol=1e-5), (loss, expected)
    assert 0.0 <= parts["accuracy"] <= 1.0
    assert task.accepts(NLI[0]) and not task.accepts(NLI[1])
    with pytest.raises(ValueError, match="contradictions"):
        task.make_batch([NLI[1]])
    with pytest.raises(ValueError, match="label 'maybe'"):
        task.make_batch([NLIRecord("a", "b", "maybe")])
    with pytest.raises(ValueError, match="premise_side"):
        NLITask(SideTokenizer.from_model(model), premise_side="passage")


def test_translation_masks_repeated_targets_and_is_the_translation_loss(model):
    task = TranslationTask(SideTokenizer.from_model(model))
    batch = task.make_batch(PARALLEL)
    assert batch.tensors["target_ids"].tolist() == [0, 0, 1], "the repeated English sentence must share an id"
    loss, parts = task.loss(model, batch)
    with torch.no_grad():
        src = _embed(model, [r.source for r in PARALLEL], "doc")
        tgt = _embed(model, [r.target for r in PARALLEL], "doc")
        expected = TranslationLoss()(src, tgt, target_ids=torch.tensor([0, 0, 1]))
    assert torch.allclose(loss, expected, atol=1e-5), (loss, expected)
    assert "accuracy" in parts
    with pytest.raises(ValueError, match="record 0 is a ClickRecord"):
        task.make_batch([CLICKS[0]])


def test_side_tokenizer_puts_each_sides_prefix_before_the_text(model):
    """e5's convention (`model.text_prefixes`) reaches the tasks' batches exactly as `BiEncoder.tokenize`."""
    cfg = dataclasses.replace(model.config, text_prefixes={"query": "query: ", "doc": "passage: "})
    prefixed = BiEncoder(cfg, model.tokenizer)
    tok = SideTokenizer.from_model(prefixed)
    for side in ("query", "doc"):
        got = tok(["red running shoes"], side)["input_ids"]
        assert torch.equal(got, prefixed.tokenize(["red running shoes"], side)["input_ids"])
        assert not torch.equal(got, SideTokenizer.from_model(model)(["red running shoes"], side)["input_ids"])
    batch = NLITask(tok).make_batch(NLI[:1])
    assert torch.equal(batch.texts["premise"]["input_ids"], prefixed.tokenize([NLI[0].premise], "doc")["input_ids"])
