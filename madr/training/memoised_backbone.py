"""Cached encodings for a frozen backbone: while only the heads train (aspect pretraining of MADRAL on a frozen
e5, paper 000 Eq. 7 without L_MLM), a text's token states never change, so the backbone runs once per distinct
text and every later visit reads its states from memory. A step then costs the heads alone: each step made
cheaper before making more of them, where the method allows it.

`train.<stage>.memoise_backbone` (with `freeze_backbone`) turns it on for a stage, in process
(`madr.training.loop.train_stage`) and on Ray Train workers (`pipelines.train.loop.build_module`).
`memoise_backbones(model)` installs a `MemoisedBackbone` as the `forward` of every tower's backbone, so the model's
modules, weights and state-dict keys stay as they are (checkpoints, exports, DDP and DeepSpeed see the real
backbone); it refuses a backbone with a trainable weight (the cache would go stale as it trained).
`memoised_backbones(model)` does the same for the duration of a block.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import torch
from torch import nn

from madr.config import StageConfig
from madr.modeling.model import BiEncoder

MAX_BYTES = 8 << 30  # states kept per backbone; texts past it run the backbone on every visit


@dataclass
class _Output:
    last_hidden_state: torch.Tensor


class MemoisedBackbone:
    """The `forward` of a frozen backbone whose last hidden states are kept per distinct (token ids of one row):
    the first call with a row runs the backbone's own forward (no grad), later calls stack the kept states. States
    are kept in `dtype` (float16 halves the memory: ~15 KiB per 20-token row at 384 wide) up to `max_bytes`, and
    returned as float32.

    The backbone always runs in eval mode, whatever the model's mode: a state kept with dropout would freeze
    one random mask into every later visit, in training and in evaluation alike, and make a row's states
    depend on which visit came first (e.g. a dev evaluation in the middle of training)."""

    def __init__(self, backbone: nn.Module, dtype: torch.dtype = torch.float16, max_bytes: int = MAX_BYTES) -> None:
        self.backbone = backbone
        self.own_forward = type(backbone).forward.__get__(backbone)  # the backbone's own, bound
        self.dtype = dtype
        self.max_bytes = max_bytes
        self.states: dict[bytes, torch.Tensor] = {}
        self.kept_bytes = 0
        self.hits = 0
        self.misses = 0

    def __deepcopy__(self, memo: dict) -> MemoisedBackbone:
        """A copy of the model gets a memo of its own backbone's copy, without the kept states."""
        import copy

        return MemoisedBackbone(copy.deepcopy(self.backbone, memo), self.dtype, self.max_bytes)

    @staticmethod
    def _key(ids: torch.Tensor, mask: torch.Tensor) -> bytes:
        return ids[mask.bool()].cpu().numpy().tobytes()

    @torch.no_grad()
    def __call__(self, input_ids: torch.Tensor | None = None, attention_mask: torch.Tensor | None = None,
                 inputs_embeds: torch.Tensor | None = None, **_: object) -> _Output:
        if inputs_embeds is not None or input_ids is None or attention_mask is None:
            raise ValueError("a memoised backbone takes input_ids and attention_mask only (MUR / MURAL put aspect "
                             "tokens into the backbone's input: their states depend on trained weights)")
        ids, mask = input_ids.cpu(), attention_mask.cpu().bool()  # one transfer each, not one per row
        keys = [self._key(i, m) for i, m in zip(ids, mask, strict=True)]
        missing = [r for r, k in enumerate(keys) if k not in self.states]
        self.hits += len(keys) - len(missing)
        self.misses += len(missing)
        fresh = self._run(input_ids, attention_mask, missing, keys, mask) if missing else {}
        # every row's tokens in row order fill the mask's positions in one assignment (no per-row copies)
        out = torch.zeros(*input_ids.shape, self.backbone.config.hidden_size, device=input_ids.device)
        out[attention_mask.bool()] = torch.cat([self.states.get(k, fresh.get(k)) for k in keys]).float()
        return _Output(out)

    def _run(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, rows: list[int], keys: list[bytes],
             mask: torch.Tensor) -> dict[bytes, torch.Tensor]:
        """The eval-mode states of `rows` (a text twice in one batch: its first state), kept while they fit."""
        index = torch.tensor(rows, device=input_ids.device)
        training = self.backbone.training
        self.backbone.eval()  # the kept state is the text's, not one dropout draw's (class docstring)
        try:
            seq = self.own_forward(input_ids=input_ids[index], attention_mask=attention_mask[index])
        finally:
            self.backbone.train(training)
        states = seq.last_hidden_state[attention_mask[index].bool()].to(self.dtype)  # the rows' tokens, in order
        fresh: dict[bytes, torch.Tensor] = {}
        for r, state in zip(rows, states.split(mask[rows].sum(1).tolist()), strict=True):
            fresh.setdefault(keys[r], state.clone())
        for key, state in fresh.items():
            if self.kept_bytes + state.numel() * state.element_size() <= self.max_bytes:
                self.states[key] = state
                self.kept_bytes += state.numel() * state.element_size()
        return fresh


