"""Query-tower distillation (paper 004 Sec. V-A, VI-A): a 3-layer student learns the 6-layer teacher's outputs.

Queries must be encoded live while documents are encoded offline, so paper 004 keeps the 6-layer encoder
for documents and serves queries with "a 3-layers BERT model as a student model from a 6-layers BERT model as
a teacher", trained with "only L2 loss between the output of the teacher and student encoders" (the 32-d
embeddings, M = 32, Sec. VI-A). Here:

* `make_student(teacher, num_layers=3)`: a copy of the teacher's query tower whose backbone keeps only its
  first `num_layers` transformer layers (or the ones named by `layers`), with the teacher's embeddings, head
  and projection as the initial weights, so the student starts from the teacher's lower half;
* `distill(teacher, student, texts, ...)`: minimises `DistillationMSELoss` between the student's and the
  frozen teacher's query embeddings (teacher in eval mode, no gradient);
* `attach_query_student(model, student)`: a bi-encoder for serving whose query tower is the student and whose
  document tower is the teacher's. Its towers are separate (`shared_towers=False`), each backbone is saved with
  its own HF config, so `BiEncoder.save` / `BiEncoder.load` round-trip it as is.
"""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import torch
from torch import nn

from madr.losses import DistillationMSELoss
from madr.modeling.model import BiEncoder, Tower
from madr.training.loop import Optimisation

Tokenize = Callable[[list[str]], dict[str, torch.Tensor]]

# Where common HF encoders keep their transformer layers, and the config field that counts them.
_LAYER_PATHS = (("encoder", "layer"), ("transformer", "layer"), ("encoder", "layers"), ("layers",))
_LAYER_COUNT_FIELDS = ("num_hidden_layers", "n_layers", "num_layers")


def _teacher_tower(teacher: Tower | BiEncoder) -> Tower:
    tower = teacher.query_tower if isinstance(teacher, BiEncoder) else teacher
    if not isinstance(tower, Tower):
        raise ValueError(f"teacher must be a Tower or a BiEncoder, got {type(teacher).__name__}")
    if tower.backbone is None:
        raise ValueError("the teacher tower has no transformer backbone (DSSM) to take layers from")
    return tower


def encoder_layers(backbone: nn.Module) -> tuple[nn.Module, str]:
    """(module holding the transformer layers, attribute name) of an HF encoder; ValueError if not found."""
    for *parents, attr in _LAYER_PATHS:
        holder = backbone
        for name in parents:
            holder = getattr(holder, name, None)
        if holder is not None and isinstance(getattr(holder, attr, None), nn.ModuleList):
            return holder, attr
    raise ValueError(f"{type(backbone).__name__}: no transformer layer list found "
                     f"(looked for {', '.join('.'.join(p) for p in _LAYER_PATHS)})")


def num_layers(tower: Tower) -> int:
    """Transformer layers of a tower's backbone (0 for DSSM)."""
    if tower.backbone is None:
        return 0
    holder, attr = encoder_layers(tower.backbone)
    return len(getattr(holder, attr))


def make_student(teacher: Tower | BiEncoder, num_layers: int = 3, layers: Sequence[int] | None = None) -> Tower:
    """A student tower: the teacher's (query) tower with its backbone cut to `num_layers` layers.

    The student keeps the teacher's embeddings, head and projection (same output size, e.g. 32) and its
    first `num_layers` transformer layers (paper 004 Sec. V-A; DistilBERT-style every-other-layer picks are
    possible with `layers`, the teacher layer indices to keep, in order). The teacher is not modified; the
    backbone's config is updated so that `save_pretrained` / loading give the same shape back.
    """
    source = _teacher_tower(teacher)
    holder, attr = encoder_layers(source.backbone)
    total = len(getattr(holder, attr))
    picks = list(range(num_layers)) if layers is None else [int(i) for i in layers]
    if len(picks) != num_layers:
        raise ValueError(f"layers {picks} name {len(picks)} layers but num_layers={num_layers}")
    if not picks or not all(0 <= i < total for i in picks) or len(set(picks)) != len(picks):
        raise ValueError(f"student layers {picks} must be 1..{total} distinct indices of the teacher's {total} layers "
                         f"(num_layers={num_layers})")
    student = copy.deepcopy(source)
    s_holder, _ = encoder_layers(student.backbone)
    kept = nn.ModuleList([getattr(s_holder, attr)[i] for i in picks])
    for new_index, layer in enumerate(kept):
        for module in layer.modules():
            if hasattr(module, "layer_idx"):
                module.layer_idx = new_index
    setattr(s_holder, attr, kept)
    _set_layer_count(student.backbone.config, picks, total)
    return student


def _set_layer_count(config: object, picks: list[int], total: int) -> None:
    for name in _LAYER_COUNT_FIELDS:
        if isinstance(getattr(config, name, None), int):
            setattr(config, name, len(picks))
    layer_types = getattr(config, "layer_types", None)
    if isinstance(layer_types, list) and len(layer_types) == total:
        config.layer_types = [layer_types[i] for i in picks]


@dataclass
class DistillHistory:
    """Training loss per step, and the mean student-teacher L2 distance on held-out texts when evaluated."""

    losses: list[float] = field(default_factory=list)
    eval_steps: list[int] = field(default_factory=list)
    eval_distance: list[float] = field(default_factory=list)


def _tokenizer_for(teacher: Tower | BiEncoder, tokenize: Tokenize | None) -> Tokenize:
    if tokenize is not None:
        return tokenize
    if isinstance(teacher, BiEncoder):
        return lambda texts: teacher.tokenize(texts, "query")
    raise ValueError("distill: pass tokenize= when the teacher is a Tower (a BiEncoder brings its tokenizer)")


