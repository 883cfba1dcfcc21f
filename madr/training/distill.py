"""Query-tower distillation (paper 004 Sec. V-A, VI-A): a 3-layer student learns the 6-layer teacher's outputs.

Queries must be encoded live while documents are encoded offline, so paper 004 keeps the 6-layer encoder
for documents and serves queries with "a 3-layers BERT model as a student model from a 6-layers BERT model as
a teacher", trained with "only L2 loss between the output of the teacher and student encoders" (the 32-d
embeddings, M = 32, Sec. VI-A). Here:

* `make_student(teacher, num_layers=3)`: a copy of the teacher's query tower whose backbone keeps only its
  first `num_layers` transformer layers (or the ones named by `layers`), with the teacher's embeddings, head
  and projection as the initial weights, so the student starts from the teacher's lower half;
* `distill(teacher, student, texts, ...)`: minimises `DistillationMSELoss` (or `DistillationCosineLoss`, for a
  cosine score) between the student's and the frozen teacher's query embeddings (teacher in eval mode, no
  gradient; or its outputs cached once per text, `madr.training.teacher_targets`), recording a curve
  (held-out L2 and cosine distances, an optional probe such as cross-lingual top-1) and, with `checkpoint`,
  saving what a stopped run needs to resume;
* `attach_query_student(model, student)`: a bi-encoder for serving whose query tower is the student and whose
  document tower is the teacher's. Its towers are separate (`shared_towers=False`), each backbone is saved with
  its own HF config, so `BiEncoder.save` / `BiEncoder.load` round-trip it as is.
"""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import torch
from torch import nn

from madr.losses import DistillationMSELoss
from madr.modeling.model import BiEncoder, Tower
from madr.training.loop import Optimisation
from madr.training.teacher_targets import TeacherTargets, cache_teacher_targets

Tokenize = Callable[[list[str]], dict[str, torch.Tensor]]
Probe = Callable[[Tower], dict[str, float]]  # student -> held-out metrics (e.g. x-ling top-1)

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
    """Training loss per step; at each evaluation the mean held-out student-teacher L2 and cosine distances
    and, with a `probe`, its metrics (e.g. cross-lingual top-1 on a held-out slice): the distillation curve."""

    losses: list[float] = field(default_factory=list)
    eval_steps: list[int] = field(default_factory=list)
    eval_distance: list[float] = field(default_factory=list)
    eval_cosine: list[float] = field(default_factory=list)
    eval_probe: list[dict[str, float]] = field(default_factory=list)

    def curve(self) -> list[dict[str, float]]:
        """One point per evaluation: step, held-out L2 and cosine distances, the probe's metrics (JSON-ready)."""
        probes = self.eval_probe or [{}] * len(self.eval_steps)
        return [{"step": float(step), "held_out_l2": dist, "held_out_cosine_distance": cos, **probe}
                for step, dist, cos, probe in zip(self.eval_steps, self.eval_distance, self.eval_cosine, probes,
                                                  strict=True)]


def _tokenizer_for(teacher: Tower | BiEncoder, tokenize: Tokenize | None) -> Tokenize:
    if tokenize is not None:
        return tokenize
    if isinstance(teacher, BiEncoder):
        return lambda texts: teacher.tokenize(texts, "query")
    raise ValueError("distill: pass tokenize= when the teacher is a Tower (a BiEncoder brings its tokenizer)")


def _embed(tower: Tower, enc: dict[str, torch.Tensor], device: torch.device) -> torch.Tensor:
    return tower(enc["input_ids"].to(device), enc["attention_mask"].to(device)).embedding


@torch.no_grad()
def _teacher_out(t_tower: Tower, enc: dict[str, torch.Tensor], texts: list[str], targets: TeacherTargets | None,
                 device: torch.device) -> torch.Tensor:
    """The frozen teacher's outputs for `texts` (tokenised as `enc`): looked up in `targets` when given, else
    computed without gradient."""
    return targets.lookup(texts).to(device) if targets is not None else _embed(t_tower, enc, device)


def student_teacher_distance(teacher: Tower | BiEncoder, student: Tower, texts: Sequence[str],
                             tokenize: Tokenize | None = None, batch_size: int = 64,
                             targets: TeacherTargets | None = None) -> float:
    """Mean L2 distance `||s(x) - t(x)||_2` over `texts`, both towers in eval mode; the teacher's outputs
    looked up in `targets` when given (it must hold every text)."""
    return student_teacher_gaps(teacher, student, texts, tokenize, batch_size, targets)[0]


