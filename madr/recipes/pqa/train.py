"""Training the product-QA models (paper 002 Sec. 4.3, Eq. 3-5).

Questions are the queries; each example pairs a question with one of its positive evidences and one hard
negative drawn from the same question's negative candidates, besides the in-batch negatives.
`representation` picks the loss terms of Eq. 5: "hybrid" (L_dense + L_sparse + lambda_q FLOPS(q) +
lambda_d FLOPS(p), the joint model), "dense" (L_dense only: the independently trained dense encoder of
Table 3 row c) or "sparse" (L_sparse + FLOPS: row e, which "does not incorporate semantic matching in
computing the loss and the score", Sec. 5). All three use the same architecture (hybrid head on the same
backbone) and the same loop, so only the loss differs. An optional short MLM stage first grounds the MLM
head of a backbone trained from scratch.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
from transformers import PreTrainedTokenizerBase

from madr.config import BackboneConfig, ModelConfig, StageConfig
from madr.data.records import EvidenceRecord
from madr.modeling.model import BiEncoder, build_model
from madr.modeling.outputs import TowerOutput
from madr.recipes.pqa.config import REPRESENTATIONS
from madr.recipes.pqa.data import PQASampler
from madr.training.loop import Optimisation, finetune_batches, run_steps, train_stage
from madr.training.objectives import LossParts, hybrid_loss


def build_pqa_model(tokenizer: PreTrainedTokenizerBase, backbone: str | None = None,
                    tiny: dict[str, int] | None = None, sparse_top_k: int | None = 256,
                    max_query_length: int = 32, max_doc_length: int = 64, seed: int = 0,
                    shared_towers: bool = True, sparse_pooling: str = "max") -> BiEncoder:
    """A hybrid bi-encoder: a tiny BERT from scratch (`tiny` overrides its shape), or the pretrained
    `backbone` (a path or `pypi:<package>`). Paper 002 Fig. 2 draws two encoders of the same architecture;
    one shared tower (the default here) halves the parameters to learn from little data."""
    bb = BackboneConfig(name_or_path=backbone) if backbone else BackboneConfig(**({"tiny": tiny} if tiny else {}))
    cfg = ModelConfig(name="hybrid", backbone=bb, shared_towers=shared_towers, sparse_top_k=sparse_top_k,
                      sparse_pooling=sparse_pooling, max_query_length=max_query_length,
                      max_doc_length=max_doc_length, similarity="dot")
    return pqa_model(cfg, tokenizer, seed)


def pqa_model(cfg: ModelConfig, tokenizer: PreTrainedTokenizerBase, seed: int = 0) -> BiEncoder:
    """`build_model(cfg)` with the weights drawn under `torch.manual_seed(seed)`; `cfg.name` must be hybrid."""
    if not cfg.has_sparse:
        raise ValueError(f"product-QA models are hybrid (model.name=hybrid), got {cfg.name!r}")
    torch.manual_seed(seed)
    return build_model(cfg, tokenizer)


def representation_loss(q: TowerOutput, p: TowerOutput, n: TowerOutput | None, stage: StageConfig, step: int,
                        representation: str = "hybrid") -> LossParts:
    """The terms of paper 002 Eq. 5 that train one representation (`madr.losses.HybridLoss`).

    hybrid: L_dense + L_sparse + lambda_q FLOPS(q) + lambda_d FLOPS(p); dense: L_dense, Eq. 3 on the CLS dot
    products; sparse: L_sparse + the two FLOPS terms. The contrastive terms use in-batch plus hard negatives
    and temperature `stage.sparse_temperature`.
    """
    if representation not in REPRESENTATIONS:
        raise ValueError(f"representation must be one of {REPRESENTATIONS}, got {representation!r}")
    terms = ("dense", "sparse") if representation == "hybrid" else (representation,)
    return hybrid_loss(q, p, n, stage, step, terms)


def train_representation(model: BiEncoder, sampler: PQASampler, stage: StageConfig, representation: str = "hybrid",
                         seed: int = 0, on_step: Callable[[int, dict[str, float]], None] | None = None) -> list[dict]:
    """`stage.steps` steps of `madr.training.loop.Optimisation.for_stage` (AdamW, the stage's warm-up and
    decay, gradient clipping at 1.0) on `representation_loss`, one hard negative per question; returns the
    history."""
    torch.manual_seed(seed)
    params = [p for p in model.parameters() if p.requires_grad]

    def step_fn(step: int) -> LossParts:
        qb, pb, nb, _ = finetune_batches(model, sampler.finetune_batch(stage.batch_size))
        q = model.encode(qb.input_ids, qb.attention_mask, "query")
        p = model.encode(pb.input_ids, pb.attention_mask, "doc")
        n = model.encode(nb.input_ids, nb.attention_mask, "doc") if stage.hard_negatives > 0 else None
        return representation_loss(q, p, n, stage, step, representation)

    model.train()
    history = run_steps(Optimisation.for_stage(params, stage), stage.steps, step_fn, on_step)
    model.eval()
    return history


def train_pqa(model: BiEncoder, records: Sequence[EvidenceRecord], finetune: StageConfig,
              pretrain: StageConfig | None = None, seed: int = 0, progress: bool = False,
              representation: str = "hybrid") -> dict[str, list[dict]]:
    """Optional MLM warm-up (`madr.training.loop.train_stage`), then `representation`'s loss on the train split."""
    sampler = PQASampler(records, "train", seed)
    history = {}
    if pretrain is not None and pretrain.steps > 0:
        history["pretrain"] = train_stage(model, sampler, pretrain, "pretrain", seed=seed, progress=progress)
    history["finetune"] = train_representation(model, sampler, finetune, representation, seed)
    return history
