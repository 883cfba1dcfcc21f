"""benchmarks.quality.pipeline_ab: two settings of the pipeline, one run per seed each, scored per query from their
TREC runs and paired within each seed and over the seed means."""

from __future__ import annotations

import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import yaml

from benchmarks.quality.pipeline_ab import compare, main


def _run(tmp_path, name: str, model: str, fused: dict[str, str], dense: dict[str, str]):
    """A pipeline output_dir: qrels (q1 -> a, q2 -> c relevant), TREC runs whose
    top product per query is given, the evaluate marker naming its config and a tune record."""
    out = tmp_path / name
    for sub in ("data/eval", "evaluation", "_stages", "tune"):
        (out / sub).mkdir(parents=True)
    pq.write_table(pa.table({"query_id": ["q1", "q1", "q2"], "product_id": ["a", "b", "c"],
                             "relevance": [4, 0, 3]}), out / "data" / "eval" / "qrels.parquet")
    for run, tops in ((model, fused), (f"{model}-dense", dense)):
        (out / "evaluation" / f"{run}.trec").write_text(
            "".join(f"{q} Q0 {d} 1 0.9 {run}\n{q} Q0 z 2 0.1 {run}\n" for q, d in tops.items()))
    config = tmp_path / f"{name}.yaml"
    config.write_text(yaml.safe_dump({"model": {"name": model}, "eval": {"relevance_threshold": 3.0}}))
    (out / "_stages" / "evaluate.done.json").write_text(json.dumps({"config": str(config)}))
    (out / "tune" / "fusion.json").write_text(json.dumps({"lam": 0.6, "score": 0.5, "grid": [1, 2]}))
    return out


def test_two_settings_pair_per_query_within_each_seed_and_over_the_seed_means(tmp_path):
    hit = {"q1": "a", "q2": "c"}
    a = [_run(tmp_path, "a0", "madral", hit, {"q1": "a", "q2": "x"}),
         _run(tmp_path, "a1", "madral", {"q1": "a", "q2": "x"}, hit)]
    b = [_run(tmp_path, "b0", "bibert", {"q1": "x", "q2": "x"}, hit),
         _run(tmp_path, "b1", "bibert", {"q1": "x", "q2": "c"}, hit)]
    result = compare(a, b, ["mrr@10"], draws=200)
    fused = result["pairs"]["fused"]
    assert fused["runs"] == ["madral", "bibert"]
    s0, s1, mean = (fused["rows"][k]["mrr@10"] for k in ("seed 0", "seed 1", "seed mean"))
    assert (s0["a"], s0["b"], s0["diff"], s0["n"]) == (1.0, 0.0, 1.0, 2)
    assert (s1["a"], s1["b"], s1["diff"]) == (0.5, 0.5, 0.0)
    # per query over the seeds: A q1 1, q2 0.5; B q1 0, q2 0.5
    assert (mean["a"], mean["b"], mean["diff"], mean["n"]) == (0.75, 0.25, 0.5, 2)
    dense = result["pairs"]["encoder alone"]["rows"]["seed mean"]["mrr@10"]
    assert dense["diff"] == pytest.approx(-0.25)
    assert result["dev_fusion"]["a"][0] == {"lam": 0.6, "score": 0.5}, "the tune record without its grid"


def test_the_command_writes_its_table_and_refuses_unequal_seeds(tmp_path):
    hit = {"q1": "a", "q2": "c"}
    a, b = _run(tmp_path, "a", "madral", hit, hit), _run(tmp_path, "b", "bibert", hit, hit)
    assert main(["--a", str(a), "--b", str(b), "--metrics", "recall@10", "--draws", "100",
                 "--out-dir", str(tmp_path / "out"), "--tag", "ab"]) == 0
    written = json.loads((tmp_path / "out" / "results" / "ab.json").read_text())
    assert "seed mean" not in written["pairs"]["fused"]["rows"], "one seed: nothing to average"
    assert "| fused | seed 0 | 1.0000 / 1.0000, +0.0000" in written["table"]
    with pytest.raises(SystemExit):
        main(["--a", str(a), str(a), "--b", str(b)])


def test_dev_scores_each_query_as_the_fine_tuning_validation_does(tmp_path, catalog, tokenizer):
    """`--dev`: a run's fine-tuned encoder over its validation catalog, per query; the means are the validation's
    own numbers (`evaluate_model` on `validation_catalog`), and the second call reads the cache."""
    import torch

    from benchmarks.quality.pipeline_ab import dev_per_query
    from madr.config import EvalConfig, load_config
    from madr.modeling.model import build_model
    from madr.recipes.aspects.evaluation import evaluate_model
    from pipelines.train.loop import validation_catalog

    catalog.write(tmp_path / "catalog")
    run = tmp_path / "run"
    cfg = load_config(None, {"name": "t", "output_dir": str(run), "data.catalog_dir": str(tmp_path / "catalog"),
                             "model.name": "bibert", "model.aspects": catalog.aspect_names,
                             "model.backbone.tiny": {"hidden_size": 16, "num_hidden_layers": 1,
                                                     "num_attention_heads": 2, "intermediate_size": 32},
                             "distributed.val_corpus": 120, "train.seed": 3})
    (run / "_stages").mkdir(parents=True)
    config = run / "exp.yaml"
    cfg.save(config)
    torch.manual_seed(0)
    model = build_model(cfg.model, tokenizer, None)
    model.save(run / "finetune" / "model")
    (run / "_stages" / "finetune.done.json").write_text(json.dumps({"config": str(config), "run_id": "r1"}))
    metrics = ["recall@10", "mrr@10"]
    _, per_query = dev_per_query(run, metrics)
    held = validation_catalog(catalog, "dev", 120, 3)
    expected = evaluate_model(model.eval(), held, EvalConfig(split="dev", retrieval_metrics=metrics,
                                                             rerank_metrics=["auc"], top_k=cfg.eval.top_k,
                                                             relevance_threshold=cfg.eval.relevance_threshold,
                                                             gains=cfg.eval.gains))
    assert set(per_query["recall@10"]) == {q.query_id for q in held.queries_in("dev")}
    for m in metrics:
        assert sum(per_query[m].values()) / len(per_query[m]) == pytest.approx(expected[m])
    (run / "finetune" / "model" / "config.json").unlink()  # a second call must not load the model again
    assert dev_per_query(run, metrics)[1] == per_query
    (run / "_stages" / "finetune.done.json").write_text(json.dumps({"config": str(config), "run_id": "r2"}))
    with pytest.raises(ValueError, match="not a madr model directory"):  # fine-tuned again: the cache is stale
        dev_per_query(run, metrics)
