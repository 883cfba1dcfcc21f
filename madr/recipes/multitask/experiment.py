"""The multilingual multi-task experiment of paper 004 in process: data -> tokenizer -> encoders -> Table III.

Steps (`run_multitask_experiment`):

1. Data (`build_data`): a position-biased click log over a synthetic catalog (train queries give the
   training clicks; held-out queries keep every shown document with the catalog's graded relevance), NLI
   pairs and WikiMatrix-like parallel pairs (score-filtered at the WikiMatrix threshold), each with a held-out
   set drawn from another seed and cleared of pairs seen in training.
2. Tokenizer: the backbone's own, a given one, or a WordPiece trained on the training text only
   (lowercased, accents kept, no alphabet limit: Latin, Cyrillic, CJK and Arabic survive).
3. Encoders, all from the same initial weights (same seed): the untrained encoder, the multi-task encoder
   (`tasks.enabled`, the schedule of Sec. III-B) and the single-task click-only encoder (`tasks.baseline`)
   with the same number of steps, the same optimiser and batch size.
4. The query tower of the multi-task encoder distilled into a `student.num_layers`-layer student with an
   L2 loss (Sec. V-A), served with the teacher's document tower (`madr.training.distill.attach_query_student`).
5. Evaluation on held-out data (`encoder_metrics`), the columns of paper 004 Table III plus cross-lingual
   retrieval:
   * click relevance: NDCG@k of each held-out query's shown documents re-ranked by the model, graded by the
     catalog's ground truth (unbiased, like the paper's judged relevance set), exp2 gains; a document is its
     fields concatenated, or with `tasks.click.field_attention` its fields attended by the query (Sec. IV,
     Eq. 8-9; the encoder holds the attention, the click task trains it: `click_pair_scores`);
   * NLI ROC AUC with the cosine as the score (Table III "SNLI / XNLI Val. RoC"): entailment vs neutral
     (the two classes Eq. 2 trains on), English pairs ("SNLI-like") and the other languages ("XNLI-like");
     plus entailment vs neutral + contradiction over all languages;
   * cross-lingual top-1: each held-out non-English sentence retrieves its English translation among all
     held-out English sentences (cosine), averaged over the languages.
   Training-free baselines (`baseline_rows`): random scores, the logged old-ranker order, token-level BM25 on
   the tokenizer's word pieces (paper 004 Sec. VI-D) and minimum edit distance; like the paper, they get no
   NLI AUC (their scores are relative to a query, not a calibrated similarity).

Texts go through the query side (click queries, NLI hypotheses, non-English sentences) or the doc side
(documents, premises, English sentences), so the distilled student is evaluated exactly where it serves.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from transformers import PreTrainedTokenizerBase

from madr.config import ModelConfig
from madr.data.records import ClickRecord, MultilingualData, NLIRecord, ParallelRecord
from madr.data.synthetic.catalog import generate_catalog
from madr.data.synthetic.multilingual import (
    click_log_from_catalog,
    filter_parallel,
    generate_nli,
    generate_parallel,
)
from madr.losses import NLICosineLoss, TranslationLoss, TripletLoss
from madr.metrics import evaluate, roc_auc
from madr.modeling.heads.field_attention import concat_fields
from madr.modeling.model import BiEncoder
from madr.modeling.tokenization import load_tokenizer, train_wordpiece_tokenizer
from madr.recipes.multitask.config import MultiTaskExperimentConfig
from madr.recipes.multitask.tasks import ClickTask, NLITask, SideTokenizer, TranslationTask
from madr.recipes.multitask.trainer import MultiTaskTrainer
from madr.search.edit_distance import edit_distance_scores
from madr.search.sparse import BM25Index
from madr.training.distill import attach_query_student, distill, make_student, student_teacher_distance

log = logging.getLogger(__name__)

DOC_SEP = " "  # fields joined for the click documents (the tokenizer has no use for a literal "[SEP]" text)
HELD_OUT_SEED_OFFSET = 1_000_003
UNTRAINED = "Untrained encoder"


# ------------------------------------------------------------------------------------------------ data


def build_data(cfg: MultiTaskExperimentConfig) -> MultilingualData:
    """The three synthetic sources with their train / held-out splits (see `MultilingualDataConfig`)."""
    d = cfg.data
    catalog = generate_catalog(d.click_products, d.click_queries, seed=d.seed, languages=d.click_languages)
    log_records = click_log_from_catalog(catalog, d.docs_per_query, d.seed, d.position_bias, d.ranker_noise,
                                         d.click_noise, d.impressions_per_query)
    split = {q.query_id: q.split for q in catalog.queries}
    clicks_train = [r for r in log_records if split[r.query_id] == "train"]
    clicks_eval = [r for r in log_records if split[r.query_id] == d.eval_split]
    held_seed = d.seed + HELD_OUT_SEED_OFFSET
    nli_train = generate_nli(d.nli_train, d.nli_languages, seed=d.seed)
    seen_pairs = {(r.premise, r.hypothesis) for r in nli_train}
    nli_eval = [r for r in generate_nli(d.nli_eval, d.nli_languages, seed=held_seed)
                if (r.premise, r.hypothesis) not in seen_pairs]
    parallel = generate_parallel(d.parallel_train, d.parallel_languages, seed=d.seed, noise_rate=d.parallel_noise_rate)
    if d.parallel_threshold is not None:
        parallel = filter_parallel(parallel, d.parallel_threshold)
    seen_english = {r.target for r in parallel}
    parallel_eval = [r for r in generate_parallel(d.parallel_eval, d.parallel_languages, seed=held_seed, noise_rate=0.0)
                     if r.target not in seen_english]
    data = MultilingualData(clicks_train, clicks_eval, nli_train, nli_eval, parallel, parallel_eval)
    _check_data(data)
    return data


def _check_data(data: MultilingualData) -> None:
    empty = [name for name, n in data.sizes().items() if n == 0]
    if empty:
        raise ValueError(f"multitask data: empty set(s) {empty}; raise the data sizes in the config")


def doc_text(record: ClickRecord, order: Sequence[str]) -> str:
    """The click document as one text: its fields in `order` (concatenation, paper 004 Sec. IV)."""
    return concat_fields(record.fields, order, DOC_SEP)


def training_texts(data: MultilingualData, order: Sequence[str]) -> list[str]:
    """Every training text (never a held-out one): what an in-process tokenizer is trained on."""
    texts = [r.query for r in data.clicks_train] + [doc_text(r, order) for r in data.clicks_train]
    texts += [t for r in data.nli_train for t in (r.premise, r.hypothesis)]
    return texts + [t for r in data.parallel_train for t in (r.source, r.target)]


def query_side_texts(data: MultilingualData) -> list[str]:
    """Training texts that go through the query tower: what the student is distilled on."""
    texts = [r.query for r in data.clicks_train] + [r.hypothesis for r in data.nli_train]
    texts += [r.premise for r in data.nli_train] + [r.source for r in data.parallel_train]
    return list(dict.fromkeys(texts + [r.target for r in data.parallel_train]))


def held_out_query_texts(data: MultilingualData) -> list[str]:
    texts = [r.query for r in data.clicks_eval] + [r.hypothesis for r in data.nli_eval]
    return list(dict.fromkeys(texts + [r.source for r in data.parallel_eval]))


# ------------------------------------------------------------------------------------------------ model


def build_tokenizer(cfg: MultiTaskExperimentConfig, data: MultilingualData, out_dir: Path) -> PreTrainedTokenizerBase:
    """The configured tokenizer, the backbone's own, or a WordPiece trained on the training text."""
    m = cfg.model
    if m.tokenizer:
        return load_tokenizer(m.tokenizer, m.lowercase, m.strip_accents)
    if m.backbone.name_or_path:
        from madr.modeling.backbone import resolve_backbone_path

        return load_tokenizer(resolve_backbone_path(m.backbone.name_or_path))
    return train_wordpiece_tokenizer(training_texts(data, cfg.tasks.click.field_order), m.tokenizer_vocab_size,
                                     lowercase=m.lowercase, strip_accents=m.strip_accents, limit_alphabet=None,
                                     out_dir=str(out_dir / "tokenizer"))


