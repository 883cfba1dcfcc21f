"""Multi-task trainer (paper 004 Eq. 1, Sec. III-B): losses fall, exact resume, every record once per epoch."""

import pytest
import torch

from madr.config import BackboneConfig, ModelConfig
from madr.data.records import ClickRecord, NLIRecord, ParallelRecord
from madr.modeling.model import BiEncoder
from madr.modeling.tokenization import train_wordpiece_tokenizer
from madr.recipes.multitask.tasks import ClickTask, NLITask, SideTokenizer, TranslationTask
from madr.recipes.multitask.trainer import ExternalSource, MultiTaskTrainer, SequenceSource

TINY = {"hidden_size": 32, "num_hidden_layers": 1, "num_attention_heads": 2, "intermediate_size": 64,
        "max_position_embeddings": 48}
COLORS = ["red", "blue", "green", "black", "white", "yellow"]
ITEMS = ["shoes", "jacket", "lamp", "phone"]
LANGS = {"fr": ["rouge", "bleu", "vert", "noir", "blanc", "jaune"], "de": ["rot", "blau", "grün", "schwarz", "weiß", "gelb"]}


def _records():
    clicks = [ClickRecord(f"{c} {item}", {"title": f"{c.title()} {item} sale", "description": f"a {c} {item}"},
                          clicked=(i % 6 != 5), doc_id=f"{c}-{item}")
              for i, (c, item) in enumerate((c, it) for c in COLORS for it in ITEMS[:2])]
    nli = [NLIRecord(f"a {c} {item} on a table", f"a {item} is {c}" if k == 0 else f"a {item} is {COLORS[j - 1]}",
                     "entailment" if k == 0 else ("neutral" if k == 1 else "contradiction"))
           for j, c in enumerate(COLORS) for item in ITEMS[2:] for k in range(3)]
    parallel = [ParallelRecord(f"{word} couleur", f"{COLORS[j]} colour", lang)
                for lang, words in LANGS.items() for j, word in enumerate(words)]
    return clicks, nli, parallel


@pytest.fixture(scope="module")
def tokenizer():
    clicks, nli, parallel = _records()
    texts = [r.query for r in clicks] + [v for r in clicks for v in r.fields.values()]
    texts += [t for r in nli for t in (r.premise, r.hypothesis)] + [t for r in parallel for t in (r.source, r.target)]
    return train_wordpiece_tokenizer(texts * 2, vocab_size=300)


def _trainer(tokenizer, seed=0, model_name="bibert", **kw):
    """Three tasks on one shared-tower model (paper 004 trains one encoder); BiBERT has dropout (so resume
    must restore the RNG), DSSM (bag of wordpieces -> MLP) learns the hand-made records in a few steps where
    an untrained tiny BERT's CLS barely depends on the text yet."""
    torch.manual_seed(seed)
    cfg = ModelConfig(name=model_name, backbone=BackboneConfig(tiny=TINY), shared_towers=True,
                      projection_dim=None if model_name == "dssm" else 16, dssm_hidden=[32, 16],
                      max_query_length=12, max_doc_length=20)
    model = BiEncoder(cfg, tokenizer)
    tok = SideTokenizer.from_model(model)
    clicks, nli, parallel = _records()
    tasks = {"click": (ClickTask(tok), clicks), "nli": (NLITask(tok), nli),
             "translation": (TranslationTask(tok), parallel)}
    settings = {"schedule": {"batch_size": 4, "seed": 1}, "optimizer": {"learning_rate": 2e-3, "weight_decay": 0.0}}
    settings.update(kw)
    return MultiTaskTrainer(model, tasks, **settings), (clicks, nli, parallel)


