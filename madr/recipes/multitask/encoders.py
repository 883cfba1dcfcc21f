"""The experiment's encoders (steps 2-4 of `madr.recipes.multitask.experiment`): the tokenizer, the shared
encoder of every row (same initial weights per seed), its tasks and losses, multi-task training and the
distilled query student."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from transformers import PreTrainedTokenizerBase

from madr.config import ModelConfig
from madr.data.records import MultilingualData
from madr.losses import NLICosineLoss, TranslationLoss, TripletLoss
from madr.modeling.model import BiEncoder, Tower
from madr.modeling.tokenization import load_tokenizer, train_wordpiece_tokenizer
from madr.recipes.multitask.config import MultiTaskExperimentConfig
from madr.recipes.multitask.data import (
    DOC_SEP,
    doc_side_texts,
    held_out_doc_texts,
    held_out_query_texts,
    query_side_texts,
    training_texts,
)
from madr.recipes.multitask.tasks import ClickTask, NLITask, SideTokenizer, TranslationTask
from madr.recipes.multitask.trainer import MultiTaskTrainer
from madr.training.distill import attach_query_student, distill, make_student, student_teacher_distance

HELD_OUT_DISTANCE_TEXTS = 1000  # held-out texts the student-teacher distance is reported on (about)


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
                       pooling=m.pooling, text_prefixes=dict(m.text_prefixes))


def build_encoder(cfg: MultiTaskExperimentConfig, tokenizer: PreTrainedTokenizerBase, seed: int) -> BiEncoder:
    """The encoder of `model_config`, with the click documents' field attention when `tasks.click` asks for it
    (paper 004 Eq. 8-9; it lives on the model so that it is saved, loaded and used to score with it)."""
    torch.manual_seed(seed)
    return BiEncoder(model_config(cfg), tokenizer, field_attention=cfg.tasks.click.field_attention)


def make_tasks(cfg: MultiTaskExperimentConfig, model: BiEncoder, names: Sequence[str], seed: int) -> dict[str, Any]:
    """name -> task for the tasks in `names`, losses as configured (no records: the Ray pipeline streams them)."""
    tok, t = SideTokenizer.from_model(model), cfg.tasks
    generator = torch.Generator().manual_seed(seed)
    triplet = TripletLoss(distance=t.click.distance, margin=t.click.margin, negatives=t.click.negatives,
                          generator=generator)
    every = {
        "click": lambda: ClickTask(tok, loss=triplet, field_order=t.click.field_order, sep=DOC_SEP,
                                   field_attention=model.field_attention),
        "nli": lambda: NLITask(tok, loss=NLICosineLoss(mapping=t.nli.mapping)),
        "translation": lambda: TranslationTask(tok, loss=TranslationLoss(t.translation.objective,
                                                                         t.translation.temperature,
                                                                         t.translation.symmetric),
                                               source_side="query"),
    }
    return {name: every[name]() for name in names}


def task_records(data: MultilingualData, name: str) -> list[Any]:
    """The training records of task `name` ("click", "nli" or "translation")."""
    return {"click": data.clicks_train, "nli": data.nli_train, "translation": data.parallel_train}[name]


def build_tasks(cfg: MultiTaskExperimentConfig, model: BiEncoder, data: MultilingualData,
                names: Sequence[str], seed: int) -> dict[str, tuple[Any, list[Any]]]:
    """name -> (task, training records) for the tasks in `names`, losses as configured."""
    return {name: (task, task_records(data, name)) for name, task in make_tasks(cfg, model, names, seed).items()}


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


def _distil_tower(cfg: MultiTaskExperimentConfig, teacher: BiEncoder, side: str, layers: int, texts: list[str],
                  held: list[str], seed: int) -> tuple[Tower, dict[str, float]]:
    """`teacher`'s `side` tower cut to its first `layers` layers and trained on the L2 loss (Sec. V-A) on `texts`
    tokenised as that side (its length and text prefix); the held-out L2 distance before and after."""
    s = cfg.student
    source = teacher.tower(side)
    student = make_student(source, layers)
    held = held[::max(1, len(held) // HELD_OUT_DISTANCE_TEXTS)]  # an even sample: the distance is a summary

    def tokenize(texts: list[str]) -> dict[str, torch.Tensor]:
        return teacher.tokenize(texts, side)

    before = student_teacher_distance(source, student, held, tokenize)
    distill(source, student, texts, steps=s.steps, batch_size=s.batch_size, lr=s.learning_rate, seed=seed,
            tokenize=tokenize)
    student.eval()
    after = student_teacher_distance(source, student, held, tokenize)
    return student, {f"{side}_held_out_l2_before": before, f"{side}_held_out_l2_after": after,
                     f"{side}_student_layers": float(layers)}


def distil_query_student(cfg: MultiTaskExperimentConfig, teacher: BiEncoder, data: MultilingualData,
            seed: int) -> tuple[BiEncoder, dict[str, float]]:
    """The serving towers of Sec. V-A: the teacher's query tower cut to `student.num_layers` layers and trained
    on the L2 loss to the teacher on the query-side training texts; with `student.doc_layers`, the document
    tower too, cut to that many layers and distilled on the document-side texts. Returns the served encoder
    (`attach_query_student`: query student + the teacher's or the distilled document tower)."""
    s = cfg.student
    query, report = _distil_tower(cfg, teacher, "query", s.num_layers, query_side_texts(data),
                                  held_out_query_texts(data), seed)
    served = attach_query_student(teacher, query)
    if s.doc_layers is not None:
        doc, doc_report = _distil_tower(cfg, teacher, "doc", s.doc_layers,
                                        doc_side_texts(data, cfg.tasks.click.field_order),
                                        held_out_doc_texts(data, cfg.tasks.click.field_order), seed + 1)
        served._doc_tower = doc
        report.update(doc_report)
    return served.eval(), report