@torch.no_grad()
def student_teacher_gaps(teacher: Tower | BiEncoder, student: Tower, texts: Sequence[str],
                         tokenize: Tokenize | None = None, batch_size: int = 64,
                         targets: TeacherTargets | None = None) -> tuple[float, float]:
    """(mean L2 distance, mean cosine distance `1 - cos(s(x), t(x))`) over `texts`, both towers in eval mode.
    The cosine distance is what a cosine-scored student is judged on: the L2 one also counts the norms."""
    tokenize = _tokenizer_for(teacher, tokenize)
    t_tower = _teacher_tower(teacher)
    if not texts:
        raise ValueError("student_teacher_distance: no texts")
    modes = (t_tower.training, student.training)
    t_tower.eval()
    student.eval()
    device = next(student.parameters()).device
    l2 = cosine = 0.0
    for i in range(0, len(texts), batch_size):
        chunk = list(texts[i:i + batch_size])
        enc = tokenize(chunk)
        target = _teacher_out(t_tower, enc, chunk, targets, device)
        out = _embed(student, enc, device)
        l2 += float((out - target).norm(dim=-1).sum())
        cosine += float((1 - torch.nn.functional.cosine_similarity(out, target, dim=-1)).sum())
    t_tower.train(modes[0])
    student.train(modes[1])
    return l2 / len(texts), cosine / len(texts)


def distill(teacher: Tower | BiEncoder, student: Tower, texts: Sequence[str], steps: int = 1000,
            batch_size: int = 32, lr: float = 1e-4, *, tokenize: Tokenize | None = None,
            eval_texts: Sequence[str] | None = None, eval_every: int | None = None, seed: int = 0,
            weight_decay: float = 0.0, max_grad_norm: float | None = 1.0, loss: nn.Module | None = None,
            targets: TeacherTargets | None = None, probe: Probe | None = None,
            checkpoint: str | Path | None = None) -> DistillHistory:
    """Train `student` to reproduce the frozen teacher's query embeddings (paper 004 Sec. V-A, L2 loss).

    Batches of `texts` (queries) are drawn epoch by epoch in a seeded random order; each step minimises
    `loss` (default `DistillationMSELoss()`, mean squared L2 distance; `DistillationCosineLoss` for a cosine
    score) between `student(x)` and `teacher(x)` with `madr.training.loop.Optimisation` (AdamW at a constant
    `lr`, clipping at `max_grad_norm`). The teacher runs in eval mode without gradients and is restored to its
    mode afterwards; with `targets` (`cache_teacher_targets` over `texts`) it does not run at all: each step
    looks its outputs up. `eval_texts` are scored with `student_teacher_distance` (and the student with
    `probe(student) -> {metric: value}`, in eval mode) before training, every `eval_every` steps and at the end.
    `checkpoint` (a file): every `eval_every` steps the student, the optimiser, the batch order, the random
    states and the history are saved there, and a call that finds the file resumes from it (same arguments),
    so a stopped long run loses at most `eval_every` steps. A BiEncoder teacher supplies its query tower and
    tokenizer; a Tower teacher needs `tokenize`.
    """
    tokenize = _tokenizer_for(teacher, tokenize)
    t_tower = _teacher_tower(teacher)
    texts = [t for t in texts if t and t.strip()]
    if not texts:
        raise ValueError("distill: no non-empty training text")
    if steps < 0 or batch_size < 1 or lr <= 0:
        raise ValueError(f"distill: need steps >= 0, batch_size >= 1 and lr > 0, got {steps}, {batch_size}, {lr}")
    if checkpoint is not None and not eval_every:
        raise ValueError("distill: checkpoint= needs eval_every (how often the student is saved)")
    if targets is not None and (missing := next((t for t in texts if t not in targets), None)) is not None:
        raise ValueError(f"distill: targets lack the training text {missing[:80]!r} (cache every training text)")
    loss_fn = loss if loss is not None else DistillationMSELoss()
    device = next(student.parameters()).device
    optimisation = Optimisation((p for p in student.parameters() if p.requires_grad), lr, weight_decay,
                                max_grad_norm=max_grad_norm)  # constant learning rate
    generator = torch.Generator().manual_seed(seed)
    history = DistillHistory()
    eval_targets = None  # the held-out texts' teacher outputs, encoded once when the teacher is cached
    if targets is not None and eval_texts:
        eval_targets = (targets if all(t in targets for t in eval_texts)
                        else cache_teacher_targets(t_tower, eval_texts, tokenize))
    order: list[int] = []
    first = 1
    # what a checkpoint must agree on to be resumed (not `steps`: a finished run can be extended)
    fingerprint = (f"texts={len(texts)} batch={batch_size} lr={lr} seed={seed} wd={weight_decay} "
                   f"clip={max_grad_norm} loss={loss_fn!r} eval_every={eval_every}")
    if checkpoint is not None and Path(checkpoint).is_file():
        done, order = _resume(Path(checkpoint), student, optimisation, generator, history, fingerprint)
        first = done + 1

    def evaluate(step: int) -> None:
        if eval_texts:
            history.eval_steps.append(step)
            l2, cosine = student_teacher_gaps(t_tower, student, eval_texts, tokenize, targets=eval_targets)
            history.eval_distance.append(l2)
            history.eval_cosine.append(cosine)
            if probe is not None:
                was = student.training
                student.eval()
                with torch.no_grad():
                    history.eval_probe.append({k: float(v) for k, v in probe(student).items()})
                student.train(was)

    teacher_mode, student_mode = t_tower.training, student.training
    t_tower.eval()
    if first == 1:
        evaluate(0)
    for step in range(first, steps + 1):
        if len(order) < batch_size:
            order += torch.randperm(len(texts), generator=generator).tolist()
        rows, order = order[:batch_size], order[batch_size:]
        batch = [texts[i] for i in rows]
        enc = tokenize(batch)
        target = _teacher_out(t_tower, enc, batch, targets, device)
        student.train()
        value = loss_fn(_embed(student, enc, device), target)
        optimisation.step(value)
        history.losses.append(float(value.detach()))
        if eval_every and step % eval_every == 0 and step != steps:
            evaluate(step)
            if checkpoint is not None:
                _save(Path(checkpoint), step, student, optimisation, generator, order, history, fingerprint)
    evaluate(steps)
    t_tower.train(teacher_mode)
    student.train(student_mode)
    return history


