"""Paper 004 Table III shape on synthetic data: a tiny multi-task encoder beats the click-only encoder on NLI
ROC AUC and the untrained encoder on cross-lingual top-1; the metrics, baselines and config by hand."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from madr.data.records import ClickRecord, NLIRecord, ParallelRecord
from madr.recipes.multitask.config import MultiTaskExperimentConfig, load_multitask_config
from madr.recipes.multitask.data import build_data
from madr.recipes.multitask.encoders import build_encoder, build_tokenizer, train_encoder
from madr.recipes.multitask.evaluation import (
    click_metrics,
    click_ndcg,
    encoder_metrics,
    nli_auc,
    retrieval_top1,
)
from madr.recipes.multitask.experiment import UNTRAINED, row_labels, run_multitask_experiment, student_label

# A 2-layer, 64-wide BERT without dropout (dropout slows a from-scratch toy model several-fold) on small data.
TINY = {"hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4, "intermediate_size": 128,
        "max_position_embeddings": 64, "hidden_dropout_prob": 0.0, "attention_probs_dropout_prob": 0.0}
SMALL = {
    "steps": 200,
    "data": {"click_queries": 100, "click_products": 300, "nli_train": 1500, "nli_eval": 600,
             "nli_languages": ["en", "de", "ru", "zh"], "parallel_train": 1500, "parallel_eval": 600,
             "parallel_languages": ["de", "ru", "zh", "ar"]},
    "model": {"backbone": {"tiny": TINY}, "doc_layers": 2, "projection_dim": 32, "max_doc_length": 24,
              "tokenizer_vocab_size": 1500},
    "optimizer": {"learning_rate": 2e-3, "warmup_steps": 20},
}


@pytest.fixture(scope="module")
def one_thread():
    """One intra-op thread: on a shared 2-core machine two threads can be many times slower."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def tiny_run(one_thread, tmp_path_factory):
    cfg = load_multitask_config(None, {**SMALL, "output_dir": str(tmp_path_factory.mktemp("mt"))})
    data = build_data(cfg)
    tokenizer = build_tokenizer(cfg, data, tmp_path_factory.mktemp("tok"))
    untrained = encoder_metrics(build_encoder(cfg, tokenizer, cfg.seed), data, cfg)
    multi, _ = train_encoder(cfg, tokenizer, data, cfg.tasks.enabled, cfg.seed)
    click_only, _ = train_encoder(cfg, tokenizer, data, ["click"], cfg.seed)
    return {"untrained": untrained, "multi": encoder_metrics(multi, data, cfg),
            "click_only": encoder_metrics(click_only, data, cfg), "candidates": len({r.target for r in data.parallel_eval})}


def test_multitask_beats_click_only_on_nli_auc(tiny_run):
    multi, click = tiny_run["multi"], tiny_run["click_only"]
    for key in ("nli_auc_en", "nli_auc_xx"):
        assert multi[key] > 0.7, f"{key}: the multi-task encoder learns NLI, got {multi[key]:.3f}"
        assert multi[key] > click[key] + 0.3, f"{key}: multi-task {multi[key]:.3f} vs click-only {click[key]:.3f}"


def test_multitask_beats_untrained_on_cross_lingual_top1(tiny_run):
    multi, untrained, n = tiny_run["multi"], tiny_run["untrained"], tiny_run["candidates"]
    assert multi["xling_top1"] > untrained["xling_top1"] + 0.15, \
        f"cross-lingual top-1: multi-task {multi['xling_top1']:.3f} vs untrained {untrained['xling_top1']:.3f}"
    assert multi["xling_top1"] > 20 / n, f"well above chance 1/{n}: {multi['xling_top1']:.3f}"
    assert tiny_run["click_only"]["xling_top1"] < multi["xling_top1"], "translation pairs make the difference"


# ---------------------------------------------------------------------------------------------- metrics by hand