def _embed(tower: Tower, enc: dict[str, torch.Tensor], device: torch.device) -> torch.Tensor:
    return tower(enc["input_ids"].to(device), enc["attention_mask"].to(device)).embedding


@torch.no_grad()
def student_teacher_distance(teacher: Tower | BiEncoder, student: Tower, texts: Sequence[str],
                             tokenize: Tokenize | None = None, batch_size: int = 64) -> float:
    """Mean L2 distance `||s(x) - t(x)||_2` over `texts`, both towers in eval mode."""
    tokenize = _tokenizer_for(teacher, tokenize)
    t_tower = _teacher_tower(teacher)
    if not texts:
        raise ValueError("student_teacher_distance: no texts")
    modes = (t_tower.training, student.training)
    t_tower.eval()
    student.eval()
    device = next(student.parameters()).device
    total = 0.0
    for i in range(0, len(texts), batch_size):
        enc = tokenize(list(texts[i:i + batch_size]))
        total += float((_embed(student, enc, device) - _embed(t_tower, enc, device)).norm(dim=-1).sum())
    t_tower.train(modes[0])
    student.train(modes[1])
    return total / len(texts)


def distill(teacher: Tower | BiEncoder, student: Tower, texts: Sequence[str], steps: int = 1000,
            batch_size: int = 32, lr: float = 1e-4, *, tokenize: Tokenize | None = None,
            eval_texts: Sequence[str] | None = None, eval_every: int | None = None, seed: int = 0,
            weight_decay: float = 0.0, max_grad_norm: float | None = 1.0,
            loss: DistillationMSELoss | None = None) -> DistillHistory:
    """Train `student` to reproduce the frozen teacher's query embeddings (paper 004 Sec. V-A, L2 loss).

    Batches of `texts` (queries) are drawn epoch by epoch in a seeded random order; each step minimises
    `loss` (default `DistillationMSELoss()`, mean squared L2 distance) between `student(x)` and `teacher(x)`
    with `madr.training.loop.Optimisation` (AdamW at a constant `lr`, clipping at `max_grad_norm`). The teacher runs in eval mode without gradients and is restored to its mode afterwards.
    `eval_texts` are scored with `student_teacher_distance` before training, every `eval_every` steps and at
    the end. A BiEncoder teacher supplies its query tower and tokenizer; a Tower teacher needs `tokenize`.
    """
    tokenize = _tokenizer_for(teacher, tokenize)
    t_tower = _teacher_tower(teacher)
    texts = [t for t in texts if t and t.strip()]
    if not texts:
        raise ValueError("distill: no non-empty training text")
    if steps < 0 or batch_size < 1 or lr <= 0:
        raise ValueError(f"distill: need steps >= 0, batch_size >= 1 and lr > 0, got {steps}, {batch_size}, {lr}")
    loss_fn = loss if loss is not None else DistillationMSELoss()
    device = next(student.parameters()).device
    optimisation = Optimisation((p for p in student.parameters() if p.requires_grad), lr, weight_decay,
                                max_grad_norm=max_grad_norm)  # constant learning rate
    generator = torch.Generator().manual_seed(seed)
    history = DistillHistory()

    def evaluate(step: int) -> None:
        if eval_texts:
            history.eval_steps.append(step)
            history.eval_distance.append(student_teacher_distance(t_tower, student, eval_texts, tokenize))

    teacher_mode, student_mode = t_tower.training, student.training
    t_tower.eval()
    evaluate(0)
    order: list[int] = []
    for step in range(1, steps + 1):
        if len(order) < batch_size:
            order += torch.randperm(len(texts), generator=generator).tolist()
        rows, order = order[:batch_size], order[batch_size:]
        enc = tokenize([texts[i] for i in rows])
        with torch.no_grad():
            target = _embed(t_tower, enc, device)
        student.train()
        value = loss_fn(_embed(student, enc, device), target)
        optimisation.step(value)
        history.losses.append(float(value.detach()))
        if eval_every and step % eval_every == 0 and step != steps:
            evaluate(step)
    evaluate(steps)
    t_tower.train(teacher_mode)
    student.train(student_mode)
    return history


def attach_query_student(model: BiEncoder, student: Tower) -> BiEncoder:
    """A copy of `model` serving queries with `student` and documents with `model`'s document tower.

    The copy shares the tokenizer and vocabularies with `model`, has `shared_towers=False` (each tower keeps
    its own backbone, saved separately by `BiEncoder.save`) and leaves `model` untouched; `student` itself is
    used, not copied. The student's output size must be the document tower's (same projection).
    """
    if not isinstance(student, Tower):
        raise ValueError(f"student must be a Tower, got {type(student).__name__}")
    probe = model.tokenize(["probe"], "query")
    with torch.no_grad():
        was = student.training
        student.eval()
        dim = _embed(student, probe, next(student.parameters()).device).shape[-1]
        student.train(was)
    if dim != model.embedding_dim:
        raise ValueError(f"student output size {dim} differs from the model's embedding size {model.embedding_dim}")
    memo = {id(model.tokenizer): model.tokenizer, id(model.query_tower): None}  # the query tower is replaced
    if model.vocabularies is not None:
        memo[id(model.vocabularies)] = model.vocabularies
    served = copy.deepcopy(model, memo)
    if model._doc_tower is None:  # shared towers: the teacher becomes the document tower
        served._doc_tower = copy.deepcopy(model.query_tower)
    served.config = dataclasses.replace(model.config, shared_towers=False)
    served.query_tower = student
    return served
