"""The encode job (in process) stores a tiny MADRAL model's calibrated top-k aspect values per product beside the
shards (equal to `encode_aspects` of the same texts, the model's temperatures applied), and nothing for a model
without aspect heads."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

from madr.config import BackboneConfig, ModelConfig
from madr.encode_config import EncodeConfig
from madr.index import encode_queries
from madr.index.manifest import Manifest
from madr.modeling.calibration import AspectCalibration
from madr.modeling.model import BiEncoder, build_model
from madr.search.aspect_match import AspectStore
from pipelines.encode.job import run_encode

TINY = {"hidden_size": 32, "num_hidden_layers": 1, "num_attention_heads": 2, "intermediate_size": 64,
        "max_position_embeddings": 64}
N = 90


def _model(path, name, tokenizer, vocabularies) -> str:
    torch.manual_seed(0)
    cfg = ModelConfig(name=name, backbone=BackboneConfig(tiny=TINY), max_query_length=16, max_doc_length=48)
    model = build_model(cfg, tokenizer, vocabularies if name == "madral" else None)
    if name == "madral":
        model.calibration = AspectCalibration({"doc": {"brand": 0.5, "color": 2.0}}, "test")
    model.save(path)
    return str(path)


@pytest.fixture(scope="module")
def corpus(catalog, tmp_path_factory):
    root = tmp_path_factory.mktemp("aspect_corpus")
    ps = catalog.products[:N]
    table = pa.table({"doc_id": np.arange(N, dtype=np.int64) * 3 + 1, "text": [catalog.product_text(p) for p in ps]})
    pq.write_table(table, root / "docs.parquet")
    return root, table


def _encode(corpus, model_dir, out, **kw):
    return run_encode(EncodeConfig(input=[str(corpus[0])], output=str(out), model_dir=model_dir, text_columns=["text"],
                                   num_shards=2, rows_per_read=30, **kw), log=lambda _: None, local=True)


def test_aspect_model_stores_its_calibrated_top_k(corpus, tokenizer, vocabularies, tmp_path):
    from madr.modeling.aspect_distributions import encode_aspects

    model_dir = _model(tmp_path / "madral", "madral", tokenizer, vocabularies)
    result = _encode(corpus, model_dir, tmp_path / "index", aspect_top_k=3)
    manifest = Manifest.load(result.manifest_path)
    model = BiEncoder.load(model_dir)
    assert manifest.aspects["k"] == 3 and manifest.aspects["calibrated"]
    assert manifest.aspects["aspects"] == list(model.config.aspects)
    assert all(s.aspects_path for s in manifest.shards)
    manifest.verify(result.manifest_path.parent)
    store = AspectStore.open(result.manifest_path)
    ids, texts = corpus[1].column("doc_id").to_numpy(), corpus[1].column("text").to_pylist()
    got, want = store.lookup(ids), encode_aspects(model, texts, "doc", 3)
    for a in model.config.aspects:
        np.testing.assert_allclose(got[a].probs, want[a].probs, atol=1e-5, err_msg=a)
        np.testing.assert_allclose(got[a].presence, want[a].presence, atol=1e-5, err_msg=a)
        assert (got[a].values[:, 0] == want[a].values[:, 0]).mean() > 0.95
        assert np.all(np.diff(got[a].probs, axis=1) <= 1e-7)  # most probable first
        assert store.values[a] == list(model.vocabularies.get(a, "phrase").values)
    model.calibration = None  # the stored distributions are the calibrated ones
    raw = encode_aspects(model, texts, "doc", 3)
    assert not np.allclose(raw["brand"].probs, got["brand"].probs, atol=1e-3)


def test_no_aspect_heads_no_aspect_part(corpus, tokenizer, vocabularies, tmp_path):
    model_dir = _model(tmp_path / "bibert", "bibert", tokenizer, vocabularies)
    result = _encode(corpus, model_dir, tmp_path / "index", aspect_top_k=3)
    manifest = Manifest.load(result.manifest_path)
    assert manifest.aspects is None and not any(s.aspects_path for s in manifest.shards)
    assert not list(result.manifest_path.parent.glob("*.aspects.npz"))
    assert AspectStore.open(result.manifest_path) is None


def test_aspect_top_k_zero_stores_none(corpus, tokenizer, vocabularies, tmp_path):
    model_dir = _model(tmp_path / "madral", "madral", tokenizer, vocabularies)
    result = _encode(corpus, model_dir, tmp_path / "index", aspect_top_k=0)
    assert Manifest.load(result.manifest_path).aspects is None
    with pytest.raises(ValueError, match="aspect_top_k"):
        EncodeConfig(aspect_top_k=-1)


def test_an_evaluated_search_fuses_the_aspect_match_the_index_serves(corpus, tokenizer, vocabularies, tmp_path):
    """The evaluate / mine searcher (`search_texts`) computes the queries' aspect values when the index's aspect
    weight is > 0, as the served query encoder does; the index refuses a weighted search without them."""
    from madr.index.manifest import record_aspect_weight
    from madr.modeling.aspect_distributions import encode_aspects
    from madr.search.params import SearchParams
    from madr.search.sharded import ShardedIndex
    from madr.search.spec import SearchSpec
    from pipelines.evaluate.searcher import search_texts

    model_dir = _model(tmp_path / "madral", "madral", tokenizer, vocabularies)
    result = _encode(corpus, model_dir, tmp_path / "index", aspect_top_k=3)
    record_aspect_weight(result.manifest_path, 0.5)
    index, model = ShardedIndex.open(result.manifest_path), BiEncoder.load(model_dir).eval()
    texts = corpus[1].column("text").to_pylist()[:12]
    spec = SearchSpec(name="m", index=str(result.manifest_path))
    scores, ids = search_texts(model, index, texts, 10, spec)
    dense = encode_queries(model, texts)[0]
    want = index.search(dense, SearchParams(k=10, lam=1.0), aspects=encode_aspects(model, texts, "query", 3))
    np.testing.assert_array_equal(ids, want[1])
    np.testing.assert_allclose(scores, want[0], rtol=1e-5)
    plain = index.search(dense, SearchParams(k=10, lam=1.0, aspect_weight=0.0))
    assert not np.allclose(scores, plain[0])  # the aspect match moved the scores
    with pytest.raises(ValueError, match="no query aspect values"):
        index.search(dense, SearchParams(k=10, lam=1.0))
    # the evaluate job's latency sweep times the dense search alone
    from madr.evaluate_config import EvaluateConfig
    from madr.metrics import evaluate
    from pipelines.evaluate.job import sweep, to_run
    from pipelines.evaluate.searcher import DocKeys

    queries = pa.table({"query_id": [f"q{i}" for i in range(12)], "text": texts})
    qrels = {f"q{i}": {str(d): 1.0} for i, d in enumerate(corpus[1].column("doc_id").to_pylist()[:12])}
    cfg = EvaluateConfig(queries="q", qrels="r", runs=[spec], output=str(tmp_path / "eval"), doc_key="doc_id",
                         metrics=["recall@10"], k=10, sweep_metric="recall@10")
    keys = DocKeys(str(result.manifest_path), "doc_id")
    (point,) = sweep(spec, queries, qrels, keys, cfg)
    dense_run = to_run({f"q{i}": (plain[1][i], plain[0][i]) for i in range(12)}, keys)
    assert point["recall@10"] == pytest.approx(evaluate(dense_run, qrels, ["recall@10"])["recall@10"])


def test_an_evaluated_aspect_filter_keeps_and_a_boost_ranks_first_what_serve_would(corpus, tokenizer, vocabularies,
                                                                                   tmp_path):
    """`SearchSpec.aspect_filter`: the evaluate searcher filters / boosts each query's ranked results by its own
    predicted values of confidence >= `aspect_confidence` (`/search`'s aspect_filter): filtered results all hold
    the condition and keep their order; boosted ones are the same set as the plain ranking, matching ones first;
    a query without a confident value keeps its ranking; an index without aspect data is refused."""
    from madr.modeling.aspect_distributions import encode_aspects
    from madr.search.aspect_match import condition_mask, predicted_condition
    from madr.search.sharded import ShardedIndex
    from madr.search.spec import SearchSpec
    from pipelines.evaluate.searcher import search_texts

    model_dir = _model(tmp_path / "madral", "madral", tokenizer, vocabularies)
    result = _encode(corpus, model_dir, tmp_path / "index", aspect_top_k=3)
    index, model = ShardedIndex.open(result.manifest_path), BiEncoder.load(model_dir).eval()
    texts = corpus[1].column("text").to_pylist()[:12]
    run = {"name": "m", "index": str(result.manifest_path)}
    confidence = 0.05  # a tiny random model is unsure: a low bar gives most queries a condition
    plain = search_texts(model, index, texts, 30, SearchSpec(**run))
    kept = search_texts(model, index, texts, 30, SearchSpec(**run, aspect_filter="filter", aspect_confidence=confidence))
    boosted = search_texts(model, index, texts, 30, SearchSpec(**run, aspect_filter="boost", aspect_confidence=confidence))
    query = encode_aspects(model, texts, "query", 3)
    conditioned = 0
    for q in range(len(texts)):
        condition = predicted_condition(query, q, confidence, index.aspects)
        base = plain[1][q][plain[1][q] >= 0]
        if not condition:
            np.testing.assert_array_equal(kept[1][q], plain[1][q])
            continue
        conditioned += 1
        mask = condition_mask(index.aspects.lookup(base), condition)
        got = kept[1][q][kept[1][q] >= 0]
        np.testing.assert_array_equal(got, base[mask])  # the matching candidates, in their order
        np.testing.assert_array_equal(boosted[1][q], np.concatenate([base[mask], base[~mask]]))
        assert np.all(np.diff(boosted[0][q][boosted[1][q] >= 0]) <= 0)  # the scores order the boosted ranking
    assert conditioned > 0
    assert (kept[1] < 0).sum() > (plain[1] < 0).sum()  # the filter dropped candidates
    no_aspects = _encode(corpus, _model(tmp_path / "bibert", "bibert", tokenizer, vocabularies), tmp_path / "plain")
    with pytest.raises(ValueError, match="aspect_filter needs an index with aspect data"):
        search_texts(BiEncoder.load(tmp_path / "bibert").eval(), ShardedIndex.open(no_aspects.manifest_path), texts,
                     10, SearchSpec(name="b", index=str(no_aspects.manifest_path), aspect_filter="filter"))
    with pytest.raises(ValueError, match="aspect_filter must be one of filter, boost"):
        SearchSpec(**run, aspect_filter="drop")