def memoise_backbones(model: BiEncoder, dtype: torch.dtype = torch.float16,
                      max_bytes: int = MAX_BYTES) -> list[MemoisedBackbone]:
    """Make every tower's frozen backbone memoised (a shared backbone once): its `forward` becomes a
    `MemoisedBackbone`; `unmemoise_backbones` gives the backbone's own back."""
    towers = [t for t in model.towers() if t.backbone is not None]
    trainable = [n for t in towers for n, p in t.backbone.named_parameters() if p.requires_grad]
    if trainable:
        raise ValueError(f"memoising a backbone that still trains would serve stale states ({trainable[0]} "
                         "requires grad): freeze it first (train.<stage>.freeze_backbone)")
    memos: dict[int, MemoisedBackbone] = {}
    for tower in towers:
        if id(tower.backbone) not in memos:
            memos[id(tower.backbone)] = MemoisedBackbone(tower.backbone, dtype, max_bytes)
            tower.backbone.forward = memos[id(tower.backbone)]
    return list(memos.values())


def installed_memos(model: BiEncoder) -> list[MemoisedBackbone]:
    """The memos installed on the model's backbones, each once (shared towers share one)."""
    memos = [t.backbone.__dict__.get("forward") for t in model.towers() if t.backbone is not None]
    return list({id(m): m for m in memos if isinstance(m, MemoisedBackbone)}.values())


def unmemoise_backbones(model: BiEncoder) -> None:
    """Every tower's backbone runs its own `forward` again."""
    for memo in installed_memos(model):
        del memo.backbone.forward


def memo_stats(model: BiEncoder) -> dict[str, float]:
    """Visits read from memory, visits that ran the backbone, and GiB kept, over the model's memoised backbones
    (empty when none is)."""
    memos = installed_memos(model)
    if not memos:
        return {}
    return {"memo_hits": float(sum(m.hits for m in memos)), "memo_misses": float(sum(m.misses for m in memos)),
            "memo_gib": sum(m.kept_bytes for m in memos) / 2**30}


@contextmanager
def memoised_backbones(model: BiEncoder, dtype: torch.dtype = torch.float16) -> Iterator[list[MemoisedBackbone]]:
    """Within the block every tower's (frozen) backbone is memoised (`memoise_backbones`); the backbones run their
    own `forward` again on exit."""
    memos = memoise_backbones(model, dtype)
    try:
        yield memos
    finally:
        unmemoise_backbones(model)


@contextmanager
def stage_memoised(model: BiEncoder, stage: StageConfig) -> Iterator[list[MemoisedBackbone]]:
    """`memoised_backbones` when the stage asks for it (`train.<stage>.memoise_backbone`), else nothing."""
    if not stage.memoise_backbone:
        yield []
        return
    with memoised_backbones(model) as memos:
        yield memos
