"""Query-tower distillation (paper 004 Sec. V-A): a 3-layer student of a 6-layer teacher, L2 on the outputs."""

import pytest
import torch

from madr.config import BackboneConfig, ModelConfig
from madr.modeling.model import BiEncoder
from madr.modeling.tokenization import train_wordpiece_tokenizer
from madr.training.distill import (
    attach_query_student,
    distill,
    make_student,
    num_layers,
    student_teacher_distance,
)

TINY = {"hidden_size": 32, "num_hidden_layers": 6, "num_attention_heads": 2, "intermediate_size": 64,
        "max_position_embeddings": 32, "initializer_range": 0.1}
COLORS = ["red", "blue", "green", "black", "white", "pink", "grey", "brown"]
ITEMS = ["shoes", "jacket", "lamp", "phone", "chair", "watch", "bag", "desk"]
TRAIN = [f"{c} {i}" for c in COLORS for i in ITEMS if (len(c) + len(i)) % 4]
HELD_OUT = [f"{c} {i}" for c in COLORS for i in ITEMS if not (len(c) + len(i)) % 4]


@pytest.fixture(scope="module")
def teacher():
    tok = train_wordpiece_tokenizer(TRAIN + HELD_OUT, vocab_size=120)
    torch.manual_seed(0)
    cfg = ModelConfig(name="bibert", backbone=BackboneConfig(tiny=TINY), shared_towers=True, projection_dim=32,
                      max_query_length=8, max_doc_length=16)
    return BiEncoder(cfg, tok).eval()


def test_student_has_the_teachers_first_layers_and_shape(teacher):
    student = make_student(teacher, num_layers=3)
    assert num_layers(student) == 3 and student.backbone.config.num_hidden_layers == 3, "student must have 3 layers"
    assert num_layers(teacher.query_tower) == 6, "the teacher must not be cut"
    t_state, s_state = teacher.query_tower.state_dict(), student.state_dict()
    assert not any("encoder.layer.3." in k for k in s_state), "layers past the third must be gone"
    for key, value in s_state.items():
        assert torch.equal(value, t_state[key]), f"{key} was not initialised from the teacher"
    assert student.projection.weight.shape == (32, 32), "same 32-d projection as the teacher"
    picked = make_student(teacher.query_tower, num_layers=3, layers=[0, 2, 4])
    assert torch.equal(picked.backbone.encoder.layer[2].output.dense.weight,
                       teacher.query_tower.backbone.encoder.layer[4].output.dense.weight)
    for bad in ({"num_layers": 0}, {"num_layers": 7}, {"num_layers": 2, "layers": [0, 1, 2]}):
        with pytest.raises(ValueError, match="layers"):
            make_student(teacher, **bad)


def test_distillation_reduces_held_out_distance_and_keeps_the_teacher(teacher):
    student = make_student(teacher, num_layers=3)
    frozen = {k: v.clone() for k, v in teacher.state_dict().items()}
    history = distill(teacher, student, TRAIN, steps=60, batch_size=16, lr=3e-3, eval_texts=HELD_OUT, eval_every=30)
    assert history.eval_steps == [0, 30, 60] and len(history.losses) == 60
    start, end = history.eval_distance[0], history.eval_distance[-1]
    assert start > 0.05, f"a cut student must start away from the teacher, got {start}"
    assert end < 0.5 * start, f"held-out student-teacher L2 distance {start:.4f} -> {end:.4f}"
    assert end == pytest.approx(student_teacher_distance(teacher, student, HELD_OUT), rel=1e-5)
    assert all(torch.equal(v, frozen[k]) for k, v in teacher.state_dict().items()), "the teacher must stay frozen"
    assert not teacher.training, "the teacher's mode must be restored"
    with pytest.raises(ValueError, match="tokenize"):
        distill(teacher.query_tower, student, TRAIN, steps=1)


def test_student_serves_queries_and_round_trips(teacher, tmp_path):
    student = make_student(teacher, num_layers=3)
    served = attach_query_student(teacher, student)
    assert teacher.config.shared_towers and not served.config.shared_towers
    assert served.query_tower is student and num_layers(served.doc_tower) == 6
    queries, docs = ["red shoes", "blue lamp"], ["red shoes for running", "a blue desk lamp"]
    loaded = BiEncoder.load(served.save(tmp_path / "served"))
    assert num_layers(loaded.query_tower) == 3 and num_layers(loaded.doc_tower) == 6, "towers' depths after load"
    for side, texts, want in (("query", queries, served), ("doc", docs, teacher)):
        got = loaded.encode_texts(texts, side)
        assert torch.allclose(got, want.encode_texts(texts, side), atol=1e-5), f"{side} embeddings changed"
    other = ModelConfig(name="bibert", backbone=BackboneConfig(tiny=TINY), projection_dim=16, max_query_length=8,
                        max_doc_length=16)
    bad = make_student(BiEncoder(other, teacher.tokenizer), num_layers=3)
    with pytest.raises(ValueError, match="output size 16"):
        attach_query_student(teacher, bad)


