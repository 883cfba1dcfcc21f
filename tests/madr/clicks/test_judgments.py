"""Click judgments: clipped inverse-propensity weights and skip-above negatives, hand-computed; the fine-tuning
losses honour per-example weights in process and in the Ray job's module alike."""

from __future__ import annotations

import pyarrow as pa
import pytest
import torch

from madr.clicks.collapse import IMPRESSION_SCHEMA
from madr.clicks.examination import ExaminationCurve
from madr.clicks.judgments import click_judgments
from madr.losses import InBatchSoftmaxLoss, PointwiseCELoss
from madr.training.distributed import GatheredInBatchSoftmaxLoss


def impressions(rows: list[tuple]) -> pa.Table:
    keys = ("search_id", "query", "doc_id", "position", "clicked")
    dicts = [{**dict(zip(keys, r, strict=True)), "session_id": "", "doc_text": None, "clicks": int(r[4]),
              "purchased": False, "dwell": None} for r in rows]
    return pa.Table.from_pylist(dicts, schema=IMPRESSION_SCHEMA)


def curve(propensity: list[float]) -> ExaminationCurve:
    n = len(propensity)
    return ExaminationCurve(propensity, propensity, [1] * n, [0] * n, [0.0] * n, 1, 0.0, 0, 0)


def test_weights_are_clipped_inverse_propensities_and_skips_above_are_negatives() -> None:
    log = impressions([("s1", "drill", "A", 1, False), ("s1", "drill", "B", 2, False), ("s1", "drill", "C", 3, True),
                       ("s2", "drill", "B", 1, True), ("s2", "drill", "A", 2, False),
                       ("s3", "saw", "X", 1, True)])
    got = {(j.query, j.doc_id): j for j in click_judgments(log, curve([1.0, 0.5, 0.25]), clip=3.0,
                                                            skip_min_examination=0.5)}
    # raw weights: C clicked at rank 3 -> min(1/0.25, 3) = 3; B at rank 1 -> 1; X at rank 1 -> 1; mean 5/3
    assert got["drill", "C"].weight == pytest.approx(3 / (5 / 3))
    assert got["drill", "B"].weight == pytest.approx(1 / (5 / 3)) and got["drill", "B"].relevant
    assert not got["drill", "A"].relevant, "A was skipped above C at rank 1 (examined) and never clicked"
    assert ("saw", "X") in got and len(got) == 4, "B is clicked in s2: its skip in s1 is no negative"
    naive = {(j.query, j.doc_id): j.weight for j in click_judgments(log, None) if j.relevant}
    assert set(naive.values()) == {1.0}, "the naive baseline weighs every click alike"
    strict = click_judgments(log, curve([1.0, 0.5, 0.25]), skip_min_examination=0.9)
    assert [j.doc_id for j in strict if not j.relevant] == ["A"], "rank-1 skips only at a high threshold"


def test_the_affine_correction_takes_the_noise_floor_off_every_impression_before_undoing_position() -> None:
    log = impressions([("s1", "drill", "A", 1, True), ("s1", "drill", "B", 3, True),
                       *[(f"s{i}", "drill", "B", 3, False) for i in range(2, 8)],
                       ("s2", "drill", "C", 2, True), ("s3", "drill", "C", 2, False)])
    got = {j.doc_id: j for j in click_judgments(log, curve([1.0, 0.5, 0.25]), clip=10.0, noise=0.2,
                                                skip_negatives=False)}
    # w (clicked - p epsilon) per impression; A: 1 x (1 - 0.2) = 0.8; C: 2 x (1 - 0.1) + 2 x (0 - 0.1) = 1.6;
    # B: 4 x (1 - 0.05) + 6 x 4 x (0 - 0.05) = 2.6; normalised to mean 1 (5 / 3)
    assert got["A"].weight == pytest.approx(0.8 * 3 / 5) and got["C"].weight == pytest.approx(1.6 * 3 / 5)
    assert got["B"].weight == pytest.approx(2.6 * 3 / 5) and got["B"].clicks == 1
    floor = {j.doc_id for j in click_judgments(log, curve([1.0, 0.5, 0.25]), noise=0.6, skip_negatives=False)}
    assert floor == {"A", "C"}, "B's one click in seven impressions at rank 3 is within a floor of 0.6 (4 x 0.85 - 6 x 0.6)"
    plain = click_judgments(log, curve([1.0, 0.5, 0.25]), skip_negatives=False)
    assert plain == click_judgments(log, curve([1.0, 0.5, 0.25]), noise=0.0, skip_negatives=False)
    naive = click_judgments(log, None, noise=0.6, skip_negatives=False)
    assert {j.doc_id for j in naive} == {"A", "B", "C"}, "the naive baseline takes no floor off"


