"""`madr.search.fusion_tuning.tune_aspect_weight`: on dev queries whose relevant products share the query's
aspect value the grid picks a weight > 0; where the aspects do not help it answers 0."""

from __future__ import annotations

import numpy as np
import pytest

from madr.index import build_index
from madr.index.aspects import AspectTopK
from madr.search.aspect_match import AspectStore
from madr.search.fusion_tuning import check_aspect_weights, tune_aspect_weight

BRANDS = [0, 1, 0, 1, 1, 0]  # products 0..5; base ranking 0, 1, 2, ... (score falls with the id)


@pytest.fixture(scope="module")
def store(tmp_path_factory) -> AspectStore:
    ids = np.arange(6, dtype=np.int64)
    brand = AspectTopK(np.array([[b, 1 - b] for b in BRANDS]), np.array([[0.9, 0.1]] * 6), np.ones(6))
    manifest = build_index(np.eye(6, dtype=np.float32), ids, tmp_path_factory.mktemp("tune_aspects"), num_shards=1,
                           aspects={"brand": brand}, aspect_values={"brand": ["acme", "zeta"]})
    return AspectStore.open(manifest)


def _base(q: int) -> tuple[np.ndarray, np.ndarray]:
    ids = np.tile(np.arange(6, dtype=np.int64), (q, 1))
    return np.tile(1.0 - 0.1 * np.arange(6), (q, 1)).astype(np.float32), ids


def _run(top) -> dict:
    scores, ids = top
    return {f"q{r}": {f"d{d}": float(s) for d, s in zip(ids[r], scores[r], strict=True) if d >= 0}
            for r in range(ids.shape[0])}


def _queries(brands: list[int]) -> dict:
    v = np.array([[b] for b in brands])
    return {"brand": AspectTopK(v, np.ones((len(brands), 1)), np.ones(len(brands)))}


def test_aspects_that_help_get_a_weight(store):
    qrels = {"q0": {"d3": 1.0}, "q1": {"d4": 1.0}}  # zeta products below the acme ones
    choice = tune_aspect_weight(_base(2), _queries([1, 1]), store, _run, qrels, "mrr@10", [0, 0.2, 0.5, 0.9], k=3)
    assert choice.aspect_weight > 0 and choice.value > choice.grid[0.0]["mrr@10"]


def test_a_weight_needs_a_significant_gain_over_zero(store):
    """Two queries cannot show a gain at p < 0.05; twenty helped the same way can."""
    qrels = {"q0": {"d3": 1.0}, "q1": {"d4": 1.0}}
    few = tune_aspect_weight(_base(2), _queries([1, 1]), store, _run, qrels, "mrr@10", [0, 0.5], k=3, max_p=0.05)
    assert few.aspect_weight == 0.0 and few.best_weight == 0.5 and few.p_value >= 0.05
    assert few.value == few.grid[0.0]["mrr@10"]
    qrels = {f"q{i}": {f"d{3 + i % 2}": 1.0} for i in range(20)}
    many = tune_aspect_weight(_base(20), _queries([1] * 20), store, _run, qrels, "mrr@10", [0, 0.5], k=3, max_p=0.05)
    assert many.aspect_weight == 0.5 and many.p_value < 0.05
    assert many.to_dict()["p_value"] == many.p_value
    with pytest.raises(ValueError, match="aspect_max_p"):
        from madr.config import TuneConfig

        TuneConfig(aspect_max_p=0.0)


def test_aspects_that_do_not_help_get_zero(store):
    qrels = {"q0": {"d0": 1.0}, "q1": {"d2": 1.0}}  # acme products, the query says zeta
    choice = tune_aspect_weight(_base(2), _queries([1, 1]), store, _run, qrels, "mrr@10", [0, 0.5, 0.9], k=3)
    assert choice.aspect_weight == 0.0
    flat = tune_aspect_weight(_base(1), _queries([0]), store, _run, {"q0": {"nowhere": 1.0}}, "mrr@10", [0.5, 0], 3)
    assert flat.aspect_weight == 0.0  # ties go to the smaller weight


def test_grid_must_hold_zero():
    with pytest.raises(ValueError, match="holds 0"):
        check_aspect_weights([0.1, 0.2])
    with pytest.raises(ValueError, match="tune.aspect_weights"):
        from madr.config import TuneConfig

        TuneConfig(aspect_weights=[0.5, 1.5, 0])