def test_sources_are_filtered_and_each_record_is_used_once_per_epoch(tokenizer):
    trainer, (clicks, nli, parallel) = _trainer(tokenizer)
    assert trainer.dropped == {"click": 2, "nli": 12, "translation": 0}, "unclicked pairs and contradictions drop"
    sizes = {name: len(src) for name, src in trainer.sources.items()}
    assert sizes == {"click": 10, "nli": 24, "translation": 12}
    used = {name: [] for name in sizes}
    for result in trainer.train_epoch():
        used[result.task].extend(result.indices)
        assert result.batch_size == len(result.indices), "filtered sources must give full batches"
    for name, rows in used.items():
        assert sorted(rows) == list(range(sizes[name])), f"{name}: records not used exactly once per epoch"
    assert trainer.schedule.epoch == 0 and trainer.global_step == sum(-(-n // 4) for n in sizes.values())
    second = trainer.train(1)[0]
    assert second.epoch == 1, "the step after an epoch's last one must start the next epoch"


def test_a_few_steps_reduce_every_tasks_loss(tokenizer):
    trainer, (clicks, nli, parallel) = _trainer(tokenizer, model_name="dssm",
                                                optimizer={"learning_rate": 1e-2, "weight_decay": 0.0})
    held = {"click": [r for r in clicks if r.clicked][:8], "nli": [r for r in nli if r.label != "contradiction"][:8],
            "translation": parallel[:8]}
    before = {name: trainer.task_loss(name, recs) for name, recs in held.items()}
    trainer.train(48)  # 4 epochs of 12 batches
    after = {name: trainer.task_loss(name, recs) for name, recs in held.items()}
    for name in held:
        assert after[name] < 0.8 * before[name], f"{name}: loss {before[name]:.4f} -> {after[name]:.4f}"
        assert trainer.history[name], f"{name}: no history"
    assert sum(len(h) for h in trainer.history.values()) == 48


def test_resume_from_state_gives_the_same_next_batches_and_losses(tokenizer, tmp_path):
    first, _ = _trainer(tokenizer, optimizer={"learning_rate": 1e-3, "warmup_steps": 3})
    first.train(7)
    path = first.save_checkpoint(tmp_path / "ckpt.pt")
    expected = [(r.task, r.indices, r.loss) for r in first.train(6)]  # crosses into epoch 1 (12 steps per epoch)

    resumed, _ = _trainer(tokenizer, seed=123, optimizer={"learning_rate": 1e-3, "warmup_steps": 3})
    resumed.load_checkpoint(path)
    assert resumed.global_step == 7 and sum(len(h) for h in resumed.history.values()) == 7
    got = [(r.task, r.indices, r.loss) for r in resumed.train(6)]
    assert [g[:2] for g in got] == [e[:2] for e in expected], "resume must continue with the same batches"
    for (task, _, loss), (_, _, want) in zip(got, expected, strict=True):
        assert loss == pytest.approx(want, rel=1e-5, abs=1e-6), f"{task}: resumed loss {loss} != {want}"

    other, _ = _trainer(tokenizer, schedule={"batch_size": 3, "seed": 1})
    with pytest.raises(ValueError, match="batch_size"):
        other.load_state_dict(first.state_dict())


def test_record_source_evaluators_and_bad_input(tokenizer):
    class CountingSource(SequenceSource):
        calls = 0

        def take(self, indices):
            CountingSource.calls += 1
            return super().take(indices)

    trainer, (clicks, nli, parallel) = _trainer(tokenizer)
    tok = trainer.tasks["click"].tokenize
    source = CountingSource([r for r in clicks if r.clicked])
    calls = []

    def norm(model):
        calls.append(model.training)
        return {"norm": float(model.encode_texts(["red shoes"], "query").norm())}

    trainer = MultiTaskTrainer(trainer.model, {"click": (ClickTask(tok), source)}, schedule={"batch_size": 5},
                               evaluators={"norm": norm})
    trainer.train(4, eval_every=2)
    assert CountingSource.calls == 4, "the trainer must read batches through the source's take()"
    assert [e["step"] for e in trainer.eval_history] == [2, 4] and calls == [False, False]
    assert trainer.eval_history[0]["metrics"]["norm"]["norm"] == pytest.approx(1.0, abs=1e-5)
    with pytest.raises(ValueError, match="record 0 is a NLIRecord"):
        MultiTaskTrainer(trainer.model, {"click": (ClickTask(tok), nli)})
    with pytest.raises(ValueError, match="unknown key"):
        MultiTaskTrainer(trainer.model, {"click": (ClickTask(tok), clicks)}, schedule={"batchsize": 4})
    with pytest.raises(ValueError, match="loss_weights"):
        MultiTaskTrainer(trainer.model, {"click": (ClickTask(tok), clicks)}, loss_weights={"nli": 2.0})


def test_train_records_matches_step_on_the_same_batches(tokenizer):
    """The hook the Ray pipeline trains through: the scheduled batches fed from outside (ExternalSource sizes
    the schedule) give the same losses and weights as `step()`; every loss goes through `loss_forward`."""
    inside, _ = _trainer(tokenizer)
    outside, _ = _trainer(tokenizer)
    sizes = {name: len(src) for name, src in inside.sources.items()}
    outside_tasks = {name: (task, ExternalSource(sizes[name])) for name, task in outside.tasks.items()}
    fed = MultiTaskTrainer(outside.model, outside_tasks, schedule={"batch_size": 4, "seed": 1},
                           optimizer={"learning_rate": 2e-3, "weight_decay": 0.0})
    calls = []

    class Spy(torch.nn.Module):
        def __init__(self, inner):
            super().__init__()
            self.inner = inner

        def forward(self, name, batch):
            calls.append(name)
            return self.inner(name, batch)

    fed.wrap_losses(Spy)
    for i in range(6):
        epoch, name, indices = inside.next_batch()
        records = inside.sources[name].take(indices.tolist())
        torch.manual_seed(100 + i)  # the same dropout masks for both
        a = inside.step()
        torch.manual_seed(100 + i)
        b = fed.train_records(name, records, epoch)
        assert (a.task, a.batch_size) == (b.task, b.batch_size) and a.loss == pytest.approx(b.loss, rel=1e-5), \
            f"step {a.step}: {a.task} {a.loss} vs {b.task} {b.loss}"
    assert calls == [r["task"] for r in _tasks_in_order(inside)], "every loss must go through the wrapper"
    for (k, v), w in zip(inside.model.state_dict().items(), fed.model.state_dict().values(), strict=True):
        assert torch.allclose(v, w, atol=1e-6), f"{k} differs after the same 6 steps"
    assert fed.schedule.position == 0, "train_records does not move the trainer's own schedule"
    with pytest.raises(ValueError, match="ExternalSource holds no records"):
        fed.step()
    with pytest.raises(ValueError, match="unknown task 'qa'"):
        fed.train_records("qa", records)


def _tasks_in_order(trainer):
    rows = [{"task": name, "step": h["step"]} for name, hist in trainer.history.items() for h in hist]
    return sorted(rows, key=lambda r: r["step"])