def test_click_ndcg_by_hand():
    recs = [ClickRecord("q", {"title": t}, False, doc_id=d, query_id="q1", relevance=rel)
            for t, d, rel in (("a", "d1", 4), ("b", "d2", 0), ("c", "d3", 2))]
    assert click_ndcg(np.array([3.0, 1.0, 2.0]), recs, [3])["ndcg@3"] == pytest.approx(1.0), "ideal order"
    # order d2 (0), d3 (3 = 2^2-1), d1 (15): DCG = 0 + 3/log2(3) + 15/2; IDCG = 15 + 3/log2(3)
    got = click_ndcg(np.array([1.0, 3.0, 2.0]), recs, [3])["ndcg@3"]
    assert got == pytest.approx((3 / np.log2(3) + 15 / 2) / (15 + 3 / np.log2(3))), f"got {got}"
    recs[0].relevance = None
    with pytest.raises(ValueError, match="record 0 .*no relevance"):
        click_ndcg(np.zeros(3), recs, [3])


def test_click_metrics_auc_over_all_pairs_ndcg_over_ranked_queries():
    rows = (("q1", "d1", 1), ("q1", "d2", 0), ("q2", "d3", 1), ("q3", "d4", 0), ("q3", "d5", 0))
    recs = [ClickRecord("q", {"title": d}, False, doc_id=d, query_id=q, relevance=rel) for q, d, rel in rows]
    scores = np.array([0.2, 0.9, 0.5, 0.1, 0.4])
    out = click_metrics(scores, recs, [2])
    # positives 0.2, 0.5 against negatives 0.9, 0.1, 0.4: pairs won 1 + 2 of 6
    assert out["click_auc"] == pytest.approx(3 / 6), f"pooled AUC over every pair: {out}"
    assert out["click_queries_ranked"] == 1, "only q1 shows documents of different relevance"
    assert out["ndcg@2"] == pytest.approx(1 / np.log2(3)), f"q1 alone, its relevant document second: {out}"
    recs[3].relevance = None
    with pytest.raises(ValueError, match="record 3 .*no relevance"):
        click_metrics(scores, recs, [2])


def test_nli_auc_splits_languages_and_classes():
    recs = [NLIRecord("p", "h", label, lang) for label, lang in
            (("entailment", "en"), ("neutral", "en"), ("entailment", "de"), ("neutral", "de"), ("contradiction", "de"))]
    scores = np.array([0.9, 0.1, 0.2, 0.8, 0.0])
    out = nli_auc(scores, recs)
    assert out["nli_auc_en"] == 1.0 and out["nli_auc_xx"] == 0.0, f"per-language entailment vs neutral: {out}"
    # entailment (0.9, 0.2) vs the rest (0.1, 0.8, 0.0): pairs won 3 + 2 of 6
    assert out["nli_auc_all3"] == pytest.approx(5 / 6), f"3-way: {out}"


def test_retrieval_top1_per_language():
    recs = [ParallelRecord("s1", "a", "de"), ParallelRecord("s2", "b", "de"), ParallelRecord("s3", "a", "zh")]
    scores = np.array([[0.9, 0.1], [0.8, 0.2], [0.3, 0.4]])  # rows: sources; columns: candidates a, b
    out = retrieval_top1(scores, recs, ["a", "b"])
    assert out == {"xling_top1": pytest.approx(0.25), "xling_top1_de": 0.5, "xling_top1_zh": 0.0}, f"{out}"


# ---------------------------------------------------------------------------------------------- config + runner


def test_config_file_matches_the_defaults_and_rejects_unknown_keys():
    cfg = load_multitask_config("configs/multitask.yaml")
    assert cfg == MultiTaskExperimentConfig(), "configs/multitask.yaml spells out the dataclass defaults"
    assert (cfg.model.doc_layers, cfg.model.projection_dim, cfg.student.num_layers) == (6, 32, 3), "paper 004 sizes"
    with pytest.raises(ValueError, match="configs/multitask.yaml: unknown config key.*model.projection"):
        load_multitask_config("configs/multitask.yaml", {"model.projection": 16})
    with pytest.raises(ValueError, match="tasks.click.distance"):
        load_multitask_config(None, {"tasks.click.distance": "l3"})
    with pytest.raises(ValueError, match="schedule.weights must name exactly"):
        load_multitask_config(None, {"schedule.mode": "weights", "schedule.weights": {"click": 1.0}})
    with pytest.raises(ValueError, match="conflicts with model.doc_layers"):
        load_multitask_config(None, {"model.backbone.num_layers": 4})