def model_config(cfg: MultiTaskExperimentConfig) -> ModelConfig:
    """One shared encoder (BiBERT-style, CLS or mean `pooling`) truncated to `doc_layers`, projected to
    `projection_dim`."""
    m = cfg.model
    backbone = dataclasses.replace(m.backbone, num_layers=m.doc_layers)
    return ModelConfig(name="bibert", backbone=backbone, shared_towers=True, projection_dim=m.projection_dim,
                       similarity=m.similarity, max_query_length=m.max_query_length, max_doc_length=m.max_doc_length,
                       pooling=m.pooling)


def build_encoder(cfg: MultiTaskExperimentConfig, tokenizer: PreTrainedTokenizerBase, seed: int) -> BiEncoder:
    """The encoder of `model_config`, with the click documents' field attention when `tasks.click` asks for it
    (paper 004 Eq. 8-9; it lives on the model so that it is saved, loaded and used to score with it)."""
    torch.manual_seed(seed)
    return BiEncoder(model_config(cfg), tokenizer, field_attention=cfg.tasks.click.field_attention)


def build_tasks(cfg: MultiTaskExperimentConfig, model: BiEncoder, data: MultilingualData,
                names: Sequence[str], seed: int) -> dict[str, tuple[Any, list[Any]]]:
    """name -> (task, training records) for the tasks in `names`, losses as configured."""
    tok, t = SideTokenizer.from_model(model), cfg.tasks
    generator = torch.Generator().manual_seed(seed)
    triplet = TripletLoss(distance=t.click.distance, margin=t.click.margin, negatives=t.click.negatives,
                          generator=generator)
    every = {
        "click": (ClickTask(tok, loss=triplet, field_order=t.click.field_order, sep=DOC_SEP,
                            field_attention=model.field_attention), data.clicks_train),
        "nli": (NLITask(tok, loss=NLICosineLoss(mapping=t.nli.mapping)), data.nli_train),
        "translation": (TranslationTask(tok, loss=TranslationLoss(t.translation.objective, t.translation.temperature,
                                                                  t.translation.symmetric),
                                        source_side="query"), data.parallel_train),
    }
    return {name: every[name] for name in names}


