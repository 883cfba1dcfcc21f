"""benchmarks.speed.pipeline_vs_peer, the peer side alone at tiny scale: the session's generated catalog written in the
madr.data.schema layout, a random tiny BERT (with the session's WordPiece tokenizer) as both the backbone and the
BM25 tokenizer, 2 fine-tuning steps: every stage is timed, the fusion is chosen on the grid, every test metric lies
in [0, 1], and a second call reuses the side's result JSON instead of rerunning it (slow); and the peer's fusion
against madr's weighted_fusion (fast)."""

from __future__ import annotations

import json

import pytest

from tests.benchmarks.tiny_backbone import save_tiny_bert


@pytest.mark.slow
def test_peer_side_times_every_stage(catalog, tokenizer, tmp_path):
    from benchmarks.speed import pipeline_vs_peer as bench

    catalog.write(tmp_path / "catalog")
    bert = save_tiny_bert(tmp_path / "bert", tokenizer)
    sets = [f"model.backbone.name_or_path={bert}", f"index.lexical_tokenizer={bert}",
            "train.finetune.batch_size=8", "train.finetune.freeze_layers=1"]
    argv = ["--catalog", str(tmp_path / "catalog"), "--steps", "2", "--only", "peer", "--out-dir",
            str(tmp_path / "out"), *[a for kv in sets for a in ("--set", kv)]]
    peer = bench.main(argv)["peer"]

    assert set(peer["stages"]) == set(bench.STAGES)
    assert all(v["seconds"] > 0 and v["peak_rss_gib"] > 0 for v in peer["stages"].values())
    assert peer["total_s"] == pytest.approx(sum(v["seconds"] for v in peer["stages"].values()))
    assert len(peer["losses"]) == 2
    assert peer["fusion"]["normalisation"] in ("minmax", "zscore") and 0.0 <= peer["fusion"]["lam"] <= 1.0
    assert set(peer["metrics"]) == {"fused", "dense", "bm25"}
    for values in peer["metrics"].values():
        assert {"recall@10", "recall@100", "recall@1000", "mrr@10"} <= set(values)
        assert all(0.0 <= v <= 1.0 for v in values.values())
    saved = list((tmp_path / "out" / "results").glob("pipeline_vs_peer-peer-*.json"))
    assert len(saved) == 1 and json.loads(saved[0].read_text())["stages"] == peer["stages"]

    again = bench.main(argv)["peer"]  # resumable: the same settings reuse the side's JSON
    assert again["stages"] == peer["stages"]


def test_fuse_matches_madr_weighted_fusion():
    """The peer's few lines of fusion rank as madr.search.score_fusion.weighted_fusion does."""
    import numpy as np

    from benchmarks.common.peer import fuse
    from madr.search.score_fusion import weighted_fusion

    rng = np.random.default_rng(0)
    dense_ids, bm25_ids = rng.choice(50, 20, replace=False), rng.choice(50, 15, replace=False)
    dense_s, bm25_s = np.sort(rng.random(20))[::-1], np.sort(rng.random(15) * 10)[::-1]
    for how in ("minmax", "zscore"):
        for lam in (0.0, 0.3, 1.0):
            rows, scores = fuse((dense_ids, dense_s), (bm25_ids, bm25_s), lam, how, 10)
            ref_s, ref_ids = weighted_fusion([(dense_s[None], dense_ids[None]), (bm25_s[None], bm25_ids[None])],
                                             [lam, 1 - lam], 10, how)
            assert rows.tolist() == ref_ids[0].tolist()
            np.testing.assert_allclose(scores, ref_s[0], rtol=1e-5, atol=1e-6)


def test_node_settings_are_keys_the_pipeline_config_takes():
    """`--nodes`: the settings that spread the stages over the worker nodes load with the pipeline's config (a
    wrong key or value fails there), one training worker and one encode actor per node."""
    from benchmarks.speed.pipeline_vs_peer import CONFIG, ROOT, node_sets
    from madr.config import load_config
    from madr.config_overrides import parse_overrides

    cfg = load_config(ROOT / CONFIG, parse_overrides(node_sets(2, 2, 1)))  # checks the sections' keys and values
    d = cfg.distributed
    assert (d["num_workers"], d["cpus_per_worker"], d["torch_threads"], d["placement_strategy"]) == (
        2, 1, 1, "STRICT_SPREAD")
    assert cfg.encode["encode_actors"] == 2 and cfg.encode["spread_actors"] is True
    with pytest.raises(ValueError, match="distributed"):
        load_config(ROOT / CONFIG, parse_overrides([*node_sets(2, 2, 1), "distributed.placement_strategy=ROUND"]))
