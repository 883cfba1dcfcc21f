"""The combined pretraining and fine-tuning objectives of the two aspect papers: pretraining and the pieces of
fine-tuning (aspect losses, pair weights, the hybrid loss); `madr.training.stage_module.StageModule` puts the
fine-tuning objective together for every training path.

Pretraining, per tower input X (queries through the query tower, products through the document tower):
    MADRAL / MtBERT (paper 000 Eq. 7): L_MLM + sum_{a != OTHER} (L_AP^a + L_APP^a)
    MURAL (paper 001 Eq. 9):          L_MLM + lambda * L_A, L_A grouped by Eq. 3 / 4 / 5
    models without aspect learning:   L_MLM
Fine-tuning:
    paper 000 Eq. 8: L_CE + L_SCE + lambda * sum_{a != OTHER} (L_AP^a + L_APP^a)(Q and D)
    paper 001 Eq. 10: L_SCE with one hard negative per query (set pointwise_weight=0, aspect_weight=0;
        aspect_weight > 0 adds lambda * L_A, which Sec. 6.4 found to raise aspect accuracy but hurt retrieval)
    paper 002 Eq. 3-5 (hybrid): L_dense + L_sparse + lambda_q FLOPS(queries) + lambda_d FLOPS(passages)
    a model with `model.sparse_head`: its own loss above + L_sparse + the two FLOPS terms
OTHER never receives an aspect loss: it has no annotations and no objective key.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from madr.config import StageConfig
from madr.losses import (
    AspectPredictionLoss,
    AspectPresenceLoss,
    HybridLoss,
    MLMLoss,
    combine_objectives,
    mask_tokens,
)
from madr.losses.mlm import IGNORE_INDEX
from madr.modeling.batching import TextBatch
from madr.modeling.model import BiEncoder, objective_keys
from madr.modeling.outputs import TowerOutput


def _value(t: torch.Tensor) -> float:
    return float(t.detach())


@dataclass
class LossParts:
    total: torch.Tensor
    parts: dict[str, float]


def aspect_loss(model: BiEncoder, out: TowerOutput, batch: TextBatch, side: str) -> tuple[torch.Tensor, dict[str, float]]:
    """Aspect learning loss of one tower's output (zero, still on the graph, for models without it).

    Reads the per-row scores `out.aspect_logits` that `BiEncoder.encode` fills from the shared tables, so the
    same call works on a tower output and on representations alone (the training job's GradCache pass 2).
    """
    cfg = model.config
    zero = out.embedding.sum() * 0.0
    keys = objective_keys(cfg)
    if not keys or not batch.aspect_labels:
        return zero, {}
    parts: dict[str, float] = {}
    if cfg.uses_granularities:
        total = mural_aspect_loss(model, out, batch)
        parts["aspect"] = _value(total)
        return total, parts
    # MADRAL / MtBERT: sum over explicit aspects of AP (Eq. 3) (+ APP, Eq. 6, with Presence Weighting)
    total = zero
    ap = AspectPredictionLoss()
    for key, _, _ in keys:
        loss = ap(out.aspect_logits[key], batch.aspect_labels[key])
        parts[f"ap_{key}"] = _value(loss)
        total = total + loss
    if out.presence_logits is not None and batch.aspect_present is not None:
        n = len(cfg.aspects)
        labels = torch.zeros_like(out.presence_logits)
        labels[:, :n] = batch.aspect_present
        mask = torch.zeros(out.presence_logits.shape[1], dtype=torch.bool, device=labels.device)
        mask[:n] = True  # components after the explicit aspects (OTHER) get no loss
        app = AspectPresenceLoss()(out.presence_logits, labels, aspect_mask=mask) * n  # mean -> sum over aspects
        parts["app"] = _value(app)
        total = total + app
    return total, parts


def mural_aspect_loss(model: BiEncoder, out: TowerOutput, batch: TextBatch) -> torch.Tensor:
    """MURAL's L_A: the group-wise contrastive loss (paper 001 Eq. 2) of every (aspect, granularity), grouped by
    Eq. 3 / 4 / 5. `out.aspect_logits[key]` is `h_a^g . E_a^g` (`ValueEmbeddings`: sim is the dot product), so
    Eq. 2 is the multi-label NLL of those scores (`GroupWiseContrastiveLoss` = `AspectPredictionLoss` on them)."""
    losses, has = {}, {}
    for key, aspect, gran in objective_keys(model.config):
        labels = batch.aspect_labels[key]
        losses[(aspect, gran)] = AspectPredictionLoss()(out.aspect_logits[key], labels)
        has[(aspect, gran)] = bool((labels >= 0).any())
    return combine_objectives(losses, has, model.config.grouping)


def mlm_loss(model: BiEncoder, batch: TextBatch, side: str, probability: float,
             generator: torch.Generator | None = None) -> tuple[torch.Tensor, TowerOutput]:
    """Mask the batch (BERT 80/10/10), encode it and return L_MLM and the tower output."""
    tok = model.tokenizer
    masked, labels = mask_tokens(batch.input_ids, batch.attention_mask, tok.mask_token_id, len(tok),
                                 tok.all_special_ids, probability=probability, generator=generator)
    out = model.encode(masked, batch.attention_mask, side)
    if model.tower(side).mlm_head is None:
        return out.embedding.sum() * 0.0, out
    predicted = labels != IGNORE_INDEX  # logits at the masked positions only (the loss ignores the rest)
    return MLMLoss()(model.tower(side).mlm_logits(out, predicted), labels[predicted]), out


def pretrain_loss(model: BiEncoder, queries: TextBatch, docs: TextBatch, stage: StageConfig,
                  generator: torch.Generator | None = None) -> LossParts:
    """Eq. 7 (paper 000) / Eq. 9 (paper 001): `stage.mlm_weight` x MLM on both sides, aspect losses on
    `model.aspect_sides` (with `mlm_weight` 0 the inputs are not masked and only the aspect losses train)."""
    total = None
    parts: dict[str, float] = {}
    for side, batch in (("query", queries), ("doc", docs)):
        if stage.mlm_weight > 0:
            mlm, out = mlm_loss(model, batch, side, stage.mlm_probability, generator)
        else:  # aspect losses only: unmasked input, no vocabulary projection
            out = model.encode(batch.input_ids, batch.attention_mask, side)
            mlm = out.embedding.sum() * 0.0
        loss = stage.mlm_weight * mlm
        if side in model.config.aspect_sides:
            asp, asp_parts = aspect_loss(model, out, batch, side)
            loss = loss + stage.aspect_weight * asp
            parts.update({f"{side}_{k}": v for k, v in asp_parts.items()})
        total = loss if total is None else total + loss
        parts[f"{side}_mlm"] = _value(mlm)
    parts["loss"] = _value(total)
    return LossParts(total, parts)


def pair_weights(weights: torch.Tensor | None, pairs: int, device: torch.device) -> torch.Tensor | None:
    """Per-pair weights of L_CE: the rows' weights on their (query, positive) pairs, 1 on the (query, hard
    negative) pairs that follow them (None when the rows carry no weights)."""
    if weights is None:
        return None
    weights = weights.to(device)
    return torch.cat([weights, torch.ones(pairs - len(weights), device=device, dtype=weights.dtype)])


def hybrid_loss(q: TowerOutput, p: TowerOutput, n: TowerOutput | None, stage: StageConfig, step: int,
                terms: tuple[str, ...] = ("dense", "sparse")) -> LossParts:
    """Paper 002 Eq. 3-5 (`madr.losses.HybridLoss`) on tower outputs: dense (CLS) and sparse (top-k term
    weights) dot products with in-batch plus hard negatives at `stage.sparse_temperature`, + FLOPS whose
    weights warm up quadratically over `stage.flops_warmup_steps`; `terms` keeps one representation only."""
    total, values = HybridLoss.from_stage(stage, terms=terms)(
        q.embedding, p.embedding, None if n is None else n.embedding,
        q.sparse, p.sparse, None if n is None else n.sparse, step)
    parts = {k: _value(v) for k, v in values.items()}
    if "sparse" in terms:
        parts["nnz_q"] = float((q.sparse > 0).sum(-1).float().mean())
    parts["loss"] = _value(total)
    return LossParts(total, parts)
