"""torch.distributed helpers for data-parallel contrastive training (no Ray here: pipelines/train uses them).

In-batch negatives across workers (paper 000 L_SCE, paper 001 Eq. 10 with the batch of all workers):
each worker encodes its own rows, gathers every worker's documents, and scores *its own* queries
against all of them; query i of rank r has its positive at column `offset_r + i`, where `offset_r` is
the number of rows of the ranks before r. Two mistakes make such a loss silently wrong (the bug fixed
in sentence-transformers PR 3453): gathering without gradient (the other workers' queries then never
push on this worker's documents), or labels without the rank offset. `gather_with_grad` keeps the
gradient: its backward sums the gradient of the gathered tensor over all workers (an all-reduce) and
hands each worker the rows it contributed. `local_loss_scale` turns a local sum into the share of the
global mean, so that averaging gradients over workers (DDP, DeepSpeed) gives exactly the gradient of
the single-process loss on the concatenated batch, even when the workers hold different row counts.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from madr.losses.in_batch_softmax import SIMILARITIES, InBatchSoftmaxLoss


def is_distributed() -> bool:
    """True when a torch.distributed process group is initialised."""
    return dist.is_available() and dist.is_initialized()


def world_size(group: dist.ProcessGroup | None = None) -> int:
    return dist.get_world_size(group) if is_distributed() else 1


def rank(group: dist.ProcessGroup | None = None) -> int:
    return dist.get_rank(group) if is_distributed() else 0


def gather_sizes(n: int, device: torch.device, group: dist.ProcessGroup | None = None) -> list[int]:
    """The row count of every rank (`[n]` without a process group)."""
    if world_size(group) == 1:
        return [n]
    local = torch.tensor([n], dtype=torch.long, device=device)
    out = [torch.zeros_like(local) for _ in range(world_size(group))]
    dist.all_gather(out, local, group=group)
    return [int(t) for t in out]


class _GatherWithGrad(torch.autograd.Function):
    """all_gather along dim 0 (rows may differ per rank); backward: all-reduce(sum), keep own rows."""

    @staticmethod
    def forward(ctx, tensor: torch.Tensor, sizes: list[int], group: dist.ProcessGroup | None) -> torch.Tensor:
        me = rank(group)
        ctx.group, ctx.lo, ctx.hi = group, sum(sizes[:me]), sum(sizes[: me + 1])
        width = max(sizes)
        padded = tensor.new_zeros((width, *tensor.shape[1:]))
        padded[: tensor.shape[0]] = tensor
        parts = [torch.empty_like(padded) for _ in sizes]
        dist.all_gather(parts, padded.contiguous(), group=group)
        return torch.cat([p[:n] for p, n in zip(parts, sizes, strict=True)])

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> tuple[torch.Tensor, None, None]:
        grad = grad.contiguous().clone()
        dist.all_reduce(grad, op=dist.ReduceOp.SUM, group=ctx.group)
        return grad[ctx.lo: ctx.hi], None, None


def gather_with_grad(tensor: torch.Tensor, group: dist.ProcessGroup | None = None) -> tuple[torch.Tensor, int]:
    """(rows of every rank concatenated in rank order, this rank's first row in it).

    The gradient of the result flows back to `tensor` summed over all ranks (each rank's loss
    contributes). Without a process group (or with one worker) this is `(tensor, 0)`.
    """
    if world_size(group) == 1:
        return tensor, 0
    sizes = gather_sizes(tensor.shape[0], tensor.device, group)
    return _GatherWithGrad.apply(tensor, sizes, group), sum(sizes[: rank(group)])


def all_gather_no_grad(tensor: torch.Tensor, group: dist.ProcessGroup | None = None) -> torch.Tensor:
    """Concatenated rows of every rank, detached (for metrics and teachers, never for a loss)."""
    with torch.no_grad():
        return gather_with_grad(tensor.detach(), group)[0] if world_size(group) > 1 else tensor.detach()


def local_loss_scale(n_local: int, n_global: int, group: dist.ProcessGroup | None = None) -> float:
    """Factor turning a *sum* of this rank's per-row losses into its share of the global mean, such that
    the mean over ranks (what DDP / DeepSpeed gradient averaging computes) is the global mean."""
    return world_size(group) / max(n_global, 1) if n_local else 0.0


def mean_over_ranks(values: dict[str, float], group: dist.ProcessGroup | None = None) -> dict[str, float]:
    """Mean of scalar metrics over the ranks that have each key (a collective: every rank must call it)."""
    if world_size(group) == 1:
        return dict(values)
    gathered: list[dict[str, float] | None] = [None] * world_size(group)
    dist.all_gather_object(gathered, dict(values), group=group)
    keys = {k for g in gathered for k in g}
    return {k: sum(g[k] for g in gathered if k in g) / sum(1 for g in gathered if k in g) for k in sorted(keys)}


class GatheredInBatchSoftmaxLoss(nn.Module):
    """In-batch softmax cross entropy over the documents of *all* workers (paper 000 Eq. 8 L_SCE,
    paper 001 Eq. 10), correct under data parallelism (see the module docstring).

    Columns are every worker's positives (in rank order) followed by every worker's hard negatives;
    local query i targets column `offset + i`. The returned value is this worker's share of the global
    mean (`local_loss_scale`): averaged over workers it equals `InBatchSoftmaxLoss` on the concatenated
    batch, and so do the averaged gradients. With one process it is exactly `InBatchSoftmaxLoss`.

    Inputs as `InBatchSoftmaxLoss`: `q [b, d]`, `d_pos [b, d]`, optional hard negatives `[b, n, d]` or `[N, d]`.
    `gather=False` keeps negatives local (each worker's own batch; the loss is then the local mean). `weights [b]`
    weight each local query's term (per-example weights, as `InBatchSoftmaxLoss`).
    """

    def __init__(self, similarity: str = "dot", temperature: float = 1.0, gather: bool = True,
                 group: dist.ProcessGroup | None = None) -> None:
        super().__init__()
        if similarity not in SIMILARITIES:
            raise ValueError(f"similarity {similarity!r} is not one of {', '.join(SIMILARITIES)}")
        if temperature <= 0:
            raise ValueError(f"temperature must be > 0, got {temperature}")
        self.similarity, self.temperature, self.gather, self.group = similarity, temperature, gather, group

    def forward(self, q: torch.Tensor, d_pos: torch.Tensor, hard_negatives: torch.Tensor | None = None,
                weights: torch.Tensor | None = None) -> torch.Tensor:
        if not self.gather or world_size(self.group) == 1:
            return InBatchSoftmaxLoss(self.similarity, self.temperature)(q, d_pos, hard_negatives, weights)
        if q.dim() != 2 or q.shape != d_pos.shape:
            raise ValueError(f"q {tuple(q.shape)} and d_pos {tuple(d_pos.shape)} must both be [batch, dim]")
        all_pos, offset = gather_with_grad(d_pos, self.group)
        docs = all_pos
        if hard_negatives is not None:
            negs = hard_negatives.reshape(-1, q.shape[1])
            all_negs, _ = gather_with_grad(negs, self.group)
            docs = torch.cat([all_pos, all_negs])
        logits = InBatchSoftmaxLoss.scores(q, docs, self.similarity) / self.temperature
        target = torch.arange(q.shape[0], device=q.device) + offset
        terms = F.cross_entropy(logits, target, reduction="none")
        total = (terms * weights.to(terms)).sum() if weights is not None else terms.sum()
        return total * local_loss_scale(q.shape[0], all_pos.shape[0], self.group)
