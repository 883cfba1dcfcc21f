"""The experiment's encoders (steps 2-4 of `madr.recipes.multitask.experiment`): the tokenizer, the shared
encoder of every row (same initial weights per seed), its tasks and losses, multi-task training and the
distilled query student."""

from __future__ import annotations

import dataclasses
import hashlib
import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from transformers import PreTrainedTokenizerBase

from madr.config import ModelConfig
from madr.data.records import MultilingualData
from madr.losses import (
    DistillationCosineLoss,
    DistillationMSELoss,
    NLICosineLoss,
    TranslationLoss,
    TripletLoss,
)
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
from madr.training.distill import (
    attach_query_student,
    distill,
    make_student,
    student_teacher_gaps,
)
from madr.training.teacher_targets import cache_teacher_targets

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


def student_loss(cfg: MultiTaskExperimentConfig) -> torch.nn.Module:
    """`student.loss`: Sec. V-A's L2 ("mse") or the cosine loss on what is scored (+ the in-batch score KL)."""
    s = cfg.student
    if s.loss == "cosine":
        return DistillationCosineLoss(s.similarity_weight, s.similarity_temperature)
    return DistillationMSELoss()


@torch.no_grad()
def _tower_vectors(model: BiEncoder, tower: Tower, texts: Sequence[str], side: str, batch_size: int = 128
                   ) -> torch.Tensor:
    device = next(tower.parameters()).device
    out = []
    for i in range(0, len(texts), batch_size):
        enc = model.tokenize(list(texts[i:i + batch_size]), side)
        out.append(F.normalize(tower(enc["input_ids"].to(device), enc["attention_mask"].to(device)).embedding,
                               dim=-1).float().cpu())
    return torch.cat(out)


@dataclass
class XlingProbe:
    """Cross-lingual top-1 of a `side` student on held-out translation pairs: `probe(student)` ->
    {"xling_top1_probe": top-1}; the other side's vectors (`fixed`, the teacher's) are encoded once, and
    `teacher` is the teacher's own top-1 on the same slice (what the student's is kept relative to)."""

    model: BiEncoder
    side: str
    sources: list[str]
    candidates: list[str]
    gold: torch.Tensor
    fixed: torch.Tensor
    teacher: float = float("nan")

    def top1(self, tower: Tower) -> float:
        if self.side == "query":
            scores = _tower_vectors(self.model, tower, self.sources, "query") @ self.fixed.T
        else:
            scores = self.fixed @ _tower_vectors(self.model, tower, self.candidates, "doc").T
        return float((scores.argmax(dim=1) == self.gold).float().mean())

    def __call__(self, student: Tower) -> dict[str, float]:
        return {"xling_top1_probe": self.top1(student)}


