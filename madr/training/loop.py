"""In-process training: the optimiser step every training path takes, seeded catalog samplers and the loop of
one stage.

`Optimisation` is AdamW + a learning-rate schedule (`build_scheduler`: warm-up for `warmup_ratio` of the steps,
then linear or cosine decay, or constant) + gradient clipping at norm 1; `run_steps` drives it over a step
function and returns the loss history. `train_stage` (the aspect papers' stages), the pqa recipe, query-tower
distillation and the multi-task trainer use them in process; the Ray Train job (pipelines/train/engine.py) steps
the same `Optimisation` after its data-parallel backward passes.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

import torch
from tqdm.auto import tqdm
from transformers import get_cosine_schedule_with_warmup, get_linear_schedule_with_warmup

from madr.config import ModelConfig, StageConfig
from madr.data.schema import Catalog
from madr.modeling.batching import TextBatch, make_batch, model_device
from madr.modeling.model import BiEncoder
from madr.training.freezing import stage_frozen
from madr.training.memoised_backbone import stage_memoised
from madr.training.negatives import (
    MinedNegatives,
    check_mined,
    hard_negative,
    mine_negatives,
    read_index_negatives,
)
from madr.training.objectives import LossParts, pretrain_loss
from madr.training.stage_module import FinetuneBatch, StageModule

Schedule = Callable[[torch.optim.Optimizer], torch.optim.lr_scheduler.LRScheduler]


def _constant_with_warmup(stage: StageConfig) -> Callable[[int], float]:
    warm = int(stage.warmup_ratio * stage.steps)
    return lambda s: min(1.0, s / warm) if warm else 1.0


def build_scheduler(optimizer: torch.optim.Optimizer, stage: StageConfig) -> torch.optim.lr_scheduler.LambdaLR:
    """`stage.lr_schedule`: transformers' linear / cosine warm-up schedules, or constant after the warm-up."""
    warm = int(stage.warmup_ratio * stage.steps)
    if stage.lr_schedule == "linear":
        return get_linear_schedule_with_warmup(optimizer, warm, max(stage.steps, 1))
    if stage.lr_schedule == "cosine":
        return get_cosine_schedule_with_warmup(optimizer, warm, max(stage.steps, 1))
    return torch.optim.lr_scheduler.LambdaLR(optimizer, _constant_with_warmup(stage))


class Optimisation:
    """AdamW over `params`, an optional learning-rate schedule stepped with it, gradient clipping.

    `step(loss)`: zero the gradients, backpropagate `loss`, `apply()`. `apply()`: clip the gradients to
    `max_grad_norm` (None or 0: no clipping), step the optimiser, then the schedule; loops that run their own
    backward passes (data-parallel engines, gradient accumulation) call `zero_grad()` and `apply()` themselves.
    """

    def __init__(self, params: Iterable[torch.nn.Parameter], lr: float, weight_decay: float = 0.0,
                 schedule: Schedule | None = None, max_grad_norm: float | None = 1.0) -> None:
        self.params = list(params)
        self.optimizer = torch.optim.AdamW(self.params, lr=lr, weight_decay=weight_decay)
        self.scheduler = schedule(self.optimizer) if schedule is not None else None
        self.max_grad_norm = max_grad_norm

    @classmethod
    def for_stage(cls, params: Iterable[torch.nn.Parameter], stage: StageConfig) -> Optimisation:
        """The stage's learning rate and weight decay, `build_scheduler`'s schedule, clipping at 1."""
        return cls(params, stage.learning_rate, stage.weight_decay, lambda opt: build_scheduler(opt, stage))

    def zero_grad(self) -> None:
        self.optimizer.zero_grad(set_to_none=True)

    def apply(self) -> None:
        if self.max_grad_norm:
            torch.nn.utils.clip_grad_norm_(self.params, self.max_grad_norm)
        self.optimizer.step()
        if self.scheduler is not None:
            self.scheduler.step()

    def step(self, loss: torch.Tensor) -> None:
        self.zero_grad()
        loss.backward()
        self.apply()

    @property
    def lr(self) -> float:
        if self.scheduler is None:
            return float(self.optimizer.param_groups[0]["lr"])
        return float(self.scheduler.get_last_lr()[0])

    def state_dict(self) -> dict:
        return {"optimizer": self.optimizer.state_dict(),
                "scheduler": None if self.scheduler is None else self.scheduler.state_dict()}

    def load_state_dict(self, state: dict) -> None:
        self.optimizer.load_state_dict(state["optimizer"])
        if self.scheduler is not None:
            self.scheduler.load_state_dict(state["scheduler"])