def test_curve_records_probe_at_each_evaluation(teacher):
    student = make_student(teacher, num_layers=3)
    calls = []

    def probe(tower):
        calls.append(tower.training)
        return {"norm": float(tower.projection.weight.norm())}

    history = distill(teacher, student, TRAIN, steps=20, batch_size=8, lr=3e-3, eval_texts=HELD_OUT, eval_every=10,
                      probe=probe)
    curve = history.curve()
    assert [p["step"] for p in curve] == [0.0, 10.0, 20.0] and calls == [False, False, False], "eval mode, 3 points"
    assert all({"held_out_l2", "norm"} <= set(p) for p in curve)
    assert curve[-1]["norm"] != curve[0]["norm"], "the probe sees the student as it trains"


def test_checkpoint_resumes_to_the_uninterrupted_run(teacher, tmp_path):
    """A run stopped after step 10 and resumed gives the uninterrupted run's losses and weights."""
    kwargs = {"steps": 20, "batch_size": 8, "lr": 3e-3, "eval_texts": HELD_OUT, "eval_every": 10}
    torch.manual_seed(0)
    full_student = make_student(teacher, num_layers=3)
    full = distill(teacher, full_student, TRAIN, **kwargs)
    path = tmp_path / "ckpt.pt"
    torch.manual_seed(0)
    frozen = make_student(teacher, num_layers=3)
    frozen.backbone.get_input_embeddings().weight.requires_grad_(False)
    distill(teacher, frozen, TRAIN, **{**kwargs, "steps": 15}, checkpoint=tmp_path / "frozen.pt")
    saved = torch.load(tmp_path / "frozen.pt", weights_only=True)["student"]
    assert saved and not any("word_embeddings" in k for k in saved), "frozen weights are not saved"
    torch.manual_seed(0)
    distill(teacher, make_student(teacher, num_layers=3), TRAIN, **{**kwargs, "steps": 15}, checkpoint=path)
    assert path.is_file(), "saved at step 10"
    torch.manual_seed(123)  # a fresh process: other random state, a fresh student
    resumed_student = make_student(teacher, num_layers=3)
    resumed = distill(teacher, resumed_student, TRAIN, **kwargs, checkpoint=path)
    assert resumed.losses == pytest.approx(full.losses, rel=1e-5), "resumed losses differ"
    assert resumed.eval_steps == [0, 10, 20] and resumed.eval_distance == pytest.approx(full.eval_distance, rel=1e-5)
    for key, value in resumed_student.state_dict().items():
        assert torch.allclose(value, full_student.state_dict()[key], atol=1e-6), f"{key} differs after resume"
    with pytest.raises(ValueError, match="eval_every"):
        distill(teacher, resumed_student, TRAIN, steps=2, checkpoint=path)
    with pytest.raises(ValueError, match="ckpt.pt: checkpoint of other distillation settings"):
        distill(teacher, resumed_student, TRAIN, **{**kwargs, "lr": 1e-3}, checkpoint=path)


def test_cosine_loss_closes_the_cosine_gap_and_spread_layers_train(teacher):
    """Spread layers (0, 2, 5) distilled on the cosine loss (+ in-batch KL): the held-out cosine distance, what
    a cosine score sees, falls by half; the norms are left free."""
    from madr.losses import DistillationCosineLoss

    torch.manual_seed(0)
    student = make_student(teacher, num_layers=3, layers=[0, 2, 5])
    history = distill(teacher, student, TRAIN, steps=60, batch_size=16, lr=3e-3, eval_texts=HELD_OUT, eval_every=30,
                      loss=DistillationCosineLoss(similarity_weight=0.5, temperature=0.1))
    start, end = history.eval_cosine[0], history.eval_cosine[-1]
    assert start > 1e-3, f"a cut student must start away from the teacher, got {start}"
    assert end < 0.5 * start, f"held-out cosine distance {start:.5f} -> {end:.5f}"
    assert [p["held_out_cosine_distance"] for p in history.curve()] == history.eval_cosine
