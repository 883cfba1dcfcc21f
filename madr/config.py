"""Experiment configuration: dataclasses loaded from one YAML file.

One file describes one experiment end to end (data, model, training, evaluation). Unknown keys are
errors that name the offending path, so a typo never silently falls back to a default.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

MODEL_NAMES = ("bibert", "mpbert", "mtbert", "dssm", "madr", "madral", "mur", "mural", "hybrid")
FUSIONS = ("weighted_sum", "presence", "cls_gating")
GROUPINGS = ("single", "granularity", "aspect")


@dataclass
class BackboneConfig:
    """Which HF encoder a tower runs on.

    `name_or_path` is a local directory or a hub name (hub names only work where the hub is
    reachable). When it is None a tiny randomly initialised BERT is built from `tiny` (tests, demo
    without a download). `num_layers` truncates the encoder to its first k layers.
    """

    name_or_path: str | None = None
    num_layers: int | None = None
    tiny: dict[str, int] = field(
        default_factory=lambda: {"hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 2,
                                 "intermediate_size": 128, "max_position_embeddings": 128}
    )


@dataclass
class ModelConfig:
    """A bi-encoder from the two aspect papers, selected by `name` (paper 000 Sec. 8.2, paper 001 Sec. 5.2).

    bibert: CLS; mpbert: first `len(aspects) + use_other` token encodings fused by `fusion`;
    mtbert: CLS that also predicts every aspect; dssm: bag of wordpieces -> MLP;
    madr/madral: Aspect Extraction Network + fusion, madral with aspect learning;
    mur/mural: aspect tokens after CLS + CLS-gating, mural with multi-granularity aspect learning;
    hybrid: SPLADE sparse vector from the MLM head + CLS dense vector (paper 002).
    """

    name: str = "madral"
    backbone: BackboneConfig = field(default_factory=BackboneConfig)
    shared_towers: bool = False
    projection_dim: int | None = None
    aspects: list[str] = field(default_factory=lambda: ["category", "brand", "color"])
    use_other: bool = True
    fusion: str = "presence"
    granularities: list[str] = field(default_factory=lambda: ["phrase", "word", "token"])
    grouping: str = "single"
    value_embeddings: str = "unshared"
    similarity: str = "cosine"
    temperature: float = 0.05
    max_query_length: int = 32
    max_doc_length: int = 128
    dssm_hidden: list[int] = field(default_factory=lambda: [256, 128])
    vocab_min_freq: int = 1
    sparse_top_k: int | None = 256
    sparse_pooling: str = "max"
    hybrid_lambda: float = 0.5

    def __post_init__(self) -> None:
        _check_choice("model.name", self.name, MODEL_NAMES)
        _check_choice("model.fusion", self.fusion, FUSIONS)
        _check_choice("model.grouping", self.grouping, GROUPINGS)
        _check_choice("model.value_embeddings", self.value_embeddings, ("shared", "unshared"))
        _check_choice("model.similarity", self.similarity, ("cosine", "dot"))
        _check_choice("model.sparse_pooling", self.sparse_pooling, ("max", "sum"))
        if not 0.0 <= self.hybrid_lambda <= 1.0:
            raise ValueError(f"model.hybrid_lambda must be in [0, 1], got {self.hybrid_lambda}")
        for g in self.granularities:
            _check_choice("model.granularities", g, ("phrase", "word", "token"))

    @property
    def aspect_learning(self) -> bool:
        """True for the models trained with aspect annotations (MtBERT, MADRAL, MURAL)."""
        return self.name in ("mtbert", "madral", "mural")

    @property
    def uses_granularities(self) -> bool:
        return self.name in ("mur", "mural")


@dataclass
class DataConfig:
    """Where the catalog comes from: a directory in the `madr.data.schema` layout, or the generator."""

    catalog_dir: str | None = None
    synthetic_products: int = 1500
    synthetic_queries: int = 500
    seed: int = 0
    tokenizer: str | None = None
    tokenizer_vocab_size: int = 3000


@dataclass
class StageConfig:
    """One training stage (pretrain: Eq. 7 / MURAL Eq. 9; finetune: Eq. 8 / MURAL Eq. 10)."""

    steps: int = 100
    batch_size: int = 32
    learning_rate: float = 5e-4
    weight_decay: float = 0.01
    warmup_ratio: float = 0.1
    aspect_weight: float = 1.0
    pointwise_weight: float = 1.0
    hard_negatives: int = 1
    mlm_probability: float = 0.15
    sparse_temperature: float = 1.0
    flops_query_weight: float = 5e-3
    flops_doc_weight: float = 1e-3
    flops_warmup_steps: int = 0
    log_every: int = 20


@dataclass
class TrainConfig:
    seed: int = 0
    pretrain: StageConfig = field(default_factory=lambda: StageConfig(steps=100, aspect_weight=1.0))
    finetune: StageConfig = field(default_factory=lambda: StageConfig(steps=150, aspect_weight=0.1))


@dataclass
class EvalConfig:
    """Paper 000 Sec. 8.3: retrieval metrics over the whole corpus (Recall@k), ranking metrics by
    re-ranking each query's judged documents (NDCG@5 with gain 2^rel - 1, per-query AUC), and aspect
    Accuracy@1 (Table 5)."""

    retrieval_metrics: list[str] = field(default_factory=lambda: ["recall@10", "recall@50", "mrr@10"])
    rerank_metrics: list[str] = field(default_factory=lambda: ["ndcg@5", "auc"])
    split: str = "test"
    gains: str = "exp2"
    relevance_threshold: float = 3.0
    top_k: int = 100


@dataclass
class ExperimentConfig:
    name: str = "demo"
    output_dir: str = "runs/demo"
    data: DataConfig = field(default_factory=DataConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def save(self, path: str | Path) -> None:
        Path(path).write_text(yaml.safe_dump(self.to_dict(), sort_keys=False))


def _check_choice(where: str, value: str, choices: tuple[str, ...]) -> None:
    if value not in choices:
        raise ValueError(f"{where}: {value!r} is not one of {', '.join(choices)}")


def from_dict(cls: type, data: dict[str, Any] | None, where: str = "") -> Any:
    """Build dataclass `cls` from a plain dict, recursing into nested dataclasses.

    Unknown keys raise a ValueError naming their dotted path.
    """
    data = dict(data or {})
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls)}
    unknown = sorted(set(data) - set(fields))
    if unknown:
        raise ValueError(f"unknown config key(s) {', '.join(where + k for k in unknown)}; "
                         f"known: {', '.join(sorted(fields))}")
    kwargs = {}
    for name, value in data.items():
        target = _dataclass_in(hints[name])
        if target is not None and isinstance(value, dict):
            value = from_dict(target, value, f"{where}{name}.")
        kwargs[name] = value
    return cls(**kwargs)


def _dataclass_in(hint: Any) -> type | None:
    if dataclasses.is_dataclass(hint):
        return hint
    if isinstance(hint, types.UnionType) or typing.get_origin(hint) is typing.Union:
        for arg in typing.get_args(hint):
            if dataclasses.is_dataclass(arg):
                return arg
    return None


def load_config(path: str | Path | None = None, overrides: dict[str, Any] | None = None) -> ExperimentConfig:
    """Load an experiment YAML (or the embedded defaults when `path` is None), then apply overrides.

    Overrides use dotted keys: `{"model.name": "mural", "train.finetune.steps": 10}`.
    """
    data: dict[str, Any] = {}
    if path is not None:
        text = Path(path).read_text()
        data = yaml.safe_load(text) or {}
        if not isinstance(data, dict):
            raise ValueError(f"{path}: top level must be a mapping, got {type(data).__name__}")
    for key, value in (overrides or {}).items():
        node = data
        *parents, leaf = key.split(".")
        for p in parents:
            node = node.setdefault(p, {})
        node[leaf] = value
    return from_dict(ExperimentConfig, data)


def config_hash(obj: Any) -> str:
    """A short stable hash of a config (dataclass or dict), for manifests and cache keys."""
    if dataclasses.is_dataclass(obj):
        obj = dataclasses.asdict(obj)
    blob = json.dumps(obj, sort_keys=True, default=str).encode()
    return hashlib.sha256(blob).hexdigest()[:16]