def run_steps(optimisation: Optimisation, steps: int, step_fn: Callable[[int], LossParts],
              on_step: Callable[[int, dict[str, float]], None] | None = None,
              desc: str | None = None) -> list[dict]:
    """`steps` optimiser steps: `step_fn(step)` (step from 0) gives the loss, `optimisation.step` applies it.

    Returns the history, one `{"step": step + 1, **parts}` per step; `on_step(step + 1, record)` after each;
    `desc` shows a progress bar with that title.
    """
    history = []
    bar = tqdm(range(steps), desc=desc, disable=desc is None, leave=False)
    for step in bar:
        result = step_fn(step)
        optimisation.step(result.total)
        record = {"step": step + 1, **result.parts}
        history.append(record)
        if "loss" in result.parts:
            bar.set_postfix(loss=f"{result.parts['loss']:.3f}")
        if on_step is not None:
            on_step(step + 1, record)
    return history


@dataclass
class FinetuneExample:
    query: str
    query_aspects: dict[str, list[str]]
    positive: str
    positive_aspects: dict[str, list[str]]
    negative: str
    negative_aspects: dict[str, list[str]]
    negative_relevance: float  # graded relevance / max grade, the soft pointwise target
    weight: float = 1.0  # the positive's judgment weight (a click log's inverse-propensity weight)


class CatalogSampler:
    """Seeded training examples from a `Catalog`.

    Pretraining draws queries (query tower) and products (document tower) with their annotations.
    Fine-tuning draws a training query, one judged positive (relevance >= `min_relevance`) and one hard
    negative: a judged product of that query with lower relevance when there is one (paper 001 Sec.
    5.3.2: "a hard negative sample for each query besides in-batch negatives"), else a random product;
    with `mined` (`madr.training.negatives.mine_negatives`), one of the query's mined products instead
    (relevance 0: not judged relevant), falling back to the above for a query with none; `judged_share` of the
    queries with both take a judged one (`madr.training.negatives.hard_negative`). Each example carries its
    positive's judgment weight.
    Queries in one batch are distinct, so no query sees its own positive as an in-batch negative.
    """

    def __init__(self, catalog: Catalog, split: str = "train", seed: int = 0, min_relevance: int = 3,
                 max_relevance: int = 4, mined: MinedNegatives | None = None, judged_share: float = 0.0) -> None:
        self.catalog = catalog
        self.rng = random.Random(seed)
        self.products = list(catalog.products)
        self.product_ids = [p.product_id for p in self.products]
        self.by_id = {p.product_id: p for p in self.products}
        self.queries = list(catalog.queries_in(split))
        self.max_relevance, self.judged_share = max_relevance, judged_share
        judged: dict[str, list[tuple[str, int]]] = {}
        self.weight = {}
        for j in catalog.judgments:
            judged.setdefault(j.query_id, []).append((j.product_id, j.relevance))
            self.weight[j.query_id, j.product_id] = j.weight
        self.pos = {q.query_id: [p for p, r in judged.get(q.query_id, []) if r >= min_relevance] for q in self.queries}
        self.neg = {q.query_id: [(p, r) for p, r in judged.get(q.query_id, []) if r < min_relevance]
                    for q in self.queries}
        self.train_queries = [q for q in self.queries if self.pos[q.query_id]]
        self.mined = dict(mined or {})
        check_mined(self.mined, set(self.by_id))
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
            neg_id, rel = hard_negative(self.rng, self.mined.get(q.query_id, []), self.neg[q.query_id],
                                        self.product_ids, self.judged_share)
            neg = self.by_id[neg_id]
            out.append(FinetuneExample(q.text, q.aspects, self.catalog.product_text(pos), pos.aspects,
                                       self.catalog.product_text(neg), neg.aspects, rel / self.max_relevance,
                                       self.weight[q.query_id, pos.product_id]))
        return out


def stage_negatives(catalog: Catalog, stage: StageConfig, tokenizer, split: str = "train",
                    index_negatives: str | Path | None = None) -> MinedNegatives | None:
    """The hard negatives `stage.negatives` asks for: BM25's top `stage.mined_depth` per query on `tokenizer`'s
    lower-cased word pieces ("mined", `mine_negatives`), the mine stage's file `index_negatives` ("index",
    `read_index_negatives`), or None ("judged": the sampler's judged / random ones)."""
    if stage.negatives == "mined":
        return mine_negatives(catalog, split, tokenizer, stage.mined_depth)
    if stage.negatives == "index":
        if index_negatives is None:
            raise ValueError("train.finetune.negatives: index needs the mine stage's output file")
        return read_index_negatives(index_negatives)
    return None


