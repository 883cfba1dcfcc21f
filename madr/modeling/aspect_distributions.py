"""Calibrated aspect value distributions of texts, cut to their top-k: what the index stores per product and
what a query brings to the aspect-match score (``madr.search.aspect_match``).

For aspect ``a`` the model scores every value ``x`` of the aspect's vocabulary; paper 000 Sec. 5 defines
``P(x) = softmax(E_a U_a^T + b_a)`` (MURAL, paper 001 Sec. 4.2, scores phrase values against value embeddings;
the phrase granularity is used here). The logits are divided by the model's fitted temperature for that side
and aspect (``madr.modeling.calibration``; 1 without a calibration), so the probabilities are the calibrated
ones ``/explain`` reports. The presence ``P_a`` is paper 000 Sec. 6.2's (Eq. 5, a sigmoid on ``E_a``) when the
model's fusion is Presence Weighting, else 1 (the aspect is taken as present).
"""

from __future__ import annotations

import numpy as np
import torch

from madr.index.aspects import AspectTable, AspectTopK, concat_tables
from madr.modeling.batching import model_device
from madr.modeling.model import BiEncoder, objective_keys
from madr.modeling.outputs import TowerOutput


def aspect_logit_keys(model: BiEncoder) -> dict[str, str]:
    """``{aspect: key of its phrase-level value logits}`` of a model that predicts aspect values (else empty)."""
    if not model.predicts_aspect_values:
        return {}
    return {a: key for key, a, g in objective_keys(model.config) if g == "phrase"}


def _presence(out: TowerOutput, aspect: str, key: str) -> torch.Tensor | None:
    """[B] presence of ``aspect`` (its component by name, or by its phrase key), None without a presence head."""
    presence = out.presence
    if presence is None:
        return None
    for name in (aspect, key):
        if name in out.component_names:
            return presence[:, out.component_names.index(name)]
    return None


def calibrated_topk(model: BiEncoder, out: TowerOutput, side: str, k: int) -> AspectTable:
    """Per aspect, the top ``k`` values of the calibrated ``softmax(logits / T)`` of every row of ``out`` with
    their probabilities and presence (module docstring); -1 / 0 padding where a vocabulary is smaller than k."""
    if k < 1:
        raise ValueError(f"aspect top-k: k must be >= 1, got {k}")
    table = {}
    for aspect, key in aspect_logit_keys(model).items():
        logits = out.aspect_logits[key].float()
        t = model.calibration.temperature(side, key) if model.calibration is not None else 1.0
        probs, values = torch.softmax(logits / t, dim=-1).topk(min(k, logits.shape[-1]), dim=-1)
        n = logits.shape[0]
        v = np.full((n, k), -1, np.int32)
        p = np.zeros((n, k), np.float32)
        v[:, : values.shape[1]] = values.cpu().numpy()
        p[:, : probs.shape[1]] = probs.cpu().numpy()
        pres = _presence(out, aspect, key)
        table[aspect] = AspectTopK(v, p, np.ones(n, np.float32) if pres is None else pres.float().cpu().numpy())
    return table


@torch.no_grad()
def encode_aspects(model: BiEncoder, texts: list[str], side: str, k: int, batch_size: int = 64) -> AspectTable:
    """``calibrated_topk`` of ``texts`` through the ``side`` tower (eval mode, no grad); empty for a model without
    aspect heads."""
    if not aspect_logit_keys(model):
        return {}
    was_training = model.training
    model.eval()
    device, parts = model_device(model), []
    for i in range(0, len(texts), batch_size):
        enc = model.tokenize(list(texts[i:i + batch_size]), side)
        out = model.encode(enc["input_ids"].to(device), enc["attention_mask"].to(device), side)
        parts.append(calibrated_topk(model, out, side, k))
    model.train(was_training)
    return concat_tables(parts) if parts else {}


def value_strings(model: BiEncoder) -> dict[str, list[str]]:
    """``{aspect: its phrase value strings, by value id}``: what a stored value id means."""
    return {a: list(model.vocabularies.get(a, "phrase").values) for a in aspect_logit_keys(model)}
