"""The product-search data stage from a click log (`data.clicks`): a log simulated over a judged catalog's training
queries is read on Ray Data, its examination curve estimated and reported, its clicks turned into weighted training
judgments beside the catalog's own dev / test judgments; then a tiny in-process fine-tune on them."""

from __future__ import annotations

import json
import random
from pathlib import Path

import numpy as np
import pytest

from madr.clicks.simulation import (
    ClickSimulation,
    graded_attractiveness,
    power_law_examination,
    simulate_impressions,
)
from madr.config import load_config
from madr.data.synthetic.catalog import generate_catalog
from tests.madr.clicks.test_click_log import write_jsonl

pytestmark = pytest.mark.slow  # a marked step of its own: `make test-slow` (CI runs it)

TINY = {"hidden_size": 32, "num_hidden_layers": 1, "num_attention_heads": 2, "intermediate_size": 64,
        "max_position_embeddings": 64}


def click_log(catalog, path: Path, searches: int = 3000) -> Path:
    """Each training query's judged products plus 10 random ones, scored by grade + noise (the old ranker)."""
    rng = random.Random(0)
    grades: dict[str, dict[str, int]] = {}
    for j in catalog.judgments:
        grades.setdefault(j.query_id, {})[j.product_id] = j.relevance
    ids = [p.product_id for p in catalog.products]
    candidates = {}
    for q in catalog.queries_in("train"):
        judged = grades.get(q.query_id, {})
        pool = dict(judged) | {p: 0 for p in rng.sample(ids, 10) if p not in judged}
        candidates[q.text] = [(p, g + rng.gauss(0, 1), g) for p, g in sorted(pool.items())]
    sim = ClickSimulation(searches, 8, power_law_examination(8), graded_attractiveness(4), noise=0.5)
    return write_jsonl(path, simulate_impressions(candidates, sim))


def tiny_click_config(tmp_path: Path, clicks: dict, data: dict):
    """The recipe's shape (BiBERT, BM25-mined negatives) on a tiny random backbone, trained from click log `clicks`."""
    return load_config(None, {
        "output_dir": str(tmp_path / "run"), **data, "data.clicks": clicks,
        "model.name": "bibert", "model.backbone.tiny": TINY, "model.max_query_length": 12,
        "model.max_doc_length": 24, "index.num_shards": 1,
        "train.finetune": {"steps": 3, "batch_size": 8, "negatives": "mined", "mined_depth": 5,
                           "judged_negative_share": 0.5, "aspect_weight": 0.0}})


def test_data_stage_from_a_click_log_then_tiny_finetune(ray_local, tmp_path: Path) -> None:
    from madr.recipes.aspects.experiment import load_catalog, prepare_tokenizer
    from madr.training.loop import catalog_sampler, train_stage
    from pipelines.data.prepare import prepare

    base = generate_catalog(num_products=150, num_queries=60, seed=3)
    base.write(tmp_path / "catalog")
    log = click_log(base, tmp_path / "log.jsonl")
    cfg = tiny_click_config(tmp_path, {"path": str(log), "format": "impressions", "max_rank": 8},
                            {"data.catalog_dir": str(tmp_path / "catalog"), "data.tokenizer_vocab_size": 600})
    summary = prepare(cfg, log=lambda *_: None)
    clicks = Path(cfg.output_dir) / "data" / "clicks"
    curve = json.loads((clicks / "examination.json").read_text())
    assert (clicks / "examination.png").stat().st_size > 1000
    assert np.max(np.abs(np.array(curve["propensity"]) - power_law_examination(8))) < 0.15, curve["propensity"]
    assert summary["clicks"]["judgments"]["positives"] > 50 and summary["clicks"]["judgments"]["skip_negatives"] > 0
    catalog = load_catalog(cfg)
    train = {q.query_id for q in catalog.queries_in("train")}
    assert all(q.startswith("click-") for q in train), "the training queries are the click log's"
    assert {q.query_id for q in catalog.queries_in("test")} == {q.query_id for q in base.queries_in("test")}
    weights = [j.weight for j in catalog.judgments if j.query_id in train and j.relevance == 4]
    assert min(weights) < 1.0 < max(weights), "clicks at rarely examined ranks weigh more"
    from madr.modeling.model import build_model
    from madr.recipes.aspects.experiment import prepare_vocabularies

    tokenizer = prepare_tokenizer(cfg, catalog)
    model = build_model(cfg.model, tokenizer, prepare_vocabularies(cfg, catalog, tokenizer))
    sampler = catalog_sampler(catalog, cfg.train.finetune, tokenizer, seed=0)
    assert any(e.weight != 1.0 for e in sampler.finetune_batch(32)), "the sampler carries the click weights"
    history = train_stage(model, sampler, cfg.train.finetune, "finetune", progress=False)
    assert len(history) == 3 and all(np.isfinite(h["loss"]) for h in history)


def test_the_real_ubi_sample_through_the_data_stage_and_training(ray_local, shared_data: Path, tmp_path: Path) -> None:
    """OpenSearch UBI events + queries (an ESCI sample, ../shared/data/esci) with no catalog: the products are the
    log's described objects, dev / test a hashed holdout of its queries judged by clicks. Too small for quality
    numbers (a few hundred searches, 287 clicks): this shows the path runs, not that it helps."""
    from madr.modeling.model import build_model
    from madr.recipes.aspects.experiment import load_catalog, prepare_tokenizer, prepare_vocabularies
    from madr.training.loop import catalog_sampler, train_stage
    from pipelines.data.prepare import prepare

    events, queries = (str(shared_data / "esci" / f"ubi_esci_{n}.parquet") for n in ("events", "queries"))
    cfg = tiny_click_config(tmp_path, {"path": events, "format": "ubi", "queries": queries},
                            {"data.tokenizer_vocab_size": 800})
    summary = prepare(cfg, log=lambda *_: None)
    clicks = Path(cfg.output_dir) / "data" / "clicks"
    curve = json.loads((clicks / "examination.json").read_text())
    assert curve["impressions"][0] > 0 and curve["propensity"][0] == pytest.approx(1.0)
    assert (clicks / "examination.png").stat().st_size > 1000
    assert summary["clicks"]["judgments"]["positives"] > 20, summary["clicks"]
    catalog = load_catalog(cfg)
    print(f"\nUBI sample: {catalog}; clicks: {json.dumps(summary['clicks']['judgments'])}")
    assert len(catalog.products) > 400 and catalog.queries_in("train") and catalog.queries_in("test")
    tokenizer = prepare_tokenizer(cfg, catalog)
    model = build_model(cfg.model, tokenizer, prepare_vocabularies(cfg, catalog, tokenizer))
    history = train_stage(model, catalog_sampler(catalog, cfg.train.finetune, tokenizer, seed=0), cfg.train.finetune,
                          "finetune", progress=False)
    assert len(history) == 3 and all(np.isfinite(h["loss"]) for h in history)