def train_encoder(cfg: MultiTaskExperimentConfig, tokenizer: PreTrainedTokenizerBase, data: MultilingualData,
                  names: Sequence[str], seed: int) -> tuple[BiEncoder, MultiTaskTrainer]:
    """A fresh encoder (weights from `seed`) trained `cfg.steps` steps on the tasks `names`."""
    model = build_encoder(cfg, tokenizer, seed)
    schedule = dataclasses.replace(cfg.schedule, seed=seed)
    if schedule.weights is not None:
        schedule.weights = {k: v for k, v in schedule.weights.items() if k in names}
    weights = {k: v for k, v in cfg.tasks.loss_weights.items() if k in names}
    trainer = MultiTaskTrainer(model, build_tasks(cfg, model, data, names, seed), schedule=schedule,
                               optimizer=cfg.optimizer, loss_weights=weights)
    trainer.train(cfg.steps)
    model.eval()
    return model, trainer


# ------------------------------------------------------------------------------------------------ metrics


def _embed(model: BiEncoder, texts: Sequence[str], side: str, batch_size: int) -> torch.Tensor:
    """L2-normalised embeddings (cosine is the score of every evaluation here)."""
    return F.normalize(model.encode_texts(list(texts), side, batch_size), dim=-1)


def click_ndcg(scores: np.ndarray, records: Sequence[ClickRecord], ks: Sequence[int]) -> dict[str, float]:
    """NDCG@k (exp2 gains) of every held-out query's shown documents ranked by `scores` (one per record)."""
    run: dict[str, dict[str, float]] = {}
    qrels: dict[str, dict[str, float]] = {}
    for i, (r, s) in enumerate(zip(records, scores, strict=True)):
        if r.relevance is None:
            raise ValueError(f"click record {i} (query {r.query_id!r}, doc {r.doc_id!r}) has no relevance to judge")
        run.setdefault(r.query_id, {})[r.doc_id] = float(s)
        qrels.setdefault(r.query_id, {})[r.doc_id] = float(r.relevance)
    return {f"ndcg@{k}": v for k, v in zip(ks, evaluate(run, qrels, [f"ndcg@{k}" for k in ks]).values(),
                                           strict=True)}


