"""The product-QA experiment's YAML (`configs/pqa_synthetic.yaml`, `configs/real/hetpqa.yaml`): data, model,
training stages, the representations to train, seeds and evaluation settings."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from madr.config import ModelConfig, StageConfig, load_dataclass
from madr.search.params import NORMALISATIONS

REPRESENTATIONS = ("hybrid", "dense", "sparse")


def _hybrid_model_config() -> ModelConfig:
    return ModelConfig(name="hybrid", shared_towers=True, similarity="dot", sparse_top_k=256, max_query_length=32,
                       max_doc_length=48)


@dataclass
class PQADataConfig:
    """`madr.data.synthetic.pqa.generate_pqa` arguments and the WordPiece size for a from-scratch backbone."""

    products: int = 300
    questions: int = 1500
    seed: int = 0
    tokenizer_vocab_size: int = 3000


@dataclass
class PQAEvalConfig:
    """Lambda grid step, normalisations tried on dev, the prior's hit-rate cutoff, encoding batch size."""

    lambda_step: float = 0.05
    normalisations: list[str] = field(default_factory=lambda: list(NORMALISATIONS))
    prior_k: int = 5
    batch_size: int = 128

    def __post_init__(self) -> None:
        if not 0 < self.lambda_step <= 1:
            raise ValueError(f"eval.lambda_step must be in (0, 1], got {self.lambda_step}")
        bad = [n for n in self.normalisations if n not in NORMALISATIONS]
        if bad or not self.normalisations:
            raise ValueError(f"eval.normalisations: {bad or 'empty'}; choose from {', '.join(NORMALISATIONS)}")

    @property
    def grid(self) -> tuple[float, ...]:
        n = round(1 / self.lambda_step)
        return tuple(round(min(1.0, i * self.lambda_step), 6) for i in range(n + 1))


@dataclass
class PQAConfig:
    """One synthetic product-QA experiment (`configs/pqa_synthetic.yaml`): data, model, training, evaluation.

    `representations`: which models to train (each once per seed): "hybrid" is required, "dense" and
    "sparse" are the independently trained single-representation baselines. `pretrain` (MLM warm-up) is
    skipped when None or 0 steps.
    """

    name: str = "pqa_synthetic"
    data: PQADataConfig = field(default_factory=PQADataConfig)
    model: ModelConfig = field(default_factory=_hybrid_model_config)
    pretrain: StageConfig | None = None
    finetune: StageConfig = field(default_factory=lambda: StageConfig(steps=300, batch_size=32, learning_rate=5e-4))
    representations: list[str] = field(default_factory=lambda: list(REPRESENTATIONS))
    seeds: list[int] = field(default_factory=lambda: [0])
    eval: PQAEvalConfig = field(default_factory=PQAEvalConfig)

    def __post_init__(self) -> None:
        if not self.model.has_sparse:
            raise ValueError(f"model.name must be 'hybrid' for product-QA evidence ranking, got {self.model.name!r}")
        bad = [r for r in self.representations if r not in REPRESENTATIONS]
        if bad or "hybrid" not in self.representations:
            raise ValueError(f"representations must include 'hybrid' and be among {REPRESENTATIONS}, got "
                             f"{self.representations}")
        if not self.seeds:
            raise ValueError("seeds is empty; give at least one seed")


def load_pqa_config(path: str | Path | None = None, overrides: dict[str, Any] | None = None) -> PQAConfig:
    """Load a PQA experiment YAML (defaults when None), then dotted overrides like `{"finetune.steps": 50}`.
    Unknown keys are errors naming their path (`madr.config.from_dict`)."""
    return load_dataclass(PQAConfig, path, overrides)