def test_runner_writes_every_row_and_the_student(one_thread, tmp_path):
    small = {**SMALL, "steps": 4, "output_dir": str(tmp_path),
             "data": {**SMALL["data"], "nli_train": 300, "nli_eval": 120, "parallel_train": 300, "parallel_eval": 120},
             "schedule": {"mode": "weights", "weights": {"click": 1.0, "nli": 2.0, "translation": 1.0}},
             "student": {"num_layers": 1, "steps": 15, "learning_rate": 3e-3}}
    cfg = load_multitask_config(None, small)
    result = run_multitask_experiment(cfg)
    single, multi = row_labels(cfg)
    expected = {"Random scores", "Old ranker (logged order)", "Token BM25 (word pieces)", "Minimum edit distance",
                UNTRAINED, single, multi, student_label(cfg)}
    assert set(result.rows) == expected, f"rows: {sorted(result.rows)}"
    assert "nli_auc_en" not in result.rows["Token BM25 (word pieces)"], "no NLI AUC for ranking baselines (Table III)"
    assert result.rows["Old ranker (logged order)"]["ndcg@5"] > result.rows["Random scores"]["ndcg@5"], \
        "the logged ranker is informative"
    d = result.distillation  # (that distillation lowers the distance is tested in test_distill.py)
    assert d["query_student_layers"] == 1 and all(np.isfinite(v) for v in d.values()), f"distillation ran: {d}"
    saved = json.loads((tmp_path / "metrics.json").read_text())
    assert saved["rows"][multi].keys() == result.rows[multi].keys(), "metrics.json holds the rows"
    assert load_multitask_config(tmp_path / "experiment.yaml") == cfg, "the saved config loads back unchanged"


def test_package_re_exports():
    import madr.modeling.heads as heads
    import madr.recipes.multitask as multitask
    from madr.modeling.heads.field_attention import FieldAttention
    from madr.recipes.multitask.trainer import MultiTaskTrainer

    assert set(multitask.__all__) == set(multitask._LAZY) | {"MODES", "STOPPING_CONDITIONS", "ScheduledBatch",
                                                             "TaskSchedule"}, "every lazy name is exported"
    assert all(getattr(multitask, name) is not None for name in multitask.__all__)
    assert multitask.MultiTaskTrainer is MultiTaskTrainer and heads.FieldAttention is FieldAttention
    assert {"FieldAttention", "FieldAttentionOutput", "concat_fields"} <= set(heads.__all__)



def test_encoder_pooling_reaches_the_model_config() -> None:
    from madr.config import from_dict
    from madr.recipes.multitask.encoders import model_config

    assert model_config(from_dict(MultiTaskExperimentConfig, {"model": {"pooling": "mean"}})).pooling == "mean"
    assert model_config(MultiTaskExperimentConfig()).pooling == "cls"
    with pytest.raises(ValueError, match="model.pooling"):
        from_dict(MultiTaskExperimentConfig, {"model": {"pooling": "max"}})


def test_serving_pair_distils_a_shallower_document_tower_too(one_thread, tmp_path):
    """`student.doc_layers`: both towers are cut and distilled (as configs/real/multitask_e5.yaml's 6-layer
    docs / 3-layer queries); the teacher keeps its layers, each student gets closer to its teacher side on
    held-out texts."""
    from madr.recipes.multitask.encoders import distil_query_student
    from madr.training.distill import num_layers

    cfg = load_multitask_config(None, {**SMALL, "output_dir": str(tmp_path), "student": {
        "num_layers": 1, "doc_layers": 1, "steps": 40, "batch_size": 32, "learning_rate": 1e-3}})
    data = build_data(cfg)
    teacher = build_encoder(cfg, build_tokenizer(cfg, data, tmp_path / "tok"), cfg.seed).eval()
    served, report = distil_query_student(cfg, teacher, data, cfg.seed)
    assert (num_layers(served.query_tower), num_layers(served.doc_tower)) == (1, 1)
    assert (num_layers(teacher.query_tower), num_layers(teacher.doc_tower)) == (2, 2), "the teacher is untouched"
    for side in ("query", "doc"):
        assert report[f"{side}_held_out_l2_after"] < report[f"{side}_held_out_l2_before"], report
    assert served.encode_texts(["ein test"], "doc").shape == teacher.encode_texts(["ein test"], "doc").shape


