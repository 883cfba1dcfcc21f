"""The aspect-match score (paper 000 Sec. 5 distributions, Sec. 6.2 presence) by hand on small arrays, its fusion
into a sharded index's ranking, aspect filters / boosts on a constructed index, and the filter-precision helper."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from madr.index import build_index
from madr.index.aspects import AspectTopK
from madr.index.manifest import Manifest, record_aspect_weight
from madr.search.aspect_match import (
    AspectStore,
    apply_condition,
    aspect_match,
    aspect_rescore,
    aspect_scores,
    condition_mask,
    filter_precision,
    predicted_condition,
)
from madr.search.params import SearchParams
from madr.search.sharded import ShardedIndex


def _topk(rows: list[list[tuple[int, float]]], presence: list[float]) -> AspectTopK:
    k = max(len(r) for r in rows)
    values = np.full((len(rows), k), -1, np.int32)
    probs = np.zeros((len(rows), k), np.float32)
    for i, r in enumerate(rows):
        for j, (v, p) in enumerate(r):
            values[i, j], probs[i, j] = v, p
    return AspectTopK(values, probs, np.array(presence, np.float32))


def test_score_is_the_inner_product_of_the_two_distributions():
    q_values, q_probs = np.array([2, 0, -1]), np.array([0.6, 0.3, 0.0])
    d_values = np.array([[0, 2, 5], [5, 6, -1], [-1, -1, -1]])
    d_probs = np.array([[0.5, 0.4, 0.1], [0.9, 0.1, 0.0], [0.0, 0.0, 0.0]])
    got = aspect_scores(q_values, q_probs, d_values, d_probs)
    np.testing.assert_allclose(got, [0.6 * 0.4 + 0.3 * 0.5, 0.0, 0.0])


def test_total_weights_aspects_by_query_presence():
    query = {"brand": _topk([[(1, 0.8), (2, 0.2)]], [0.9]), "color": _topk([[(0, 1.0), (1, 0.0)]], [0.1])}
    docs = {"brand": _topk([[(1, 1.0)], [(2, 1.0)]], [1.0, 1.0]), "color": _topk([[(1, 1.0)], [(0, 1.0)]], [1, 1])}
    m = aspect_match(query, 0, docs)
    # doc 0: brand 0.8 * 1, color 0; doc 1: brand 0.2, color 1.0; weights 0.9 / 1.0 and 0.1 / 1.0
    np.testing.assert_allclose(m.scores["brand"], [0.8, 0.2], rtol=1e-6)
    np.testing.assert_allclose(m.scores["color"], [0.0, 1.0], rtol=1e-6)
    np.testing.assert_allclose(m.total, [0.9 * 0.8, 0.9 * 0.2 + 0.1 * 1.0], rtol=1e-6)
    assert m.weight == pytest.approx({"brand": 0.9, "color": 0.1})
    absent = {"brand": _topk([[(1, 1.0)]], [0.0])}
    assert aspect_match(absent, 0, docs).total.tolist() == [0.0, 0.0]


@pytest.fixture(scope="module")
def aspect_index(tmp_path_factory):
    """6 products over 2 shards: dense scores fall with the id for the query [1, 0]; brands by id:
    0 acme, 1 zeta, 2 acme, 3 zeta, 4 zeta, 5 acme (each certain), colour red for all."""
    root = tmp_path_factory.mktemp("aspect_index")
    ids = np.arange(6, dtype=np.int64)
    dense = np.stack([1.0 - 0.1 * ids, 0.1 * ids], axis=1).astype(np.float32)
    brands = [0, 1, 0, 1, 1, 0]
    aspects = {"brand": _topk([[(b, 0.9), (1 - b, 0.1)] for b in brands], [1.0] * 6),
               "color": _topk([[(0, 1.0)]] * 6, [1.0] * 6)}
    manifest = build_index(dense, ids, root, num_shards=2, aspects=aspects,
                           aspect_values={"brand": ["Acme", "Zeta"], "color": ["red"]})
    return Path(manifest)


def test_index_stores_aspects_and_fusion_reorders(aspect_index):
    manifest = Manifest.load(aspect_index)
    assert manifest.has_aspects and manifest.aspects["k"] == 2 and manifest.aspect_weight == 0.0
    assert all(s.aspects_path for s in manifest.shards)
    manifest.verify(aspect_index.parent)
    index = ShardedIndex.open(aspect_index)
    query = np.array([[1.0, 0.0]], np.float32)
    zeta = {"brand": _topk([[(1, 1.0)]], [1.0]), "color": _topk([[(0, 1.0)]], [0.0])}
    _, plain = index.search(query, k=3)
    assert plain[0].tolist() == [0, 1, 2]
    _, same = index.search(query, k=3, aspects=zeta, aspect_weight=0.0)
    assert same[0].tolist() == [0, 1, 2]
    scores, fused = index.search(query, k=3, aspects=zeta, aspect_weight=0.8)
    assert fused[0].tolist() == [1, 3, 4]  # the zeta products first, in dense order
    assert np.all(np.diff(scores[0]) <= 0)
    record_aspect_weight(aspect_index, 0.8)  # the tune stage's choice serves a search that sets none
    assert ShardedIndex.open(aspect_index).search(query, k=3, aspects=zeta)[1][0].tolist() == [1, 3, 4]
    record_aspect_weight(aspect_index, 0.0)


def test_weight_without_aspect_data_is_refused(tmp_path):
    dense = np.eye(3, dtype=np.float32)
    index = ShardedIndex.open(build_index(dense, np.arange(3), tmp_path, num_shards=1))
    assert index.aspects is None
    with pytest.raises(ValueError, match="aspect_weight"):
        index.search(dense[:1], SearchParams(k=2, aspect_weight=0.5), aspects={})
    with pytest.raises(ValueError, match="aspect_weight"):
        SearchParams(aspect_weight=1.5)


def test_filter_keeps_matching_products_only_and_boost_reorders(aspect_index):
    store = AspectStore.open(aspect_index)
    ids = np.arange(6, dtype=np.int64)
    scores = 1.0 - 0.1 * ids
    cond = store.condition({"brand": ["acme"]})  # case-insensitive
    mask = condition_mask(store.lookup(ids), cond)
    _, kept = apply_condition(scores, ids, mask, "filter")
    assert kept.tolist() == [0, 2, 5]
    known = {i: {"brand": ["Acme" if b == 0 else "Zeta"]} for i, b in enumerate([0, 1, 0, 1, 1, 0])}
    assert filter_precision(kept, known, {"brand": ["acme"]}) == 1.0
    assert filter_precision(ids, known, {"brand": ["acme"]}) == 0.5
    lifted, boosted = apply_condition(scores, ids, mask, "boost")
    assert boosted.tolist() == [0, 2, 5, 1, 3, 4]
    assert np.all(np.diff(lifted) < 0), lifted  # the scores order the ranking: matching ones lifted above the rest
    np.testing.assert_allclose(lifted[3:], scores[[1, 3, 4]])
    with pytest.raises(ValueError, match="aspects.brand"):
        store.condition({"brand": ["nike"]})
    with pytest.raises(ValueError, match="aspects.size"):
        store.condition({"size": ["xl"]})


def test_predicted_condition_uses_presence_times_probability(aspect_index):
    store = AspectStore.open(aspect_index)
    query = {"brand": _topk([[(1, 0.9), (0, 0.1)]], [0.9]), "color": _topk([[(0, 0.95)]], [0.5])}
    assert predicted_condition(query, 0, 0.7, store) == {"brand": frozenset({1})}  # 0.81 >= 0.7; colour 0.475
    assert predicted_condition(query, 0, 0.85, store) == {}


def test_rescore_pads_and_keeps_ties_by_id(aspect_index):
    store = AspectStore.open(aspect_index)
    base = (np.array([[0.5, 0.5, -np.inf]], np.float32), np.array([[3, 1, -1]]))
    query = {"brand": _topk([[(1, 1.0)]], [1.0])}
    scores, ids = aspect_rescore(base, query, store, 0.5, k=4)
    assert ids[0].tolist() == [1, 3, -1, -1] and np.isneginf(scores[0, 2:]).all()