def nli_auc(scores: np.ndarray, records: Sequence[NLIRecord]) -> dict[str, float]:
    """ROC AUC of entailment vs neutral for English and the other languages, and vs everything else."""
    labels = np.array([r.label for r in records])
    english = np.array([r.language == "en" for r in records])
    ent, neu = labels == "entailment", labels == "neutral"
    out = {}
    for name, rows in (("nli_auc_en", english), ("nli_auc_xx", ~english)):
        keep = rows & (ent | neu)
        out[name] = roc_auc(scores[keep], ent[keep]) if keep.any() else math.nan
    out["nli_auc_all3"] = roc_auc(scores, ent)
    return out


def retrieval_top1(scores: np.ndarray, records: Sequence[ParallelRecord], candidates: Sequence[str]) -> dict[str, float]:
    """Top-1 accuracy per source language and its mean: `scores [N, C]` of sources against `candidates`."""
    best = scores.argmax(axis=1)
    hit = np.array([candidates[b] == r.target for b, r in zip(best, records, strict=True)])
    langs = sorted({r.source_lang for r in records})
    per = {f"xling_top1_{lang}": float(hit[[r.source_lang == lang for r in records]].mean()) for lang in langs}
    return {"xling_top1": float(np.mean(list(per.values()))), **per}


def click_pair_scores(model: BiEncoder, records: Sequence[ClickRecord], order: Sequence[str],
                      batch_size: int) -> np.ndarray:
    """Cosine of each click record's query and document [N]: the document is its `order` fields concatenated,
    or, for a model with field attention, those fields attended by the query (paper 004 Sec. IV, Eq. 8-9)."""
    queries = [r.query for r in records]
    q = _embed(model, queries, "query", batch_size)
    if model.field_attention is None:
        d = _embed(model, [doc_text(r, order) for r in records], "doc", batch_size)
    else:
        fields = [[r.fields.get(name) or "" for name in order] for r in records]
        d = F.normalize(model.encode_field_documents(queries, fields, batch_size).embedding, dim=-1)
    return (q * d).sum(-1).numpy()


def encoder_metrics(model: BiEncoder, data: MultilingualData, cfg: MultiTaskExperimentConfig) -> dict[str, float]:
    """Every held-out metric of an encoder (see the module docstring for which side each text takes)."""
    bs, order = cfg.eval.batch_size, cfg.tasks.click.field_order
    clicks = data.clicks_eval
    out = click_ndcg(click_pair_scores(model, clicks, order, bs), clicks, cfg.eval.ndcg_at)
    h = _embed(model, [r.hypothesis for r in data.nli_eval], "query", bs)
    p = _embed(model, [r.premise for r in data.nli_eval], "doc", bs)
    out.update(nli_auc((h * p).sum(-1).numpy(), data.nli_eval))
    candidates = list(dict.fromkeys(r.target for r in data.parallel_eval))
    s = _embed(model, [r.source for r in data.parallel_eval], "query", bs)
    t = _embed(model, candidates, "doc", bs)
    out.update(retrieval_top1((s @ t.T).numpy(), data.parallel_eval, candidates))
    return out


# ------------------------------------------------------------------------------------------------ baselines

PairScorer = Callable[[list[str], list[list[str]]], list[np.ndarray]]


def _group_clicks(records: Sequence[ClickRecord]) -> list[list[int]]:
    groups: dict[str, list[int]] = {}
    for i, r in enumerate(records):
        groups.setdefault(r.query_id, []).append(i)
    return list(groups.values())


