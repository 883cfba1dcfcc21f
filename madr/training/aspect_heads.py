"""Aspect heads on a frozen encoder: a trained BiBERT learns to explain its matches by aspects, its ranking unchanged.

MtBERT (paper 000 Sec. 8.2) predicts every aspect from the text vector, one linear table per aspect shared by the
query and document towers (Sec. 5, Eq. 3: ``P(x) = softmax(E U_a^T + b_a)``, trained by the multi-label loss
``L_AP``). Trained jointly with retrieval the aspect loss can cost ranking (paper 001 Sec. 6.4 found it raises
aspect accuracy but hurts retrieval). Here the tables learn on the vectors of an already trained BiBERT with every
encoder weight frozen (a linear probe): the text vectors, and so every dense score and ranking, are exactly the
BiBERT's, and the aspects come on top (`/explain`, the aspect-match score whose weight the tune stage chooses on
dev, with 0 on its grid).

- `with_aspect_heads`: a saved BiBERT as an MtBERT with new aspect tables over the phrase vocabularies;
- `FrozenVectors`: the frozen representations the tables read (for MtBERT, the text vector itself), computed
  once per distinct text and side, so training and calibration share one pass of the encoder;
- `train_aspect_heads`: the tables trained by ``L_AP`` on those vectors.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

import torch

from madr.config import AspectHeadsConfig
from madr.losses.aspect_prediction import AspectPredictionLoss
from madr.modeling.aspect_vocabulary import AspectVocabularies
from madr.modeling.calibration import correct_top
from madr.modeling.model import BiEncoder, SavedModel, objective_keys
from madr.recipes.aspects.calibration import Annotations, value_labels


def with_aspect_heads(model_dir: str | Path, vocabularies: AspectVocabularies) -> BiEncoder:
    """The BiBERT saved at `model_dir` as an MtBERT: the same config but its name, the same tokenizer, backbones and
    head weights, and new aspect tables over `vocabularies`' phrase values of each of `model.aspects`."""
    base = SavedModel.read(model_dir)  # the backbones are read once, by the MtBERT below
    if base.config.name != "bibert":
        raise ValueError(f"{model_dir}: a {base.config.name} model; aspect heads on a frozen encoder are for bibert "
                         "(an aspect model has its own)")
    if not base.config.aspects:
        raise ValueError(f"{model_dir}: model.aspects is empty, no aspect to predict")
    for aspect in base.config.aspects:
        if not len(vocabularies.get(aspect, "phrase")):
            raise ValueError(f"aspect {aspect!r}: the vocabularies hold no phrase value")
    cfg = dataclasses.replace(base.config, name="mtbert")
    model = BiEncoder(cfg, base.tokenizer, vocabularies, backbone_paths=base.backbone_paths,
                      field_attention=base.field_attention)
    missing, unexpected = model.load_state_dict(base.heads, strict=False)
    missing = [k for k in missing if ".backbone." not in k]
    if unexpected or any(not k.startswith("aspect_predictor.") for k in missing):
        raise ValueError(f"{model_dir}: the BiBERT's weights do not fit an MtBERT (missing {missing[:3]}, "
                         f"unexpected {unexpected[:3]})")
    return model