def test_the_click_noise_floor_is_read_from_a_simulated_log() -> None:
    """`estimate_click_noise` on a log simulated with a known floor (most shown pairs irrelevant, as in search)."""
    import numpy as np

    from madr.clicks.noise import estimate_click_noise
    from madr.clicks.simulation import (
        ClickSimulation,
        graded_attractiveness,
        power_law_examination,
        simulate_impressions,
    )

    rng = np.random.default_rng(0)
    candidates = {}
    for q in range(150):
        grades = rng.choice(5, 30, p=[0.6, 0.1, 0.1, 0.1, 0.1])
        scores = grades + rng.normal(0, 1.5, 30)
        candidates[f"q{q}"] = [(f"d{q}-{i}", float(scores[i]), int(grades[i])) for i in range(30)]
    truth = power_law_examination(10)
    for epsilon in (0.05, 0.2):
        sim = ClickSimulation(15000, 10, truth, graded_attractiveness(4, epsilon), noise=1.0, seed=1)
        log = impressions([(r["search_id"], r["query"], r["doc_id"], r["position"], r["clicked"])
                           for r in simulate_impressions(candidates, sim)])
        noise = estimate_click_noise(log, curve(list(truth)))
        assert noise.source == "auto" and noise.pairs > 1000
        assert noise.epsilon == pytest.approx(epsilon, abs=0.03), noise


def test_the_posterior_rate_filter_keeps_the_clicks_of_relevant_pairs(tmp_path) -> None:
    """`rate_quantile`: a clicked pair stays a positive only when its posterior click rate (position taken out,
    shrunk toward the log's fitted rates) is likely above that quantile; on a log simulated with a known curve and
    floor, most dropped positives are grade 0 and the kept ones' weight sits more on grades 3-4."""
    import numpy as np

    from madr.clicks.judgments import judge_log_impressions
    from madr.clicks.noise import pair_rates_above
    from madr.clicks.simulation import (
        ClickSimulation,
        graded_attractiveness,
        power_law_examination,
        simulate_impressions,
    )
    from madr.config import ClickLogConfig

    rng = np.random.default_rng(0)
    candidates, grade = {}, {}
    for q in range(150):
        grades = rng.choice(5, 30, p=[0.6, 0.1, 0.1, 0.1, 0.1])
        scores = grades + rng.normal(0, 1.0, 30)
        candidates[f"q{q}"] = [(f"d{q}-{i}", float(scores[i]), int(grades[i])) for i in range(30)]
        grade.update({(f"q{q}", f"d{q}-{i}"): int(grades[i]) for i in range(30)})
    truth = power_law_examination(10)
    sim = ClickSimulation(15000, 10, truth, graded_attractiveness(4, 0.1), noise=1.0, seed=1)
    log = impressions([(r["search_id"], r["query"], r["doc_id"], r["position"], r["clicked"])
                       for r in simulate_impressions(candidates, sim)])
    rates = pair_rates_above(log, curve(list(truth)), 0.75)
    assert all(0.0 <= p <= 1.0 for p in rates.values()) and len(rates) > 1000

    def shares(cfg: ClickLogConfig) -> tuple[float, float, int]:
        _, judged = judge_log_impressions(log, cfg, tmp_path / str(cfg.rate_quantile))
        pos = [j for j in judged if j.relevant]
        w = np.array([j.weight for j in pos])
        g = np.array([grade[j.query, j.doc_id] for j in pos])
        return float(w[g >= 3].sum() / w.sum()), float(w[g == 0].sum() / w.sum()), len(pos)

    base = dict(path="log", format="impressions", estimator="em", debias=False)
    plain, filtered = shares(ClickLogConfig(**base)), shares(ClickLogConfig(**base, rate_quantile=0.75))
    assert filtered[2] < plain[2], "the filter drops positives"
    assert filtered[0] > plain[0] + 0.05 and filtered[1] < plain[1] / 2, (plain, filtered)  # 0.88 -> 0.99; 0.033 -> 0.002
    with pytest.raises(ValueError, match="rate_quantile must be in"):
        ClickLogConfig(**base, rate_quantile=1.0)


