"""In-process training: seeded catalog samplers and a plain PyTorch loop for one stage.

The Ray Train job (pipelines/train) runs the same `train_step`; this module is what tests and the
single-process demo use.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass

import torch
from tqdm.auto import tqdm
from transformers import get_linear_schedule_with_warmup

from madr.config import StageConfig
from madr.data.schema import Catalog
from madr.losses import PointwiseCELoss
from madr.modeling.batching import TextBatch, make_batch
from madr.modeling.model import BiEncoder
from madr.training.objectives import LossParts, finetune_loss, pretrain_loss


@dataclass
class FinetuneExample:
    query: str
    query_aspects: dict[str, list[str]]
    positive: str
    positive_aspects: dict[str, list[str]]
    negative: str
    negative_aspects: dict[str, list[str]]
    negative_relevance: float  # graded relevance / max grade, the soft pointwise target


class CatalogSampler:
    """Seeded training examples from a `Catalog`.

    Pretraining draws queries (query tower) and products (document tower) with their annotations.
    Fine-tuning draws a training query, one judged positive (relevance >= `min_relevance`) and one hard
    negative: a judged product of that query with lower relevance when there is one (paper 001 Sec.
    5.3.2: "a hard negative sample for each query besides in-batch negatives"), else a random product.
    Queries in one batch are distinct, so no query sees its own positive as an in-batch negative.
    """

    def __init__(self, catalog: Catalog, split: str = "train", seed: int = 0, min_relevance: int = 3,
                 max_relevance: int = 4) -> None:
        self.catalog = catalog
        self.rng = random.Random(seed)
        self.products = list(catalog.products)
        self.by_id = {p.product_id: p for p in self.products}
        self.queries = list(catalog.queries_in(split))
        self.max_relevance = max_relevance
        judged: dict[str, list[tuple[str, int]]] = {}
        for j in catalog.judgments:
            judged.setdefault(j.query_id, []).append((j.product_id, j.relevance))
        self.pos = {q.query_id: [p for p, r in judged.get(q.query_id, []) if r >= min_relevance] for q in self.queries}
        self.neg = {q.query_id: [(p, r) for p, r in judged.get(q.query_id, []) if r < min_relevance]
                    for q in self.queries}
        self.train_queries = [q for q in self.queries if self.pos[q.query_id]]
        if not self.train_queries:
            raise ValueError(f"catalog has no {split} query with a product of relevance >= {min_relevance}")

    def text(self, product_id: str) -> str:
        return self.catalog.product_text(self.by_id[product_id])

    def pretrain_batch(self, size: int) -> tuple[list, list]:
        queries = self.rng.sample(self.queries, min(size, len(self.queries)))
        products = self.rng.sample(self.products, min(size, len(self.products)))
        return queries, products

    def finetune_batch(self, size: int) -> list[FinetuneExample]:
        out = []
        for q in self.rng.sample(self.train_queries, min(size, len(self.train_queries))):
            pos = self.by_id[self.rng.choice(self.pos[q.query_id])]
            if self.neg[q.query_id]:
                neg_id, rel = self.rng.choice(self.neg[q.query_id])
            else:
                neg_id, rel = self.rng.choice(self.products).product_id, 0
            neg = self.by_id[neg_id]
            out.append(FinetuneExample(q.text, q.aspects, self.catalog.product_text(pos), pos.aspects,
                                       self.catalog.product_text(neg), neg.aspects, rel / self.max_relevance))
        return out


def pretrain_step(model: BiEncoder, sampler: CatalogSampler, stage: StageConfig,
                  generator: torch.Generator | None = None) -> LossParts:
    queries, products = sampler.pretrain_batch(stage.batch_size)
    qb = make_batch(model, [q.text for q in queries], "query", [q.aspects for q in queries])
    db = make_batch(model, [sampler.catalog.product_text(p) for p in products], "doc", [p.aspects for p in products])
    return pretrain_loss(model, qb, db, stage, generator)


def finetune_batches(model: BiEncoder, examples: list[FinetuneExample]) -> tuple[TextBatch, TextBatch, TextBatch, torch.Tensor]:
    qb = make_batch(model, [e.query for e in examples], "query", [e.query_aspects for e in examples])
    pb = make_batch(model, [e.positive for e in examples], "doc", [e.positive_aspects for e in examples])
    nb = make_batch(model, [e.negative for e in examples], "doc", [e.negative_aspects for e in examples])
    return qb, pb, nb, torch.tensor([e.negative_relevance for e in examples])


def finetune_step(model: BiEncoder, sampler: CatalogSampler, stage: StageConfig,
                  pointwise: PointwiseCELoss | None, step: int = 0) -> LossParts:
    qb, pb, nb, neg_rel = finetune_batches(model, sampler.finetune_batch(stage.batch_size))
    negatives = nb if stage.hard_negatives > 0 else None
    return finetune_loss(model, qb, pb, negatives, stage, pointwise, neg_rel, step=step)


def train_stage(model: BiEncoder, sampler: CatalogSampler, stage: StageConfig, kind: str, seed: int = 0,
                on_log: Callable[[int, dict[str, float]], None] | None = None, progress: bool = True) -> list[dict]:
    """Run `stage.steps` optimiser steps of `kind` ("pretrain" or "finetune"); returns the loss history."""
    if kind not in ("pretrain", "finetune"):
        raise ValueError(f"stage kind must be pretrain or finetune, got {kind!r}")
    torch.manual_seed(seed)
    generator = torch.Generator().manual_seed(seed)
    pointwise = PointwiseCELoss(similarity=model.config.similarity) if kind == "finetune" else None
    params = list(model.parameters()) + (list(pointwise.parameters()) if pointwise is not None else [])
    optimizer = torch.optim.AdamW(params, lr=stage.learning_rate, weight_decay=stage.weight_decay)
    scheduler = get_linear_schedule_with_warmup(optimizer, int(stage.warmup_ratio * stage.steps), stage.steps)
    model.train()
    history = []
    bar = tqdm(range(stage.steps), desc=f"{model.config.name} {kind}", disable=not progress, leave=False)
    for step in bar:
        if kind == "pretrain":
            result = pretrain_step(model, sampler, stage, generator)
        else:
            result = finetune_step(model, sampler, stage, pointwise, step)
        optimizer.zero_grad(set_to_none=True)
        result.total.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        optimizer.step()
        scheduler.step()
        record = {"step": step + 1, **result.parts}
        history.append(record)
        bar.set_postfix(loss=f"{result.parts['loss']:.3f}")
        if on_log is not None and ((step + 1) % stage.log_every == 0 or step + 1 == stage.steps):
            on_log(step + 1, record)
    model.eval()
    return history
