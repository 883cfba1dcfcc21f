"""Gradient caching (GradCache, Gao et al. 2021, "Scaling Deep Contrastive Learning Batch Size under Memory
Limited Setup"): a contrastive loss over a large batch with the memory of one small chunk.

A contrastive loss such as L_SCE (paper 000 Eq. 8, paper 001 Eq. 10; the papers train at batch 1024)
couples every row of the batch only through the *representations*. So the step is split in three passes:

1. encode the batch chunk by chunk without a graph (no activations kept), recording each chunk's RNG state;
2. compute the loss on the concatenated representations (detached leaves), backward to the
   representations only: their gradients are cached (this pass may gather across workers);
3. re-encode each chunk with a graph, replaying its RNG state (same dropout masks as pass 1), and
   backpropagate `sum <rep, cached grad>` (+ the chunk's own per-row losses): the parameter gradients
   sum to exactly those of plain backprop on the whole batch.

Peak activation memory is one chunk's instead of the batch's; the price is a second forward pass.
`gradcache_step` is model-agnostic: callers pass how a chunk is encoded, the batch loss on
representations, and the chunk surrogate (which may run through a DDP / DeepSpeed wrapper).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch
from torch.utils.checkpoint import get_device_states, set_device_states

Reps = dict[str, torch.Tensor]


class RandContext:
    """The RNG state (CPU + the CUDA devices of `tensors`) at construction, replayed inside `with`.

    Outside the block the RNG continues as if the block had not run (`torch.random.fork_rng`).
    """

    def __init__(self, *tensors: torch.Tensor) -> None:
        self.cpu_state = torch.get_rng_state()
        self.devices, self.device_states = get_device_states(*tensors)
        self._fork: Any = None

    def __enter__(self) -> RandContext:
        self._fork = torch.random.fork_rng(devices=self.devices, enabled=True)
        self._fork.__enter__()
        torch.set_rng_state(self.cpu_state)
        set_device_states(self.devices, self.device_states)
        return self

    def __exit__(self, *exc: object) -> None:
        self._fork.__exit__(*exc)
        self._fork = None


def chunk_slices(n: int, size: int) -> list[slice]:
    """Consecutive row ranges of at most `size` rows covering `n` rows (one range when size <= 0)."""
    if size <= 0 or size >= n:
        return [slice(0, n)]
    return [slice(lo, min(lo + size, n)) for lo in range(0, n, size)]


def take_rows(batch: Any, rows: slice) -> Any:
    """Rows `rows` of every tensor / list / array in a (nested) mapping or dataclass-like batch."""
    if isinstance(batch, torch.Tensor) or hasattr(batch, "__array__") and not isinstance(batch, Mapping):
        return batch[rows]
    if isinstance(batch, Mapping):
        return {k: take_rows(v, rows) for k, v in batch.items()}
    if isinstance(batch, list | tuple):
        return type(batch)(batch[rows])
    if hasattr(batch, "__dataclass_fields__"):
        import dataclasses

        return dataclasses.replace(batch, **{f: take_rows(getattr(batch, f), rows)
                                            for f in batch.__dataclass_fields__ if getattr(batch, f) is not None})
    return batch


def dot_surrogate(reps: Mapping[str, torch.Tensor], grads: Mapping[str, torch.Tensor]) -> torch.Tensor:
    """`sum_k <reps[k], grads[k]>`: its gradient w.r.t. the parameters is the chain rule through the cached
    representation gradients (keys missing from `grads` contribute nothing)."""
    total = None
    for key, grad in grads.items():
        term = (reps[key] * grad.to(reps[key].dtype)).sum()
        total = term if total is None else total + term
    if total is None:
        raise ValueError("dot_surrogate: no cached gradient matches the representations")
    return total


def gradcache_step(chunks: Sequence[Any], encode: Callable[[Any], Reps], rep_loss: Callable[[Reps], torch.Tensor],
                   surrogate: Callable[[int, Any, Reps], torch.Tensor],
                   backward: Callable[[torch.Tensor, bool], None] | None = None,
                   check: bool = False, atol: float = 1e-5) -> tuple[torch.Tensor, Reps]:
    """One GradCache step (see the module docstring); returns (detached batch loss, cached rep gradients).

    Args:
        chunks: the batch, split by rows (e.g. with `chunk_slices` + `take_rows`).
        encode: chunk -> named representations `[rows, ...]` (run under `no_grad` in pass 1).
        rep_loss: concatenated representations -> scalar batch loss (pass 2; may gather across workers).
        surrogate: (chunk index, chunk, cached gradients of that chunk's rows) -> scalar whose backward
            gives the chunk's parameter gradients; usually `dot_surrogate(encode(chunk), grads)` plus the
            chunk's per-row losses. It must re-encode the chunk (it runs inside the chunk's RandContext).
        backward: (surrogate, is_last_chunk) -> None; default `surrogate.backward()`. Use it to let a
            DDP / DeepSpeed wrapper synchronise gradients only after the last chunk.
        check: re-encode each chunk under its RandContext and raise if the representations differ from pass 1.
    """
    if not chunks:
        raise ValueError("gradcache_step: empty batch")
    states, parts = [], []
    with torch.no_grad():
        for chunk in chunks:
            states.append(RandContext(*_tensors(chunk)))
            parts.append({k: v.detach() for k, v in encode(chunk).items()})
    keys = list(parts[0])
    full = {k: torch.cat([p[k] for p in parts]).requires_grad_(True) for k in keys}
    loss = rep_loss(full)
    grads = dict(zip(keys, torch.autograd.grad(loss, [full[k] for k in keys], allow_unused=True), strict=True))
    grads = {k: (torch.zeros_like(full[k]) if g is None else g) for k, g in grads.items()}
    lo = 0
    for i, (chunk, state) in enumerate(zip(chunks, states, strict=True)):
        n = len(parts[i][keys[0]])
        chunk_grads = {k: g[lo: lo + n] for k, g in grads.items()}
        lo += n
        if check:
            _check_replay(encode, chunk, state, parts[i], atol)
        with state:
            value = surrogate(i, chunk, chunk_grads)
        if backward is None:
            value.backward()
        else:
            backward(value, i == len(chunks) - 1)
    return loss.detach(), grads


def _check_replay(encode: Callable[[Any], Reps], chunk: Any, state: RandContext, first: Reps, atol: float) -> None:
    with torch.no_grad(), state:
        again = encode(chunk)
    for k, v in first.items():
        if not torch.allclose(again[k].detach(), v, atol=atol):
            raise RuntimeError(f"gradcache: re-encoding changed representation {k!r} "
                               f"(max diff {float((again[k] - v).abs().max()):.3g}): non-replayable randomness")


def _tensors(batch: Any) -> list[torch.Tensor]:
    if isinstance(batch, torch.Tensor):
        return [batch]
    if isinstance(batch, Mapping):
        return [t for v in batch.values() for t in _tensors(v)]
    if isinstance(batch, list | tuple):
        return [t for v in batch for t in _tensors(v)]
    if hasattr(batch, "__dataclass_fields__"):
        return [t for f in batch.__dataclass_fields__ for t in _tensors(getattr(batch, f))]
    return []
