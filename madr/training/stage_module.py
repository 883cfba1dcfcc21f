"""What a stage trains: the model plus the stage's losses, as one `nn.Module` whose `forward` returns the loss.
The in-process loop (`madr.training.loop.train_stage`) steps it, and the Ray Train job's DDP / DeepSpeed engines
(`pipelines.train.engine`) wrap it: one objective for every training path.

* pretrain: paper 000 Eq. 7 / paper 001 Eq. 9 (`madr.training.objectives.pretrain_loss`): per-row losses, so each
  worker's mean is averaged over workers by the gradient all-reduce.
* finetune: paper 000 Eq. 8 / paper 001 Eq. 10 / paper 002 Eq. 3-5 (hybrid), written as
  - a *representation* loss over the batch: L_SCE with in-batch negatives (gathered from every worker when
    `gather`; `madr.training.distributed.GatheredInBatchSoftmaxLoss`), plus the aspect losses on
    `model.aspect_sides` (Eq. 8's lambda term; for MURAL the optional lambda * L_A, paper 001 Eq. 2-5, whose value
    scores h_a^g . E_a^g are per-row logits like MADRAL's) from the aspect / presence logits; for the hybrid model
    dense + sparse contrastive terms (gathered) + FLOPS; a `model.sparse_head` model adds the sparse term
    (gathered) + FLOPS to its own loss;
  - a *row-local* loss: pointwise L_CE on each (query, positive) / (query, hard negative) pair (target 1 / the
    negative's relevance), its (query, positive) pairs weighted like their rows.
  `FinetuneBatch.weights [B]` (optional) weight each row's L_SCE term and its positive pair's L_CE term (a click
  log's clipped inverse-propensity weights, `madr.clicks.judgments`). The split lets GradCache
  (`madr.training.gradcache`) cache gradients of the representations and recompute chunk by chunk.
* distill: paper 004 Sec. V-A, L2 between the student's and the frozen teacher's query embeddings.
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from madr.config import StageConfig
from madr.losses import DistillationMSELoss, HybridLoss, PointwiseCELoss
from madr.modeling.batching import TextBatch
from madr.modeling.model import BiEncoder, Tower, objective_keys
from madr.modeling.outputs import TowerOutput
from madr.training.distributed import GatheredInBatchSoftmaxLoss
from madr.training.gradcache import Reps, dot_surrogate
from madr.training.objectives import aspect_loss, pair_weights, pretrain_loss

KINDS = ("pretrain", "finetune", "distill")


@dataclass
class PretrainBatch:
    queries: TextBatch
    docs: TextBatch
    seed: int  # MLM masking generator seed (derived from step and rank: resumable)


@dataclass
class FinetuneBatch:
    queries: TextBatch
    positives: TextBatch
    negatives: TextBatch | None
    neg_relevance: torch.Tensor
    weights: torch.Tensor | None = None  # per-row weights (a click log's inverse-propensity weights); None: all 1


@dataclass
class DistillBatch:
    input_ids: torch.Tensor
    attention_mask: torch.Tensor


def num_rows(batch: Any) -> int:
    if isinstance(batch, PretrainBatch):
        return len(batch.queries.input_ids)
    if isinstance(batch, FinetuneBatch):
        return len(batch.queries.input_ids)
    return len(batch.input_ids)


def step_seed(seed: int, rank: int, step: int, micro: int = 0) -> int:
    """A per-(rank, step, micro-batch) seed: dropout and masking replay exactly after a resume."""
    return zlib.crc32(f"{seed}/{rank}/{step}/{micro}".encode()) & 0x7FFFFFFF


def _float(t: torch.Tensor | None) -> torch.Tensor | None:
    """Losses run in at least float32: bf16 / fp16 representations are upcast, float32 / float64 kept (a
    float64 model keeps float64 losses, which the distributed-equivalence tests rely on)."""
    if t is None or t.dtype not in (torch.float16, torch.bfloat16):
        return t
    return t.float()


def _without_scalar_parameters(module: nn.Module) -> nn.Module:
    """0-dim parameters reshaped to [1] (same values, same broadcasting): DeepSpeed's initial parameter
    broadcast views every parameter as bytes, which fails on 0-dim tensors (PointwiseCELoss scale / bias)."""
    for sub in module.modules():
        for name, param in list(sub._parameters.items()):
            if param is not None and param.dim() == 0:
                sub._parameters[name] = nn.Parameter(param.detach().reshape(1), requires_grad=param.requires_grad)
    return module


class StageModule(nn.Module):
    """Model + losses of one stage; `forward(mode, batch, ...)` so that DDP / DeepSpeed see one call per backward.

    Modes: "loss" -> (loss, parts) on a whole micro-batch; "surrogate" -> GradCache pass-3 scalar of a chunk
    (`surrogate(chunk, cached_grads, weight)`); "reps" -> finetune representations (GradCache pass 1).
    """

    def __init__(self, kind: str, stage: StageConfig, model: BiEncoder | None = None, *, gather: bool = True,
                 student: Tower | None = None, teacher: Tower | None = None) -> None:
        super().__init__()
        if kind not in KINDS:
            raise ValueError(f"stage kind must be one of {', '.join(KINDS)}, got {kind!r}")
        self.kind, self.stage = kind, stage
        self.model = model
        self.pointwise: PointwiseCELoss | None = None
        if kind in ("pretrain", "finetune") and model is None:
            raise ValueError(f"{kind} needs a model")
        if kind == "finetune":
            cfg = model.config
            if not cfg.hybrid_objective and stage.pointwise_weight > 0:
                self.pointwise = _without_scalar_parameters(PointwiseCELoss(similarity=cfg.similarity))
            temperature = cfg.temperature if cfg.similarity == "cosine" else 1.0
            if cfg.hybrid_objective:
                self.sce = GatheredInBatchSoftmaxLoss("dot", stage.sparse_temperature, gather=gather)
                self.hybrid = HybridLoss.from_stage(stage, contrastive=self.sce)
            else:
                self.sce = GatheredInBatchSoftmaxLoss(cfg.similarity, temperature, gather=gather)
                if cfg.has_sparse:  # `model.sparse_head`: + the sparse term and FLOPS of Eq. 3-5
                    self.hybrid = HybridLoss.from_stage(
                        stage, GatheredInBatchSoftmaxLoss("dot", stage.sparse_temperature, gather=gather), ("sparse",))
        if kind == "distill":
            if student is None or teacher is None:
                raise ValueError("distill needs a student and a teacher tower")
            self.student, self.teacher = student, teacher
            for p in self.teacher.parameters():
                p.requires_grad_(False)
            self.mse = DistillationMSELoss()

    def train(self, mode: bool = True) -> StageModule:
        super().train(mode)
        if self.kind == "distill":
            self.teacher.eval()  # the teacher is frozen: no dropout
        return self

    # -- dispatch ------------------------------------------------------------------------------
    def forward(self, mode: str, batch: Any, *extra: Any) -> Any:
        if mode == "loss":
            return self.loss(batch, *extra)
        if mode == "surrogate":
            return self.surrogate(batch, *extra)
        if mode == "reps":
            return self.finetune_reps(self.encode_finetune(batch))
        raise ValueError(f"unknown StageModule mode {mode!r}")

    def loss(self, batch: Any, step: int = 0) -> tuple[torch.Tensor, dict[str, float]]:
        if self.kind == "pretrain":
            gen = torch.Generator().manual_seed(batch.seed)
            out = pretrain_loss(self.model, batch.queries, batch.docs, self.stage, gen)
            return out.total, out.parts
        if self.kind == "distill":
            with torch.no_grad():
                target = self.teacher(batch.input_ids, batch.attention_mask).embedding
            pred = self.student(batch.input_ids, batch.attention_mask).embedding
            value = self.mse(_float(pred), _float(target))
            return value, {"loss": float(value.detach())}
        outs = self.encode_finetune(batch)
        rep, parts = self.rep_loss(self.finetune_reps(outs), batch, step)
        local, local_parts = self.local_loss(outs[0].embedding, outs[1].embedding,
                                             None if outs[2] is None else outs[2].embedding, batch)
        total = rep + local
        parts.update(local_parts)
        parts["loss"] = float(total.detach())
        return total, parts

    # -- finetune pieces -----------------------------------------------------------------------
    def encode_finetune(self, batch: FinetuneBatch) -> tuple[TowerOutput, TowerOutput, TowerOutput | None]:
        m = self.model
        q = m.encode(batch.queries.input_ids, batch.queries.attention_mask, "query")
        p = m.encode(batch.positives.input_ids, batch.positives.attention_mask, "doc")
        n = None
        if batch.negatives is not None and self.stage.hard_negatives > 0:
            n = m.encode(batch.negatives.input_ids, batch.negatives.attention_mask, "doc")
        return q, p, n

    def _aspect_terms(self) -> list[str]:
        if self.stage.aspect_weight <= 0 or self.model.config.hybrid_objective:
            return []
        return [k for k, _, _ in objective_keys(self.model.config)]

    def finetune_reps(self, outs: tuple[TowerOutput, TowerOutput, TowerOutput | None]) -> Reps:
        """Every per-row tensor the batch loss reads: embeddings (+ sparse vectors, aspect/presence logits)."""
        reps: Reps = {}
        for name, out in zip(("q", "p", "n"), outs, strict=True):
            if out is None:
                continue
            reps[name] = out.embedding
            if self.model.config.has_sparse:
                reps[f"{name}_sparse"] = out.sparse
            if name != "n":
                for key in self._aspect_terms():
                    if key in out.aspect_logits:
                        reps[f"{name}_logits/{key}"] = out.aspect_logits[key]
                if self._aspect_terms() and out.presence_logits is not None:
                    reps[f"{name}_presence"] = out.presence_logits
        return reps

    def rep_loss(self, reps: Reps, batch: FinetuneBatch, step: int) -> tuple[torch.Tensor, dict[str, float]]:
        """The batch-coupled part of the fine-tuning loss, from representations only (see module docstring)."""
        cfg = self.model.config
        q, p, n = _float(reps["q"]), _float(reps["p"]), _float(reps.get("n"))
        if cfg.hybrid_objective:
            return self._hybrid(reps, step)
        sce = self.sce(q, p, n, batch.weights)
        total, parts = sce, {"sce": float(sce.detach())}
        if self._aspect_terms():
            for side, name, tb in (("query", "q", batch.queries), ("doc", "p", batch.positives)):
                if side not in cfg.aspect_sides:
                    continue
                out = TowerOutput(embedding=reps[name],
                                  aspect_logits={k: reps[f"{name}_logits/{k}"] for k in self._aspect_terms()},
                                  presence_logits=reps.get(f"{name}_presence"))
                asp, asp_parts = aspect_loss(self.model, out, tb, side)
                total = total + self.stage.aspect_weight * asp
                parts.update({f"{side}_{k}": v for k, v in asp_parts.items()})
        if cfg.has_sparse:  # the sparse head beside the model's own vector
            sparse, sparse_parts = self._hybrid(reps, step)
            total = total + sparse
            parts.update({f"sparse_{k}": v for k, v in sparse_parts.items() if k != "loss"})
        return total, parts

    def _hybrid(self, reps: Reps, step: int) -> tuple[torch.Tensor, dict[str, float]]:
        """Paper 002 Eq. 3-5 (`madr.losses.HybridLoss`): dense + sparse contrastive terms (negatives gathered)
        + FLOPS on this worker's rows."""
        total, parts = self.hybrid(_float(reps["q"]), _float(reps["p"]), _float(reps.get("n")),
                                   _float(reps["q_sparse"]), _float(reps["p_sparse"]), _float(reps.get("n_sparse")),
                                   step)
        values = {k: float(v) for k, v in parts.items()}
        if reps.get("q_sparse") is not None:
            values["nnz_q"] = float((reps["q_sparse"] > 0).sum(-1).float().mean())
        return total, values

    def local_loss(self, q: torch.Tensor, p: torch.Tensor, n: torch.Tensor | None, batch: FinetuneBatch,
                   weight: float = 1.0) -> tuple[torch.Tensor, dict[str, float]]:
        """Pointwise L_CE on the row-aligned judged pairs (a mean over rows: chunks add up with `weight`)."""
        if self.pointwise is None:
            return q.sum() * 0.0, {}
        q, p = _float(q), _float(p)
        qs, docs, target = q, p, torch.ones(len(p), device=p.device, dtype=p.dtype)
        if n is not None:
            qs, docs = torch.cat([q, q]), torch.cat([p, _float(n)])
            target = torch.cat([target, batch.neg_relevance.to(p.device, p.dtype)])
        ce = self.pointwise(qs, docs, target, pair_weights(batch.weights, len(qs), p.device))
        return self.stage.pointwise_weight * ce * weight, {"ce": float(ce.detach())}

    def surrogate(self, chunk: FinetuneBatch, grads: Reps, weight: float) -> torch.Tensor:
        """GradCache pass 3 for one chunk: `<reps, cached grads>` + `weight` x the chunk's row-local loss."""
        outs = self.encode_finetune(chunk)
        reps = self.finetune_reps(outs)
        local, _ = self.local_loss(outs[0].embedding, outs[1].embedding,
                                   None if outs[2] is None else outs[2].embedding, chunk, weight)
        return dot_surrogate(reps, grads) + local