def bm25_scorer(tokenizer: PreTrainedTokenizerBase) -> PairScorer:
    """Token-level BM25 (paper 004 Sec. VI-D): word pieces of the model's tokenizer, idf over all candidates."""

    def score(queries: list[str], candidates: list[list[str]]) -> list[np.ndarray]:
        corpus = list(dict.fromkeys(c for group in candidates for c in group))
        row = {text: i for i, text in enumerate(corpus)}
        index = BM25Index().fit([tokenizer.tokenize(t) for t in corpus])
        qs = index.encode_queries([tokenizer.tokenize(q) for q in queries])
        width = max(len(g) for g in candidates)
        ids = np.full((len(queries), width), -1, dtype=np.int64)
        for i, group in enumerate(candidates):
            ids[i, :len(group)] = [row[c] for c in group]
        scores = index.index.score(qs, ids)
        return [np.nan_to_num(scores[i, :len(g)], neginf=0.0).astype(np.float64) for i, g in enumerate(candidates)]

    return score


def _edit_distance_scorer(queries: list[str], candidates: list[list[str]]) -> list[np.ndarray]:
    """Minimum edit distance (paper 004 Sec. VI-D): character-level similarity 1 - d / max length."""
    return [edit_distance_scores(q, group, level="char") for q, group in zip(queries, candidates, strict=True)]


def _random_scorer(seed: int) -> PairScorer:
    rng = np.random.default_rng(seed)
    return lambda queries, candidates: [rng.random(len(g)) for g in candidates]


def _baseline_row(scorer: PairScorer, data: MultilingualData, cfg: MultiTaskExperimentConfig) -> dict[str, float]:
    groups = _group_clicks(data.clicks_eval)
    order = cfg.tasks.click.field_order
    per_query = scorer([data.clicks_eval[g[0]].query for g in groups],
                       [[doc_text(data.clicks_eval[i], order) for i in g] for g in groups])
    scores = np.empty(len(data.clicks_eval))
    for g, s in zip(groups, per_query, strict=True):
        scores[g] = s
    out = click_ndcg(scores, data.clicks_eval, cfg.eval.ndcg_at)
    candidates = list(dict.fromkeys(r.target for r in data.parallel_eval))
    sources = [r.source for r in data.parallel_eval]
    out.update(retrieval_top1(np.stack(scorer(sources, [candidates] * len(sources))), data.parallel_eval, candidates))
    return out


def baseline_rows(data: MultilingualData, tokenizer: PreTrainedTokenizerBase,
                  cfg: MultiTaskExperimentConfig) -> dict[str, dict[str, float]]:
    """Training-free rows of Table III: random, the logged old ranker, token BM25, minimum edit distance."""
    rows = {"Random scores": _baseline_row(_random_scorer(cfg.seed), data, cfg)}
    position = np.array([-(r.position or 0) for r in data.clicks_eval], dtype=np.float64)
    rows["Old ranker (logged order)"] = click_ndcg(position, data.clicks_eval, cfg.eval.ndcg_at)
    rows["Token BM25 (word pieces)"] = _baseline_row(bm25_scorer(tokenizer), data, cfg)
    rows["Minimum edit distance"] = _baseline_row(_edit_distance_scorer, data, cfg)
    return rows


# ------------------------------------------------------------------------------------------------ runner


@dataclass
class MultiTaskResult:
    """Rows of the Table III-shaped comparison (model -> metric -> value) and what produced them."""

    rows: dict[str, dict[str, float]]
    sizes: dict[str, int]
    seconds: dict[str, float]
    distillation: dict[str, float] = field(default_factory=dict)
    final_losses: dict[str, dict[str, float]] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def _mean_last(history: dict[str, list[dict[str, float]]], n: int = 20) -> dict[str, float]:
    return {task: float(np.mean([h["loss"] for h in rows[-n:]])) for task, rows in history.items() if rows}