def test_in_batch_softmax_and_pointwise_ce_take_per_row_weights() -> None:
    torch.manual_seed(0)
    q, p, n = torch.randn(4, 8), torch.randn(4, 8), torch.randn(4, 8)
    w = torch.tensor([0.5, 2.0, 1.0, 0.5])
    loss = InBatchSoftmaxLoss("cosine", 0.1)
    logits = InBatchSoftmaxLoss.scores(q, torch.cat([p, n]), "cosine") / 0.1
    per_row = torch.nn.functional.cross_entropy(logits, torch.arange(4), reduction="none")
    assert loss(q, p, n, w).item() == pytest.approx((per_row * w).mean().item(), rel=1e-6)
    assert loss(q, p, n, torch.ones(4)).item() == pytest.approx(loss(q, p, n).item(), rel=1e-6)
    assert GatheredInBatchSoftmaxLoss("cosine", 0.1)(q, p, n, w).item() == pytest.approx(loss(q, p, n, w).item())
    ce = PointwiseCELoss("cosine")
    target = torch.tensor([1.0, 0.0, 1.0, 0.0])
    terms = torch.nn.functional.binary_cross_entropy_with_logits(ce.logits(q, p), target, reduction="none")
    assert ce(q, p, target, w).item() == pytest.approx((terms * w).mean().item(), rel=1e-6)


def test_row_weights_change_the_loss_and_weights_of_one_leave_it_unchanged(catalog, tokenizer, vocabularies) -> None:
    from madr.config import ModelConfig, StageConfig
    from madr.modeling.model import build_model
    from madr.training.loop import CatalogSampler, example_weights, finetune_batches
    from madr.training.stage_module import FinetuneBatch, StageModule

    cfg = ModelConfig(name="bibert", aspects=catalog.aspect_names, max_query_length=12, max_doc_length=24)
    cfg.backbone.tiny = {"hidden_size": 32, "num_hidden_layers": 1, "num_attention_heads": 2,
                         "intermediate_size": 64, "max_position_embeddings": 64, "hidden_dropout_prob": 0.0,
                         "attention_probs_dropout_prob": 0.0}
    torch.manual_seed(0)
    model = build_model(cfg, tokenizer, vocabularies).eval()
    examples = CatalogSampler(catalog, seed=1).finetune_batch(8)
    for i, e in enumerate(examples):
        e.weight = 0.25 + 0.25 * i
    qb, pb, nb, rel = finetune_batches(model, examples)
    stage = StageConfig(aspect_weight=0.0, pointwise_weight=1.0)
    module = StageModule("finetune", stage, model, gather=False)
    weighted, _ = module.loss(FinetuneBatch(qb, pb, nb, rel, example_weights(examples)))
    plain, _ = module.loss(FinetuneBatch(qb, pb, nb, rel))
    ones, _ = module.loss(FinetuneBatch(qb, pb, nb, rel, torch.ones(len(examples))))
    assert ones.item() == pytest.approx(plain.item(), rel=1e-6)
    assert weighted.item() != pytest.approx(plain.item(), rel=1e-3), "the weights change the loss"
