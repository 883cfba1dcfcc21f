"""Masked language modelling: BERT-style token masking and the MLM loss (paper 001 Eq. 8, paper 000 Eq. 7)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

IGNORE_INDEX = -100


def _uniform(shape: torch.Size, device: torch.device, generator: torch.Generator | None) -> torch.Tensor:
    """U(0, 1) draws of `shape` on `device`, taken from `generator` (which may live on another device)."""
    gen_device = generator.device if generator is not None else device
    return torch.rand(shape, generator=generator, device=gen_device).to(device)


def mask_tokens(input_ids: torch.Tensor, attention_mask: torch.Tensor, mask_token_id: int, vocab_size: int,
                special_ids: list[int], probability: float = 0.15,
                generator: torch.Generator | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Choose tokens to predict and corrupt them as BERT does (80% [MASK], 10% random token, 10% kept).

    Each real token (attention_mask 1) whose id is not in `special_ids` is chosen independently with
    `probability`; special tokens ([CLS], [SEP], [PAD], aspect tokens, ...) and padding never are.
    Random replacements are drawn uniformly from the non-special ids of `[0, vocab_size)` (HF's
    collator draws from the whole vocabulary; a random [CLS] or aspect token mid-text is noise we avoid).

    Paper 001 Sec. 5.3.1 uses probability 0.15 for items and 0.3 for queries.

    Args:
        input_ids: `[B, L]` token ids.
        attention_mask: `[B, L]`, 1 for real tokens, 0 for padding.
        generator: draws come from it (CPU or on the ids' device) for reproducible masks.

    Returns:
        `(masked_ids, labels)`, both `[B, L]`: the corrupted ids, and the original id at every chosen
        position with `-100` (ignored by `MLMLoss`) elsewhere. `input_ids` is not modified.
    """
    if input_ids.dim() != 2 or input_ids.shape != attention_mask.shape:
        raise ValueError(f"input_ids {tuple(input_ids.shape)} and attention_mask {tuple(attention_mask.shape)} "
                         "must both be [batch, length]")
    if not 0.0 <= probability <= 1.0:
        raise ValueError(f"mask probability must be in [0, 1], got {probability}")
    if not 0 <= mask_token_id < vocab_size:
        raise ValueError(f"mask_token_id {mask_token_id} is outside the vocabulary [0, {vocab_size})")
    device = input_ids.device
    special = torch.tensor(sorted(set(special_ids)), dtype=torch.long, device=device)
    allowed = torch.ones(vocab_size, dtype=torch.bool, device=device)
    allowed[special[(special >= 0) & (special < vocab_size)]] = False
    allowed_ids = allowed.nonzero().squeeze(1)
    if allowed_ids.numel() == 0:
        raise ValueError(f"every id in the vocabulary of size {vocab_size} is special: nothing to draw from")

    candidate = attention_mask.bool() & ~torch.isin(input_ids, special)
    chosen = candidate & (_uniform(input_ids.shape, device, generator) < probability)
    labels = torch.where(chosen, input_ids, torch.full_like(input_ids, IGNORE_INDEX))

    action = _uniform(input_ids.shape, device, generator)  # < 0.8: [MASK]; [0.8, 0.9): random; else keep
    to_mask = chosen & (action < 0.8)
    to_random = chosen & (action >= 0.8) & (action < 0.9)
    pick = (_uniform(input_ids.shape, device, generator) * allowed_ids.numel()).long().clamp_max(allowed_ids.numel() - 1)
    masked = torch.where(to_mask, torch.full_like(input_ids, mask_token_id), input_ids)
    masked = torch.where(to_random, allowed_ids[pick], masked)
    return masked, labels


class MLMLoss(nn.Module):
    """Cross entropy of the MLM head's prediction at every masked position (paper 001 Eq. 8).

    Eq. 8 sums `-log P(w | X without masked(X))` over the masked tokens; like BERT we average over the
    masked tokens of the batch instead, so the scale does not depend on the mask ratio or lengths.

    Inputs: `logits [..., V]` (e.g. `[B, L, V]`, or `[N, V]` gathered at masked positions only, which
    saves memory) and `labels [...]` from `mask_tokens`, `-100` where nothing is predicted.
    If no position is masked the loss is a zero still connected to the graph.
    """

    def forward(self, logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        if logits.shape[:-1] != labels.shape:
            raise ValueError(f"MLM logits {tuple(logits.shape)} must be labels {tuple(labels.shape)} + [vocab]")
        flat_logits = logits.reshape(-1, logits.shape[-1])
        flat_labels = labels.reshape(-1)
        total = F.cross_entropy(flat_logits, flat_labels, ignore_index=IGNORE_INDEX, reduction="sum")
        count = (flat_labels != IGNORE_INDEX).sum().clamp(min=1)
        return total / count
