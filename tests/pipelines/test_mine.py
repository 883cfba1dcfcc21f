"""The hard-negative mining job on a local Ray: negatives exclude the positives, come from the rank range,
are the deterministic sample of an in-process search, and carry ids, keys and texts."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

from madr.config import StageConfig
from madr.modeling.model import BiEncoder
from madr.search.sharded import ShardedIndex
from madr.training.loop import catalog_sampler, stage_negatives
from madr.training.negatives import read_index_negatives
from pipelines.encode.job import run_encode
from pipelines.evaluate.searcher import SearchSpec, search_texts
from pipelines.mine.job import MineConfig, run_mine, sample_negatives
from pipelines.train.examples import finetune_rows
from tests.pipelines.test_encode import encode_config, make_corpus, make_model


@pytest.fixture(scope="module")
def setup(tmp_path_factory, tokenizer):
    base = tmp_path_factory.mktemp("mine")
    catalog, table = make_corpus(base / "docs", n=1000)
    model = make_model(base / "bibert", tokenizer, "bibert")
    run_encode(encode_config(base / "docs", base / "index", model, num_shards=2), local=True, log=lambda _: None)
    queries = catalog.queries[:30]
    pq.write_table(pa.table({"query_id": [q.query_id for q in queries], "text": [q.text for q in queries]}),
                   base / "queries.parquet")
    pq.write_table(pa.table({"query_id": [j.query_id for j in catalog.judgments],
                             "doc_id": [j.product_id for j in catalog.judgments],
                             "relevance": [j.relevance for j in catalog.judgments]}), base / "positives.parquet")
    return base, catalog, table


@pytest.fixture(scope="module")
def mined(ray_local, setup):
    """(config, output path) of one mining run over the setup's index."""
    base, _, _ = setup
    cfg = MineConfig(queries=str(base / "queries.parquet"), positives=str(base / "positives.parquet"),
                     run=SearchSpec(index=str(base / "index")), output=str(base / "neg.parquet"),
                     doc_key="product_id", min_relevance=2, rank_min=3, rank_max=40, num_negatives=5, seed=1,
                     text_column="title", batch_size=8)
    return cfg, run_mine(cfg, log=lambda _: None)