def catalog_sampler(catalog: Catalog, stage: StageConfig, tokenizer, seed: int, split: str = "train",
                    index_negatives: str | Path | None = None) -> CatalogSampler:
    """The sampler of a fine-tuning `stage`, its hard negatives those of `stage_negatives`."""
    return CatalogSampler(catalog, split, seed=seed,
                          mined=stage_negatives(catalog, stage, tokenizer, split, index_negatives),
                          judged_share=stage.judged_negative_share)


def pretrain_batches(model: BiEncoder, sampler: CatalogSampler, size: int) -> tuple[TextBatch, TextBatch]:
    """The next pretraining batch: `size` search terms and `size` product texts with their aspect labels."""
    queries, products = sampler.pretrain_batch(size)
    qb = make_batch(model, [q.text for q in queries], "query", [q.aspects for q in queries])
    db = make_batch(model, [sampler.catalog.product_text(p) for p in products], "doc", [p.aspects for p in products])
    return qb, db


def pretrain_step(model: BiEncoder, sampler: CatalogSampler, stage: StageConfig,
                  generator: torch.Generator | None = None) -> LossParts:
    qb, db = pretrain_batches(model, sampler, stage.batch_size)
    return pretrain_loss(model, qb, db, stage, generator)


def example_weights(examples: list[FinetuneExample]) -> torch.Tensor | None:
    """The examples' weights (their positives' judgment weights), None when all are 1 (a judged catalog)."""
    weights = [e.weight for e in examples]
    return None if all(w == 1.0 for w in weights) else torch.tensor(weights)


def finetune_batches(model: BiEncoder, examples: list[FinetuneExample]) -> tuple[TextBatch, TextBatch, TextBatch, torch.Tensor]:
    qb = make_batch(model, [e.query for e in examples], "query", [e.query_aspects for e in examples])
    pb = make_batch(model, [e.positive for e in examples], "doc", [e.positive_aspects for e in examples])
    nb = make_batch(model, [e.negative for e in examples], "doc", [e.negative_aspects for e in examples])
    return qb, pb, nb, torch.tensor([e.negative_relevance for e in examples])


def finetune_step(module: StageModule, sampler: CatalogSampler, stage: StageConfig, step: int = 0) -> LossParts:
    """One fine-tuning batch's loss through the stage module (the objective the Ray Train job steps too)."""
    examples = sampler.finetune_batch(stage.batch_size)
    qb, pb, nb, neg_rel = finetune_batches(module.model, examples)
    batch = FinetuneBatch(qb, pb, nb if stage.hard_negatives > 0 else None, neg_rel, example_weights(examples))
    total, parts = module.loss(batch, step)
    return LossParts(total, parts)


def stage_runs(kind: str, stage: StageConfig, model_cfg: ModelConfig) -> bool:
    """Whether stage `kind` has anything to train: steps > 0, and a pretraining stage needs a backbone (DSSM has
    no MLM, paper 000 Sec. 8.2) and either L_MLM (`mlm_weight` > 0) or aspect losses to learn."""
    if stage.steps == 0:
        return False
    if kind != "pretrain":
        return True
    return model_cfg.pretrains_mlm and (stage.mlm_weight > 0 or model_cfg.learns_aspects)


def train_stage(model: BiEncoder, sampler: CatalogSampler, stage: StageConfig, kind: str, seed: int = 0,
                on_log: Callable[[int, dict[str, float]], None] | None = None, progress: bool = True) -> list[dict]:
    """Run `stage.steps` optimiser steps of `kind` ("pretrain" or "finetune") with `Optimisation.for_stage`;
    returns the loss history."""
    if kind not in ("pretrain", "finetune"):
        raise ValueError(f"stage kind must be pretrain or finetune, got {kind!r}")
    torch.manual_seed(seed)
    generator = torch.Generator().manual_seed(seed)
    module = StageModule("finetune", stage, model, gather=False).to(model_device(model)) if kind == "finetune" \
        else None
    params = list(model.parameters()) if module is None else list(module.parameters())

    def step_fn(step: int) -> LossParts:
        if module is None:
            return pretrain_step(model, sampler, stage, generator)
        return finetune_step(module, sampler, stage, step)

    def log(step: int, record: dict[str, float]) -> None:
        if on_log is not None and (step % stage.log_every == 0 or step == stage.steps):
            on_log(step, record)

    model.train()
    with stage_frozen(model, stage), stage_memoised(model, stage):
        params = [p for p in params if p.requires_grad]
        history = run_steps(Optimisation.for_stage(params, stage), stage.steps, step_fn, log,
                            desc=f"{model.config.name} {kind}" if progress else None)
    model.eval()
    return history