def test_student_settings_are_validated_naming_the_field():
    """The student's settings: layer picks as many as the student's layers, increasing; a known loss."""
    cfg = load_multitask_config(None, {"student": {"num_layers": 3, "query_layers": [0, 6, 11], "doc_layers": 2,
                                                   "doc_layer_indices": [0, 5], "loss": "cosine",
                                                   "similarity_weight": 0.5, "eval_every": 10, "checkpoint": True}})
    assert cfg.student.query_layers == [0, 6, 11] and cfg.student.doc_layer_indices == [0, 5]
    assert load_multitask_config(None).student.loss == "mse", "the default stays Sec. V-A's L2"
    bad = [({"query_layers": [0, 6]}, "student.query_layers .* names 2 layers but student.num_layers is 3"),
           ({"query_layers": [0, 6, 6]}, "student.query_layers .* distinct, increasing"),
           ({"query_layers": [-1, 0, 1]}, "student.query_layers"),
           ({"query_layers": "0,6,11"}, "student.query_layers must be a list"),
           ({"doc_layer_indices": [0, 1]}, "needs student.doc_layers"),
           ({"loss": "kl"}, "student.loss must be one of mse, cosine"),
           ({"similarity_weight": 1.0}, "set student.loss: cosine"),
           ({"checkpoint": True}, "needs student.eval_every"),
           ({"eval_every": 0}, "student.eval_every")]
    for student, message in bad:
        with pytest.raises(ValueError, match=message):
            load_multitask_config(None, {"student": {"num_layers": 3, **student}})


def test_student_curve_cached_targets_picked_layers_and_checkpoint(one_thread, tmp_path):
    """cosine loss + cached targets + picked layers: the report carries each tower's curve (held-out distance,
    x-ling top-1 of the probe slice) and the checkpoints are written; a rerun resumes from them. (That the cosine
    loss brings the student closer is tested in test_distill.py: this 2-layer teacher starts at cos ~ 1.)"""
    from madr.recipes.multitask.encoders import distil_query_student
    from madr.training.distill import num_layers

    cfg = load_multitask_config(None, {**SMALL, "output_dir": str(tmp_path), "student": {
        "num_layers": 1, "query_layers": [1], "doc_layers": 1, "doc_layer_indices": [1], "steps": 20,
        "batch_size": 32, "learning_rate": 1e-3, "loss": "cosine", "similarity_weight": 0.5,
        "cache_targets": True, "eval_every": 10, "probe_sources": 30, "checkpoint": True}})
    data = build_data(cfg)
    teacher = build_encoder(cfg, build_tokenizer(cfg, data, tmp_path / "tok"), cfg.seed).eval()
    served, report = distil_query_student(cfg, teacher, data, cfg.seed)
    assert (num_layers(served.query_tower), num_layers(served.doc_tower)) == (1, 1)
    for side in ("query", "doc"):
        curve = report[f"{side}_curve"]
        assert [p["step"] for p in curve] == [0.0, 10.0, 20.0], f"{side} curve steps"
        assert all(0.0 <= p["xling_top1_probe"] <= 1.0 for p in curve), curve
        assert curve[-1]["held_out_l2"] == pytest.approx(report[f"{side}_held_out_l2_after"], rel=1e-4)
        assert 0.0 <= report[f"{side}_teacher_xling_top1_probe"] <= 1.0
    assert all(np.isfinite(report[f"query_held_out_cosine_{k}"]) for k in ("before", "after")), report
    assert sorted(p.name.rsplit("_", 1)[0] for p in tmp_path.glob("distil_seed*.pt")) == ["distil_seed0_query",
                                                                                         "distil_seed1_doc"]
    _, again = distil_query_student(cfg, teacher, data, cfg.seed)
    for got, want in zip(again["query_curve"], report["query_curve"], strict=True):
        assert got == pytest.approx(want, rel=1e-4), "resumed from the step-10 checkpoint: the same curve"