def xling_probe(teacher: BiEncoder, data: MultilingualData, side: str, sources: int) -> XlingProbe | None:
    """The `XlingProbe` of a `side` student on an even slice of `sources` held-out translation sources against
    every held-out English sentence (the benchmark's metric on fewer sources; 0: no probe); the other side is
    the teacher's."""
    if sources <= 0 or not data.parallel_eval:
        return None
    pairs = data.parallel_eval[::max(1, len(data.parallel_eval) // sources)][:sources]
    candidates = list(dict.fromkeys(r.target for r in data.parallel_eval))
    where = {t: i for i, t in enumerate(candidates)}
    src = [r.source for r in pairs]
    fixed = (_tower_vectors(teacher, teacher.tower("doc"), candidates, "doc") if side == "query"
             else _tower_vectors(teacher, teacher.tower("query"), src, "query"))
    probe = XlingProbe(teacher, side, src, candidates, torch.tensor([where[r.target] for r in pairs]), fixed)
    probe.teacher = probe.top1(teacher.tower(side))
    return probe


def _run_id(cfg: MultiTaskExperimentConfig) -> str:
    """A short hash of the whole configuration but `student.steps`: a student checkpoint belongs to one teacher
    and one recipe, and a finished run can be extended by raising the steps."""
    settings = cfg.to_dict()
    settings["student"] = {k: v for k, v in settings["student"].items() if k != "steps"}
    return hashlib.sha1(json.dumps(settings, sort_keys=True, default=str).encode()).hexdigest()[:10]


def _distil_tower(cfg: MultiTaskExperimentConfig, teacher: BiEncoder, side: str, layers: int, texts: list[str],
                  held: list[str], seed: int, picks: list[int] | None = None,
                  probe: XlingProbe | None = None) -> tuple[Tower, dict[str, Any]]:
    """`teacher`'s `side` tower cut to `layers` layers (the first ones, or the teacher layers `picks`) and
    trained on `student_loss` (Sec. V-A: L2) on `texts` tokenised as that side (its length and text prefix);
    the held-out L2 distance before and after and, with `student.eval_every`, the distillation curve."""
    s = cfg.student
    source = teacher.tower(side)
    student = make_student(source, layers, picks)
    held = held[::max(1, len(held) // HELD_OUT_DISTANCE_TEXTS)]  # an even sample: the distance is a summary

    def tokenize(texts: list[str]) -> dict[str, torch.Tensor]:
        return teacher.tokenize(texts, side)

    targets = cache_teacher_targets(source, texts + held, tokenize) if s.cache_targets else None
    before = student_teacher_gaps(source, student, held, tokenize, targets=targets)
    checkpoint = Path(cfg.output_dir) / f"distil_seed{seed}_{side}_{_run_id(cfg)}.pt" if s.checkpoint else None
    history = distill(source, student, texts, steps=s.steps, batch_size=s.batch_size, lr=s.learning_rate,
                      seed=seed, tokenize=tokenize, loss=student_loss(cfg), targets=targets, probe=probe,
                      eval_texts=held if s.eval_every else None, eval_every=s.eval_every, checkpoint=checkpoint)
    student.eval()
    after = student_teacher_gaps(source, student, held, tokenize, targets=targets)
    report: dict[str, Any] = {f"{side}_held_out_l2_before": before[0], f"{side}_held_out_l2_after": after[0],
                              f"{side}_student_layers": float(layers)}
    if s.loss != "mse" or s.eval_every:  # a new key only where the settings are new: old results keep their keys
        report.update({f"{side}_held_out_cosine_before": before[1], f"{side}_held_out_cosine_after": after[1]})
    if s.eval_every:
        report[f"{side}_curve"] = history.curve()
        if probe is not None:
            report[f"{side}_teacher_xling_top1_probe"] = probe.teacher
    return student, report


def distil_query_student(cfg: MultiTaskExperimentConfig, teacher: BiEncoder, data: MultilingualData,
            seed: int) -> tuple[BiEncoder, dict[str, Any]]:
    """The serving towers of Sec. V-A: the teacher's query tower cut to `student.num_layers` layers (or the
    teacher layers `student.query_layers`) and trained on `student.loss` to the teacher on the query-side
    training texts; with `student.doc_layers`, the document tower too, cut to that many layers (or
    `student.doc_layer_indices`) and distilled on the document-side texts. Returns the served encoder
    (`attach_query_student`: query student + the teacher's or the distilled document tower) and a report
    (held-out distances; with `student.eval_every` each tower's curve, `<side>_curve`)."""
    s = cfg.student
    probe = s.probe_sources if s.eval_every else 0
    query, report = _distil_tower(cfg, teacher, "query", s.num_layers, query_side_texts(data),
                                  held_out_query_texts(data), seed, s.query_layers,
                                  xling_probe(teacher, data, "query", probe))
    served = attach_query_student(teacher, query)
    if s.doc_layers is not None:
        doc, doc_report = _distil_tower(cfg, teacher, "doc", s.doc_layers,
                                        doc_side_texts(data, cfg.tasks.click.field_order),
                                        held_out_doc_texts(data, cfg.tasks.click.field_order), seed + 1,
                                        s.doc_layer_indices, xling_probe(teacher, data, "doc", probe))
        served._doc_tower = doc
        report.update(doc_report)
    return served.eval(), report