class FrozenVectors:
    """The representations `model`'s aspect tables read (`TowerOutput.aspect_repr`), computed once per distinct
    text and side: every encoder weight is frozen, so a text's vector never changes while the tables train.
    Texts are encoded longest first, so a batch pads little; `log` hears the progress at every tenth."""

    def __init__(self, model: BiEncoder, batch_size: int = 128, log: Callable[[str], None] | None = None) -> None:
        self.model, self.batch_size, self.log = model, batch_size, log
        self._row: dict[str, dict[str, int]] = {}
        self._vectors: dict[str, dict[str, torch.Tensor]] = {}

    @torch.no_grad()
    def add(self, texts: Sequence[str], side: str) -> None:
        """Encode the texts of `side` not encoded yet (eval mode)."""
        rows = self._row.setdefault(side, {})
        new = sorted({t for t in texts if t not in rows}, key=lambda t: (-len(t), t))
        if not new:
            return
        was_training = self.model.training
        self.model.eval()
        parts: dict[str, list[torch.Tensor]] = {}
        step = max(self.batch_size, -(-len(new) // 10 // self.batch_size) * self.batch_size)
        for i in range(0, len(new), self.batch_size):
            enc = self.model.tokenize(new[i:i + self.batch_size], side)
            out = self.model.encode(enc["input_ids"], enc["attention_mask"], side)
            for aspect, h in out.aspect_repr.items():
                parts.setdefault(aspect, []).append(h.float())
            if self.log is not None and (i + self.batch_size) % step == 0:
                self.log(f"  {side}: {min(i + self.batch_size, len(new)):,} / {len(new):,} texts encoded")
        self.model.train(was_training)
        held = self._vectors.setdefault(side, {})
        for aspect, p in parts.items():
            held[aspect] = torch.cat([held[aspect], *p]) if aspect in held else torch.cat(p)
        first = len(rows)
        rows.update((t, first + i) for i, t in enumerate(new))

    def __call__(self, texts: Sequence[str], side: str) -> dict[str, torch.Tensor]:
        """{aspect: [N, H]} for `texts` in their order, encoding those not seen yet."""
        self.add(texts, side)
        index = torch.tensor([self._row[side][t] for t in texts], dtype=torch.long)
        return {a: v[index] for a, v in self._vectors.get(side, {}).items()}

    @torch.no_grad()
    def phrase_logits(self, texts: list[str], side: str) -> dict[str, torch.Tensor]:
        """{objective key: [N, V]} the tables' phrase-value logits of `texts` (Eq. 3), as
        `madr.recipes.aspects.evaluation.phrase_logits` gives them, from the held vectors."""
        keys = {k: a for k, a, g in objective_keys(self.model.config) if g == "phrase"}
        vectors = self(texts, side)
        return {k: self.model.aspect_predictor({k: vectors[a]})[k].float() for k, a in keys.items()}


def _examples(model: BiEncoder, texts: Mapping[str, Sequence[str]], annotations: Mapping[str, Annotations],
              vectors: FrozenVectors) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    """{objective key: (vectors [N, H], labels [N, M])} of every text of every side with an annotation of the key's
    aspect in the vocabularies (the tables are shared by both towers: Sec. 5)."""
    rows: dict[str, tuple[list[torch.Tensor], list[torch.Tensor]]] = {}
    for side, side_texts in texts.items():
        if len(side_texts) != len(annotations[side]):
            raise ValueError(f"{len(side_texts)} {side} texts but {len(annotations[side])} annotations")
        side_vectors = vectors(side_texts, side)
        for key, aspect, _ in objective_keys(model.config):
            labels = value_labels(model, aspect, annotations[side])
            has = (labels >= 0).any(dim=1)
            xs, ys = rows.setdefault(key, ([], []))
            xs.append(side_vectors[aspect][has])
            ys.append(labels[has])
    out = {}
    for key, (xs, ys) in rows.items():
        width = max(y.shape[1] for y in ys)
        y = torch.cat([torch.nn.functional.pad(y, (0, width - y.shape[1]), value=-1) for y in ys])
        if len(y):
            out[key] = (torch.cat(xs), y)
    return out


def train_aspect_heads(model: BiEncoder, texts: Mapping[str, Sequence[str]], annotations: Mapping[str, Annotations],
                       cfg: AspectHeadsConfig, seed: int = 0, vectors: FrozenVectors | None = None) -> dict[str, dict]:
    """Train `model`'s aspect tables by ``L_AP`` (Eq. 3) for `cfg.epochs` passes over the annotated `texts` (by side:
    "query", "doc"), every encoder weight frozen: the vectors come from `vectors` (default: a new
    `FrozenVectors(model)`), computed once. Returns per objective key the items, the loss before and after and the
    Accuracy@1 on those items after."""
    if model.aspect_predictor is None:
        raise ValueError(f"model {model.config.name} has no aspect tables to train")
    examples = _examples(model, texts, annotations, vectors or FrozenVectors(model))
    if not examples:
        raise ValueError("no query or product has an annotation in the model's aspect vocabularies")
    params = list(model.aspect_predictor.parameters())
    optimiser = torch.optim.AdamW(params, lr=cfg.learning_rate, weight_decay=cfg.weight_decay)
    loss_fn = AspectPredictionLoss()
    generator = torch.Generator().manual_seed(seed)
    before = _losses(model, examples, loss_fn)
    model.aspect_predictor.train()
    for _ in range(cfg.epochs):
        for key, (x, y) in examples.items():
            for batch in torch.randperm(len(x), generator=generator).split(cfg.batch_size):
                logits = model.aspect_predictor({key: x[batch]})[key]
                loss = loss_fn(logits, y[batch])
                optimiser.zero_grad(set_to_none=True)
                loss.backward()
                optimiser.step()
    model.aspect_predictor.eval()
    after = _losses(model, examples, loss_fn)
    report = {}
    for key, (x, y) in examples.items():
        with torch.no_grad():
            _, right = correct_top(model.aspect_predictor({key: x})[key], y)
        report[key] = {"items": len(y), "loss_before": before[key], "loss_after": after[key],
                       "accuracy@1": float(right.float().mean())}
    return report


@torch.no_grad()
def _losses(model: BiEncoder, examples: Mapping[str, tuple[torch.Tensor, torch.Tensor]],
            loss_fn: AspectPredictionLoss) -> dict[str, float]:
    return {key: float(loss_fn(model.aspect_predictor({key: x})[key], y)) for key, (x, y) in examples.items()}
