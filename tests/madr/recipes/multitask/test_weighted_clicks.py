"""Weighted click examples in paper 004's triplet loss (Eq. 3): the loss is the weighted mean of the per-query
hinges (hand-computed here), skip negatives join only their own query's candidates (padding never counts), and a
multi-task training step runs on weighted click records."""

from __future__ import annotations

import pytest
import torch

from madr.config import BackboneConfig, ModelConfig
from madr.data.records import ClickRecord, NLIRecord
from madr.losses import TripletLoss
from madr.modeling.model import BiEncoder
from madr.modeling.tokenization import train_wordpiece_tokenizer
from madr.recipes.multitask.tasks import ClickTask, NLITask, SideTokenizer
from madr.recipes.multitask.trainer import MultiTaskTrainer

TINY = {"hidden_size": 32, "num_hidden_layers": 1, "num_attention_heads": 2, "intermediate_size": 64,
        "max_position_embeddings": 48, "hidden_dropout_prob": 0.0, "attention_probs_dropout_prob": 0.0}
CLICKS = [
    ClickRecord("red shoes", {"title": "red running shoes"}, True, doc_id="d1", weight=0.5,
                negatives={"d9": "blue winter boots", "d8": "green garden hose"}),
    ClickRecord("bee sounds", {"title": "the sound of bumblebees"}, True, doc_id="d2", weight=2.0),
    ClickRecord("wedding songs", {"title": "happy wedding songs"}, False, doc_id="d3", weight=1.0),
    ClickRecord("chi test", {"title": "chi square test"}, True, doc_id="d4", weight=1.5,
                negatives={"d7": "student t test"}),
]
NLI = [NLIRecord("a man plays a guitar", "a man plays music", "entailment"),
       NLIRecord("two dogs run in a park", "dogs are playing", "neutral")]


def _hinges(q: torch.Tensor, d: torch.Tensor, negatives: list[torch.Tensor], margin: float) -> torch.Tensor:
    """Hard-negative hinges by hand: each query's closest L1 candidate among the other rows' documents and
    its own extra negatives."""
    out = []
    for i in range(len(q)):
        candidates = [d[j] for j in range(len(q)) if j != i] + list(negatives[i])
        closest = min(float((q[i] - c).abs().sum()) for c in candidates)
        out.append(float((q[i] - d[i]).abs().sum()) - closest + margin)
    return torch.tensor(out).clamp_min(0)


def test_weighted_triplet_loss_is_the_weighted_mean_of_the_hinges():
    torch.manual_seed(0)
    q, d = torch.randn(3, 4), torch.randn(3, 4)
    extra = torch.randn(3, 2, 4)
    mask = torch.tensor([[True, True], [True, False], [False, False]])
    extra[1, 1] = q[1]  # padding at distance 0 from its query: would be the hardest negative if it counted
    weights = torch.tensor([0.5, 2.0, 1.5])
    loss = TripletLoss(distance="l1", negatives="hard", margin=20.0)
    got = loss(q, d, extra, negative_mask=mask, weights=weights)
    hinge = _hinges(q, d, [extra[i][mask[i]] for i in range(3)], 20.0)
    assert float(got) == pytest.approx(float((weights * hinge).sum() / weights.sum()), rel=1e-5)
    plain = loss(q, d, extra, negative_mask=mask)
    assert float(plain) == pytest.approx(float(hinge.mean()), rel=1e-5), "no weights: Eq. 3's plain mean"
    assert float(loss(q, d, weights=torch.ones(3))) == pytest.approx(float(loss(q, d)), rel=1e-6)


@pytest.fixture(scope="module")
def model() -> BiEncoder:
    texts = [r.query for r in CLICKS] + [t for r in CLICKS for t in [*r.fields.values(), *r.negatives.values()]]
    tok = train_wordpiece_tokenizer(texts * 3 + [t for r in NLI for t in (r.premise, r.hypothesis)] * 3,
                                    vocab_size=200)
    torch.manual_seed(0)
    cfg = ModelConfig(name="bibert", backbone=BackboneConfig(tiny=TINY), shared_towers=True, projection_dim=8,
                      max_query_length=8, max_doc_length=12, similarity="dot")
    return BiEncoder(cfg, tok).eval()


def test_click_task_loss_weighs_each_clicked_record(model):
    task = ClickTask(SideTokenizer.from_model(model), loss=TripletLoss(distance="l1", negatives="hard", margin=50.0))
    batch = task.make_batch(CLICKS)
    assert batch.size == 3 and batch.tensors["weights"].tolist() == [0.5, 2.0, 1.5]
    assert batch.tensors["negative_mask"].tolist() == [[True, True], [False, False], [True, False]]
    with torch.no_grad():
        loss, _ = task.loss(model, batch)
        kept = [r for r in CLICKS if r.clicked]
        q = model.encode_texts([r.query for r in kept], "query")
        d = model.encode_texts([r.fields["title"] for r in kept], "doc")
        negatives = [model.encode_texts(list(r.negatives.values()), "doc") if r.negatives
                     else torch.zeros(0, q.shape[1]) for r in kept]
    hinge = _hinges(torch.as_tensor(q), torch.as_tensor(d), [torch.as_tensor(n) for n in negatives], 50.0)
    weights = torch.tensor([0.5, 2.0, 1.5])
    assert float(loss) == pytest.approx(float((weights * hinge).sum() / weights.sum()), rel=1e-4)


def test_a_multitask_step_trains_on_weighted_clicks(model):
    tok = SideTokenizer.from_model(model)
    trainer = MultiTaskTrainer(model.train(), {"click": (ClickTask(tok), CLICKS), "nli": (NLITask(tok), NLI)},
                               schedule={"batch_size": 3, "seed": 0},
                               optimizer={"learning_rate": 1e-2, "weight_decay": 0.0})
    before = [p.detach().clone() for p in model.parameters()]
    results = trainer.train(3)
    model.eval()
    assert {r.task for r in results} == {"click", "nli"} and trainer.dropped["click"] == 1
    assert all(torch.isfinite(torch.tensor(r.loss)) for r in results)
    assert any(not torch.equal(a, b) for a, b in zip(before, model.parameters(), strict=True)), "no step was taken"
