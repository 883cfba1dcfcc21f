"""Cached teacher targets (paper 004 Sec. V-A distillation): the frozen teacher encodes each text once."""

import pytest
import torch

from madr.config import BackboneConfig, ModelConfig
from madr.modeling.model import BiEncoder
from madr.modeling.tokenization import train_wordpiece_tokenizer
from madr.training.distill import distill, make_student
from madr.training.teacher_targets import TeacherTargets, cache_teacher_targets

TINY = {
    "hidden_size": 32,
    "num_hidden_layers": 6,
    "num_attention_heads": 2,
    "intermediate_size": 64,
    "max_position_embeddings": 32,
    "initializer_range": 0.1,
}
TEXTS = [f"{c} {i}" for c in ("red", "blue", "green", "dark grey") for i in ("shoes", "lamp", "desk chair")]


@pytest.fixture(scope="module")
def teacher():
    tok = train_wordpiece_tokenizer(TEXTS, vocab_size=80)
    torch.manual_seed(0)
    cfg = ModelConfig(
        name="bibert",
        backbone=BackboneConfig(tiny=TINY),
        shared_towers=True,
        projection_dim=16,
        max_query_length=8,
        max_doc_length=16,
        pooling="mean",
    )
    return BiEncoder(cfg, tok).eval()


def _tokenize(model):
    return lambda texts: model.tokenize(texts, "query")


def test_cache_matches_live_teacher_once_per_text(teacher):
    teacher.train()
    targets = cache_teacher_targets(
        teacher.query_tower, TEXTS + TEXTS[:3] + ["", "  "], _tokenize(teacher), batch_size=5
    )
    assert teacher.training, "the teacher's mode must be restored"
    assert len(targets) == len(TEXTS), "one entry per distinct non-empty text"
    teacher.eval()
    with torch.no_grad():
        enc = teacher.tokenize(TEXTS[::-1], "query")
        live = teacher.query_tower(enc["input_ids"], enc["attention_mask"]).embedding
    assert torch.allclose(targets.lookup(TEXTS[::-1]), live, atol=1e-5), (
        "a vector must not depend on its batch"
    )
    with pytest.raises(KeyError, match="never seen"):
        targets.lookup(["never seen"])


def test_save_load_round_trip(teacher, tmp_path):
    targets = cache_teacher_targets(teacher.query_tower, TEXTS, _tokenize(teacher))
    loaded = TeacherTargets.load(targets.save(tmp_path / "t" / "targets.pt"))
    assert loaded.texts == targets.texts and torch.equal(loaded.vectors, targets.vectors)
    with pytest.raises(ValueError, match="distinct"):
        TeacherTargets(["a", "a"], torch.zeros(2, 3))


def test_distillation_on_cached_targets_equals_live(teacher):
    """Same seed, same batches: the cached run's losses are the live run's (the teacher never runs)."""
    histories = []
    for targets in (None, cache_teacher_targets(teacher.query_tower, TEXTS, _tokenize(teacher))):
        torch.manual_seed(1)
        student = make_student(teacher, num_layers=2)
        histories.append(distill(teacher, student, TEXTS, steps=8, batch_size=4, lr=1e-3, targets=targets))
    assert histories[0].losses == pytest.approx(histories[1].losses, rel=1e-4), (
        "cached targets changed training"
    )
    with pytest.raises(ValueError, match="lack the training text"):
        distill(
            teacher,
            make_student(teacher, 2),
            TEXTS + ["new text"],
            steps=1,
            targets=cache_teacher_targets(teacher.query_tower, TEXTS, _tokenize(teacher)),
        )