def _save(path: Path, step: int, student: Tower, optimisation: Optimisation, generator: torch.Generator,
          order: list[int], history: DistillHistory, fingerprint: str) -> None:
    """Write the resumable state atomically (a half-written file never replaces a good one). Only the trained
    weights are saved: frozen ones (e5's 250k x 384 word embeddings, 0.4 GB) are the teacher's copy."""
    path.parent.mkdir(parents=True, exist_ok=True)
    trained = {name for name, p in student.named_parameters() if p.requires_grad}  # frozen weights: the teacher's
    weights = {k: v for k, v in student.state_dict().items() if k in trained}
    state = {"step": step, "student": weights, "optimizer": optimisation.optimizer.state_dict(),
             "generator": generator.get_state(), "torch_rng": torch.get_rng_state(), "order": list(order),
             "history": dataclasses.asdict(history), "fingerprint": fingerprint}
    tmp = path.with_name(path.name + ".tmp")
    torch.save(state, tmp)
    tmp.replace(path)


def _resume(path: Path, student: Tower, optimisation: Optimisation, generator: torch.Generator,
            history: DistillHistory, fingerprint: str) -> tuple[int, list[int]]:
    """Load `_save`'s state into the arguments; returns the step it was saved at and the batch order left.
    A checkpoint of other settings is refused (resuming it would silently mix two runs)."""
    state = torch.load(path, weights_only=True)
    if state.get("fingerprint") != fingerprint:
        raise ValueError(f"{path}: checkpoint of other distillation settings ({state.get('fingerprint')}) than "
                         f"this run ({fingerprint}); delete it to start over")
    missing = set(state["student"]) - set(student.state_dict())
    if missing:
        raise ValueError(f"{path}: checkpoint weights {sorted(missing)[:3]} are not in this student")
    student.load_state_dict(state["student"], strict=False)  # only the trained weights are saved
    optimisation.optimizer.load_state_dict(state["optimizer"])
    generator.set_state(state["generator"])
    torch.set_rng_state(state["torch_rng"])
    for name, values in state["history"].items():
        getattr(history, name).extend(values)
    return int(state["step"]), [int(i) for i in state["order"]]


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