@pytest.mark.ray
def test_mining_job(mined, setup):
    base, catalog, table = setup
    cfg, path = mined
    out = pq.read_table(path).to_pylist()
    id_of = dict(zip(table.column("product_id").to_pylist(), table.column("doc_id").to_pylist(), strict=True))
    title_of = dict(zip(table.column("doc_id").to_pylist(), table.column("title").to_pylist(), strict=True))
    positives: dict[str, set[int]] = {}
    for j in catalog.judgments:
        if j.relevance >= 2:
            positives.setdefault(j.query_id, set()).add(id_of[j.product_id])
    asked = {q.query_id: q.text for q in catalog.queries[:30]}
    assert {r["query_id"] for r in out} == {q for q in asked if q in positives}  # queries with a positive
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        index = ShardedIndex.open(base / "index")
        model = BiEncoder.load(index.manifest.model_dir).eval()
        scores, ids = search_texts(model, index, [r["query"] for r in out], 40, cfg.run)
    finally:
        torch.set_num_threads(threads)
    for r, s_row, i_row in zip(out, scores, ids, strict=True):
        pos = positives[r["query_id"]]
        assert set(r["positive_ids"]) == pos
        neg = np.array(r["negative_ids"])
        assert not (set(neg.tolist()) & pos), "a positive was sampled as a negative"
        assert all(3 <= k <= 40 for k in r["negative_ranks"]) and r["negative_ranks"] == sorted(r["negative_ranks"])
        ranked = i_row.tolist()
        assert [ranked.index(n) + 1 for n in neg] == r["negative_ranks"]  # ranks are positions in the results
        n_cand = sum(1 for rank, d in enumerate(ranked, 1) if 3 <= rank <= 40 and d not in pos)
        assert len(neg) == min(5, n_cand)
        exp = sample_negatives(i_row, s_row, pos, cfg, r["query_id"])[0]
        assert neg.tolist() == exp.tolist()  # the seeded per-query sample, whatever the batching
        assert r["negative_keys"] == [table.column("product_id")[(n - 5) // 7].as_py() for n in neg]
        assert r["negative_texts"] == [title_of[n] for n in neg]


@pytest.mark.ray
def test_finetuning_reads_the_mined_file(mined, setup, tokenizer):
    """`train.finetune.negatives: index`: the fine-tuning sampler's hard negatives are the mine stage's negatives
    of each query (by product id), in the in-process loop as in the Ray job's rows."""
    _, catalog, _ = setup
    _, path = mined
    rows = pq.read_table(path).to_pylist()
    negatives = read_index_negatives(path)
    assert negatives == {r["query_id"]: r["negative_keys"] for r in rows} and any(negatives.values())
    stage = StageConfig(negatives="index")
    sampler = catalog_sampler(catalog, stage, tokenizer, seed=0, index_negatives=path)
    by_text = {q.text: q.query_id for q in catalog.queries}
    drawn = [ex for _ in range(20) for ex in sampler.finetune_batch(8) if negatives.get(by_text[ex.query])]
    assert drawn, "no sampled query has mined negatives"
    for ex in drawn:
        texts = {catalog.product_text(sampler.by_id[p]) for p in negatives[by_text[ex.query]]}
        assert ex.negative in texts and ex.negative_relevance == 0.0
    ray_rows = [r for r in finetune_rows(catalog, 0, mined=stage_negatives(catalog, stage, tokenizer, "train", path))
                if negatives.get(by_text[r["query"]])]
    assert ray_rows, "no Ray fine-tuning row has a query with mined negatives"
    for r in ray_rows:
        texts = {catalog.product_text(sampler.by_id[p]) for p in negatives[by_text[r["query"]]]}
        assert r["negative"] in texts and r["negative_relevance"] == 0.0


def test_sample_negatives_rank_range_and_determinism():
    cfg = MineConfig(rank_min=2, rank_max=6, num_negatives=2, seed=7)
    ids = np.array([10, 11, 12, 13, 14, 15, 16, -1])
    scores = np.linspace(1, 0, 8).astype(np.float32)
    a = sample_negatives(ids, scores, {12}, cfg, "q1")
    b = sample_negatives(ids, scores, {12}, cfg, "q1")
    assert a[0].tolist() == b[0].tolist() and len(a[0]) == 2
    assert set(a[0].tolist()) <= {11, 13, 14, 15} and all(2 <= r <= 6 for r in a[1])
    everything = sample_negatives(ids, scores, {12}, MineConfig(rank_min=2, rank_max=6, num_negatives=10), "q1")
    assert everything[0].tolist() == [11, 13, 14, 15]
    with pytest.raises(ValueError, match="rank_min <= rank_max"):
        MineConfig(rank_min=5, rank_max=2)


def test_mine_cli_config():
    """``--index`` replaces the index of the YAML's ``run`` section and keeps its nprobe; a missing input
    is named."""
    from pathlib import Path

    from pipelines.mine.cli import build_parser, load_config, main

    yaml_path = Path(__file__).resolve().parents[2] / "configs" / "encode.yaml"
    cfg = load_config(build_parser().parse_args(["--config", str(yaml_path), "--index", "/x/idx", "--rank-max", "50",
                                                 "--num-negatives", "4"]))
    assert (cfg.run.index, cfg.run.search.nprobe, cfg.rank_min, cfg.rank_max, cfg.num_negatives) == \
        ("/x/idx", 16, 10, 50, 4)
    with pytest.raises(ValueError, match="missing positives, index"):
        load_config(build_parser().parse_args(["--queries", "q.parquet"]))
    with pytest.raises(ValueError, match="rank_min <= rank_max"):
        load_config(build_parser().parse_args(["--config", str(yaml_path), "--rank-max", "5"]))
    assert main(["--queries", "q.parquet"]) == 1
