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


def _dotted(mapping: dict, prefix: str = "") -> dict:
    out = {}
    for key, value in mapping.items():
        if isinstance(value, dict) and value:
            out.update(_dotted(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out


# what configs/demo.yaml may change of the recommended recipe (configs/product_search.yaml) to run in minutes on
# 2 CPU cores on generated data: sizes, steps, lengths, frozen layers, validation, and the synthetic grades
DEMO_SIZE_KEYS = {"name", "output_dir", "data.catalog_dir", "data.clicks", "data.synthetic_products",
                  "data.synthetic_queries", "data.seed", "data.languages", "model.max_query_length",
                  "model.max_doc_length", "train.finetune.steps", "train.finetune.batch_size",
                  "train.finetune.learning_rate", "train.finetune.freeze_layers", "train.finetune.log_every",
                  "train.finetune.checkpoint_every", "distributed.val_corpus", "distributed.max_failures",
                  "eval.retrieval_metrics", "eval.rerank_metrics", "eval.relevance_threshold", "eval.top_k"}


def test_demo_config_is_the_recommended_recipe_at_demo_size():
    """`make demo` runs configs/product_search.yaml's recipe: the same model, objective, index and references,
    only sized down (DEMO_SIZE_KEYS)."""
    demo, recipe = (read_mapping(ROOT / "configs" / f"{n}.yaml") for n in ("demo", "product_search"))
    flat_demo, flat_recipe = _dotted(demo), _dotted(recipe)
    differ = {k for k in flat_demo.keys() | flat_recipe.keys() if flat_demo.get(k) != flat_recipe.get(k)}
    assert differ <= DEMO_SIZE_KEYS, f"configs/demo.yaml departs from the recipe in {sorted(differ - DEMO_SIZE_KEYS)}"
    cfg = load_config(ROOT / "configs" / "demo.yaml")
    assert cfg.model.name == "bibert" and cfg.model.backbone.name_or_path == "pypi:multilingual-e5-small"
    assert cfg.train.pretrain.steps == 0 and cfg.train.finetune.negatives == "mined"
    assert cfg.index.lexical == "bm25" and {"bm25", "untrained"} <= set(cfg.eval.references)
    assert set(cfg.data.languages) == {"en", "de", "fr", "es"} and cfg.data.catalog_dir is None
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
