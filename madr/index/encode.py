"""Model -> vectors for indexing and search: dense vectors and, for hybrid models, sparse term weights.

The vectors are the ones ``madr.search.hybrid`` and ``BiEncoder.encode_texts`` produce, so an index
built from them is searched with the same scores:

- hybrid models (paper 002): the raw CLS embedding and the top-k SPLADE term weights
  (``madr.search.hybrid.encode_hybrid``); scores are raw inner products (paper 002 Eq. 1);
- every other model: ``TowerOutput.embedding``, L2-normalised for cosine models, so the inner product
  of the index is the model's similarity (paper 000 Sec. 8.3 ranks by cosine).

``encode_token_batch`` is the piece the Ray encode job runs on already tokenised, unpadded id lists:
it pads per batch (``pad_token_ids``), so a length-sorted batch carries little padding. With ``aspect_k`` it
also returns, from the same forward pass, the batch's calibrated top-k aspect values
(``madr.modeling.aspect_distributions.calibrated_topk``; empty for a model without aspect heads).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch
from torch import nn

from madr.modeling.model import BiEncoder
from madr.search.hybrid import encode_hybrid
from madr.search.sparse import SparseBatch


def _dense_only(model: BiEncoder, texts: list[str], side: str, batch_size: int) -> np.ndarray:
    if isinstance(texts, str):
        raise ValueError("texts must be a list of strings, got one string")
    return model.encode_texts(list(texts), side, batch_size).float().cpu().numpy().astype(np.float32)


def encode_texts(model: BiEncoder, texts: list[str], side: str,
                 batch_size: int = 64) -> tuple[np.ndarray, SparseBatch | None]:
    """(dense [N, d] float32, sparse or None) of ``texts`` through the ``side`` tower (eval mode)."""
    if isinstance(texts, str):
        raise ValueError("texts must be a list of strings, got one string")
    if model.config.has_sparse:
        enc = encode_hybrid(model, list(texts), side, batch_size)
        return enc.dense, enc.sparse
    return _dense_only(model, texts, side, batch_size), None


def encode_queries(model: BiEncoder, texts: list[str],
                   batch_size: int = 64) -> tuple[np.ndarray, SparseBatch | None]:
    """Query vectors: dense [Q, d] float32 and, for hybrid models, a ``SparseBatch`` (else None)."""
    return encode_texts(model, texts, "query", batch_size)


def encode_documents(model: BiEncoder, texts: list[str],
                     batch_size: int = 64) -> tuple[np.ndarray, SparseBatch | None]:
    """Document vectors (the document tower), as ``encode_queries``."""
    return encode_texts(model, texts, "doc", batch_size)


def pad_token_ids(rows: Sequence[Sequence[int]], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Ragged token id lists -> (input_ids [B, longest] int64, attention_mask [B, longest] int64)."""
    width = max((len(r) for r in rows), default=0)
    ids = np.full((len(rows), max(width, 1)), pad_id, dtype=np.int64)
    mask = np.zeros(ids.shape, dtype=np.int64)
    for i, r in enumerate(rows):
        ids[i, : len(r)] = r
        mask[i, : len(r)] = 1
    return torch.from_numpy(ids), torch.from_numpy(mask)


@torch.no_grad()
def encode_token_batch(model: BiEncoder, rows: Sequence[Sequence[int]], side: str = "doc",
                       device: torch.device | str | None = None,
                       dtype: torch.dtype | None = None, aspect_k: int | None = None) -> tuple:
    """Encode one batch of tokenised texts (ids with special tokens, unpadded), in the given order.

    ``dtype`` (e.g. ``torch.bfloat16`` on a GPU) runs the forward pass under autocast; outputs are float32.
    The model must already be on ``device``; it runs in eval mode (no dropout, and the hybrid top-k cut of
    paper 002 Sec. 4.2, which training mode skips by default) and is put back in its mode after.
    Returns (dense, sparse or None), and with ``aspect_k`` (dense, sparse or None, aspect table)."""
    device = torch.device(device) if device is not None else next(model.parameters()).device
    ids, mask = pad_token_ids(rows, model.tokenizer.pad_token_id or 0)
    ids, mask = ids.to(device), mask.to(device)
    was_training = model.training
    model.eval()
    try:
        if dtype is not None and dtype != torch.float32:
            with torch.autocast(device.type, dtype=dtype):
                out = model.encode(ids, mask, side)
        else:
            out = model.encode(ids, mask, side)
    finally:
        model.train(was_training)
    emb = out.embedding.float()
    if model.config.unit_dense:
        emb = nn.functional.normalize(emb, dim=-1)
    sparse = SparseBatch.from_dense(out.sparse.float().cpu()) if model.config.has_sparse else None
    if aspect_k is None:
        return emb.cpu().numpy(), sparse
    from madr.modeling.aspect_distributions import calibrated_topk

    return emb.cpu().numpy(), sparse, calibrated_topk(model, out, side, aspect_k)