def distil_query_student(cfg: MultiTaskExperimentConfig, teacher: BiEncoder, data: MultilingualData,
            seed: int) -> tuple[BiEncoder, dict[str, float]]:
    """The teacher's query tower cut to `student.num_layers` layers and trained on the L2 loss (Sec. V-A)."""
    s = cfg.student
    student = make_student(teacher, s.num_layers)
    held = held_out_query_texts(data)
    before = student_teacher_distance(teacher, student, held)
    distill(teacher, student, query_side_texts(data), steps=s.steps, batch_size=s.batch_size, lr=s.learning_rate,
            seed=seed)
    student.eval()
    after = student_teacher_distance(teacher, student, held)
    return attach_query_student(teacher, student).eval(), {"held_out_l2_before": before, "held_out_l2_after": after,
                                                            "student_layers": float(s.num_layers)}


def row_labels(cfg: MultiTaskExperimentConfig) -> tuple[str, str]:
    """Row names of the single-task (baseline) and the multi-task encoder."""
    return (f"Single-task ({' + '.join(cfg.tasks.baseline)})", f"Multi-task ({' + '.join(cfg.tasks.enabled)})")


def student_label(cfg: MultiTaskExperimentConfig) -> str:
    return f"{row_labels(cfg)[1]}, {cfg.student.num_layers}-layer query student"


def run_multitask_experiment(cfg: MultiTaskExperimentConfig, write: bool = True) -> MultiTaskResult:
    """Train and evaluate every row of the comparison (see the module docstring); JSON to `output_dir`."""
    clock = {"start": time.perf_counter()}
    out_dir = Path(cfg.output_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    data = build_data(cfg)
    tokenizer = build_tokenizer(cfg, data, out_dir)
    seconds: dict[str, float] = {}
    rows = baseline_rows(data, tokenizer, cfg)
    rows[UNTRAINED] = encoder_metrics(build_encoder(cfg, tokenizer, cfg.seed), data, cfg)
    seconds["data_baselines"] = time.perf_counter() - clock["start"]
    single, multi = row_labels(cfg)
    losses, models = {}, {}
    for name, tasks in ((single, cfg.tasks.baseline), (multi, cfg.tasks.enabled)):
        t0 = time.perf_counter()
        models[name], trainer = train_encoder(cfg, tokenizer, data, tasks, cfg.seed)
        seconds[f"train {name}"] = time.perf_counter() - t0
        rows[name] = encoder_metrics(models[name], data, cfg)
        losses[name] = _mean_last(trainer.history)
    distilled: dict[str, float] = {}
    if cfg.student.enabled:
        t0 = time.perf_counter()
        served, distilled = distil_query_student(cfg, models[multi], data, cfg.seed)
        seconds["distill"] = time.perf_counter() - t0
        rows[student_label(cfg)] = encoder_metrics(served, data, cfg)
    seconds["total"] = time.perf_counter() - clock["start"]
    result = MultiTaskResult(rows, data.sizes(), seconds, distilled, losses)
    if write:
        cfg.save(out_dir / "experiment.yaml")
        (out_dir / "metrics.json").write_text(json.dumps(result.to_dict(), indent=2, default=float))
    return result


COLUMNS = (("ndcg@5", "Click NDCG@5"), ("ndcg@10", "Click NDCG@10"), ("nli_auc_en", "NLI AUC en"),
           ("nli_auc_xx", "NLI AUC xx"), ("nli_auc_all3", "NLI AUC 3-way"), ("xling_top1", "X-ling top-1"))


def format_table(rows: dict[str, dict[str, float]], spread: dict[str, dict[str, float]] | None = None) -> str:
    """A markdown table of `rows` in Table III's column order; '-' where a row has no such metric."""
    lines = ["| model | " + " | ".join(h for _, h in COLUMNS) + " |", "|---|" + "---|" * len(COLUMNS)]
    for name, metrics in rows.items():
        cells = []
        for key, _ in COLUMNS:
            value = metrics.get(key)
            if value is None or (isinstance(value, float) and math.isnan(value)):
                cells.append("-")
            elif spread and key in spread.get(name, {}):
                cells.append(f"{value:.3f} ± {spread[name][key]:.3f}")
            else:
                cells.append(f"{value:.3f}")
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return "\n".join(lines)
