"""Cached encodings for a frozen backbone: while only the heads train (aspect pretraining of MADRAL on a frozen
e5, paper 000 Eq. 7 without L_MLM), a text's token states never change, so the backbone runs once per distinct
text and every later visit reads its states from memory. A step then costs the heads alone: each step made
cheaper before making more of them, where the method allows it.

`memoised_backbones(model)` swaps every tower's backbone for a `MemoisedBackbone` for the duration of a block;
it refuses a backbone with a trainable weight (the cache would go stale as it trained).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import torch
from torch import nn

from madr.modeling.model import BiEncoder


@dataclass
class _Output:
    last_hidden_state: torch.Tensor


class MemoisedBackbone(nn.Module):
    """A frozen backbone whose last hidden states are kept per distinct (token ids of one row): the first call
    with a row runs the backbone (no grad), later calls stack the kept states. States are kept in `dtype`
    (float16 halves the memory: ~15 KiB per 20-token row at 384 wide) and returned as float32.

    The backbone always runs in eval mode, whatever the model's mode: a state kept with dropout would freeze
    one random mask into every later visit, in training and in evaluation alike, and make a row's states
    depend on which visit came first (e.g. a dev evaluation in the middle of training)."""

    def __init__(self, backbone: nn.Module, dtype: torch.dtype = torch.float16) -> None:
        super().__init__()
        self.backbone = backbone
        self.dtype = dtype
        self.states: dict[bytes, torch.Tensor] = {}
        self.hits = 0
        self.misses = 0

    @property
    def config(self):
        return self.backbone.config

    def get_input_embeddings(self) -> nn.Module:
        return self.backbone.get_input_embeddings()

    @staticmethod
    def _key(ids: torch.Tensor, mask: torch.Tensor) -> bytes:
        return ids[mask.bool()].cpu().numpy().tobytes()

    @torch.no_grad()
    def forward(self, input_ids: torch.Tensor | None = None, attention_mask: torch.Tensor | None = None,
                inputs_embeds: torch.Tensor | None = None, **_: object) -> _Output:
        if inputs_embeds is not None or input_ids is None or attention_mask is None:
            raise ValueError("a memoised backbone takes input_ids and attention_mask only (MUR / MURAL put aspect "
                             "tokens into the backbone's input: their states depend on trained weights)")
        ids, mask = input_ids.cpu(), attention_mask.cpu().bool()  # one transfer each, not one per row
        keys = [self._key(i, m) for i, m in zip(ids, mask, strict=True)]
        missing = [r for r, k in enumerate(keys) if k not in self.states]
        self.hits += len(keys) - len(missing)
        self.misses += len(missing)
        if missing:
            rows = torch.tensor(missing, device=input_ids.device)
            training = self.backbone.training
            self.backbone.eval()  # the kept state is the text's, not one dropout draw's (class docstring)
            try:
                seq = self.backbone(input_ids=input_ids[rows], attention_mask=attention_mask[rows])
            finally:
                self.backbone.train(training)
            kept = seq.last_hidden_state[attention_mask[rows].bool()].to(self.dtype)  # the rows' tokens, in order
            for r, state in zip(missing, kept.split(mask[missing].sum(1).tolist()), strict=True):
                self.states.setdefault(keys[r], state.clone())  # a text twice in one batch: its first state
        # every row's kept tokens in row order fill the mask's positions in one assignment (no per-row copies)
        out = torch.zeros(*input_ids.shape, self.config.hidden_size, device=input_ids.device)
        out[attention_mask.bool()] = torch.cat([self.states[k] for k in keys]).float()
        return _Output(out)


@contextmanager
def memoised_backbones(model: BiEncoder, dtype: torch.dtype = torch.float16) -> Iterator[list[MemoisedBackbone]]:
    """Within the block every tower's (frozen) backbone is a `MemoisedBackbone` (a shared backbone is memoised
    once); the real backbones come back on exit."""
    towers = [t for t in model.towers() if t.backbone is not None]
    trainable = [n for t in towers for n, p in t.backbone.named_parameters() if p.requires_grad]
    if trainable:
        raise ValueError(f"memoising a backbone that still trains would serve stale states ({trainable[0]} "
                         "requires grad): freeze it first (madr.training.freezing.backbone_frozen)")
    originals = [t.backbone for t in towers]
    wrapped: dict[int, MemoisedBackbone] = {}
    for tower, backbone in zip(towers, originals, strict=True):
        tower.backbone = wrapped.setdefault(id(backbone), MemoisedBackbone(backbone, dtype))
    try:
        yield list(wrapped.values())
    finally:
        for tower, backbone in zip(towers, originals, strict=True):
            tower.backbone = backbone
