"""A lean query encoder for serving: the vectors ``madr.index.encode.encode_queries`` gives, with less work.

The hybrid model (paper 002) turns a query into the CLS vector (dense) and SPLADE term weights from the MLM
head (sparse, Sec. 4.1-4.2): w_j = pool_i log(1 + ReLU(mlm_logit[i, j])) over the non-padding tokens i
(max, or sum), special tokens zeroed, top-k kept (``madr.modeling.heads.hybrid``). Per query the reference
path (``encode_hybrid``) toggles ``model.eval()`` / ``train()``, runs under ``no_grad``, projects every token
onto the whole vocabulary, applies log1p / ReLU to the whole [L, V] matrix and cuts a dense [V] row. Here:

- the model is put in eval mode once, at construction, and encoding runs under ``torch.inference_mode()``;
  a model put back in training mode is refused, not silently switched (dropout would change the vectors);
- MLM logits are computed only at the real (non-padding) token positions, as one ``addmm`` against a
  transposed, contiguous copy of the decoder ([H, V]; rebuilt when the model's weights change in place);
- max pooling takes the max of the raw logits over tokens FIRST and applies ReLU / log1p to the pooled [V]
  row (both are monotone non-decreasing, so max_i f(x_i) = f(max_i x_i) exactly: same weights, bit for bit,
  for the same logits); sum pooling keeps the reference's log1p(ReLU) per token, then the sum;
- optionally (``term_ids``: the terms that occur in the index, ``madr.search.sharded.sparse_term_ids``) the
  MLM decoder copy holds those rows only: logits are computed for the index's terms
  only. A term's weight is unchanged; what changes is the top-k cut, which is then taken over the index's
  terms: the query keeps its k best terms *that can match a document* instead of spending slots on terms no
  document has. Whenever the reference top-k holds only index terms (or k does not bind) the output equals
  the reference's; otherwise it is a superset of the reference restricted to the index, so served scores can
  differ (opt-in: ``madr.serve_config.ServeSettings.encoder_index_vocabulary``).

The dense vector is the tower's ``TowerOutput.embedding`` (raw for the hybrid model as in ``encode_hybrid``;
L2-normalised for cosine models, with or without a sparse head, as in ``BiEncoder.encode_texts``). A lean sparse
head (``Tower.sparse_ids``) projects onto its own terms (and the index's among them with ``term_ids``). Texts are batched in order of length,
rows returned in input order, as the reference does. ``side="doc"`` encodes with the document tower
(the vectors of ``encode_documents``).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch
from torch import nn

from madr.modeling.model import BiEncoder, Tower
from madr.search.sparse import SparseBatch


class LeanQueryEncoder:
    """Query (or document) tower vectors without per-call mode switches; see the module docstring.

    ``term_ids``: hybrid models only, the vocabulary ids the sparse index holds (any order, duplicates
    allowed); None projects onto the whole vocabulary (output equal to ``encode_queries``). The decoder rows
    are copied (transposed) at construction, and again when the model's decoder weights were updated in place.
    """

    def __init__(self, model: BiEncoder, term_ids: Sequence[int] | np.ndarray | None = None,
                 side: str = "query", batch_size: int = 64) -> None:
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        self.model, self.side, self.batch_size = model, side, batch_size
        self.tower: Tower = model.tower(side)
        model.eval()  # once: dropout off and the hybrid top-k cut on (madr.modeling.heads.hybrid)
        self.device = next(model.parameters()).device
        self.hybrid = bool(model.config.has_sparse)
        self.cosine = model.config.unit_dense
        if not self.hybrid:
            if term_ids is not None:
                raise ValueError(f"term_ids: model {model.config.name!r} has no sparse vectors to project")
            self.terms, self._terms_np = None, None
            return
        head, mlm = self.tower.sparse_terms, self.tower.mlm_head
        self.pooling, self.top_k = head.pooling, head.top_k
        embeddings = self.tower.word_embeddings
        self.vocab_size = int(embeddings.shape[0])
        excluded = torch.tensor(head.excluded_ids, dtype=torch.long, device=self.device)
        lean = None if self.tower.sparse_ids is None else self.tower.sparse_ids.cpu().numpy()
        if lean is not None:  # a lean head scores its own terms only (those of the index, if given, among them)
            term_ids = lean if term_ids is None else np.intersect1d(np.asarray(term_ids, dtype=np.int64), lean)
        if term_ids is None:
            self.terms, self._terms_np = None, None
            self.excluded = excluded  # zeroed after pooling, as term_weights does
        else:
            terms = np.unique(np.asarray(term_ids, dtype=np.int64).reshape(-1))
            if terms.size and (terms[0] < 0 or terms[-1] >= self.vocab_size):
                raise ValueError(f"term_ids must lie in [0, {self.vocab_size}), got min {terms[0]} max {terms[-1]}")
            terms = terms[~np.isin(terms, head.excluded_ids)]  # always zero: never worth computing
            self.terms, self._terms_np = torch.from_numpy(terms).to(self.device), terms
            self.excluded = excluded[:0]
        self._source = (embeddings, mlm.bias)
        self._versions: tuple[int, int] | None = None
        self._refresh()

    def _refresh(self) -> None:
        """(Re)build the decoder copy when the model's decoder weights changed since the last one (in-place
        updates, e.g. an optimizer step, bump a tensor's version): the transposed [H, T] rows of the projected
        terms, contiguous (a [N, H] x [H, T] product over that copy is faster than ``linear`` on the [T, H]
        table), and their [T] biases."""
        weight, bias = self._source
        versions = (weight._version, bias._version)
        if versions == self._versions:
            return
        with torch.inference_mode():
            rows = weight if self.terms is None else weight[self.terms]
            self._weight_t = rows.t().contiguous()
            self._bias = (bias if self.terms is None else bias[self.terms]).clone()
        self._versions = versions

    @property
    def num_terms(self) -> int:
        """How many vocabulary rows the MLM projection computes (the whole vocabulary without ``term_ids``)."""
        if not self.hybrid:
            return 0
        return self.vocab_size if self.terms is None else int(self.terms.numel())

    def encode(self, texts: list[str], batch_size: int | None = None) -> tuple[np.ndarray, SparseBatch | None]:
        """(dense [N, d] float32, sparse ``SparseBatch`` over the full vocabulary or None for dense models);
        ``batch_size`` (default: the encoder's) texts per forward pass."""
        step = self.batch_size if batch_size is None else batch_size
        if step < 1:
            raise ValueError(f"batch_size must be >= 1, got {step}")
        if isinstance(texts, str):
            raise ValueError("texts must be a list of strings, got one string")
        if self.model.training:
            raise ValueError("LeanQueryEncoder: the model was put back in training mode; call model.eval() "
                             "(the encoder does not switch modes per call)")
        if self.hybrid:
            self._refresh()
        texts = list(texts)
        order = np.argsort([len(t) for t in texts], kind="stable")
        dense, terms, weights = [], [], []
        with torch.inference_mode():
            for i in range(0, len(texts), step):
                enc = self.model.tokenize([texts[j] for j in order[i:i + step]], self.side)
                d, top = self._encode_batch(enc["input_ids"].to(self.device), enc["attention_mask"].to(self.device))
                dense.append(d)
                if top is not None:
                    terms.append(top[0])
                    weights.append(top[1])
        if not dense:
            empty = None if not self.hybrid else SparseBatch(np.zeros(1, np.int64), np.zeros(0, np.int32),
                                                             np.zeros(0, np.float32), self.vocab_size)
            return np.zeros((0, self.model.embedding_dim), np.float32), empty
        inverse = np.argsort(order)
        out = dense[0] if len(dense) == 1 else np.concatenate(dense)
        out = out[inverse]
        if not self.hybrid:
            return out, None
        # every batch's rows are k wide (the same k): reorder once, then one CSR batch
        term = (terms[0] if len(terms) == 1 else np.concatenate(terms))[inverse]
        value = (weights[0] if len(weights) == 1 else np.concatenate(weights))[inverse]
        keep = value != 0
        indptr = np.zeros(len(texts) + 1, dtype=np.int64)
        np.cumsum(keep.sum(axis=1), out=indptr[1:])
        return out, SparseBatch(indptr, term[keep], value[keep], self.vocab_size)

    # ---- one padded batch ------------------------------------------------------------------------------------

    def _encode_batch(self, ids: torch.Tensor, mask: torch.Tensor
                      ) -> tuple[np.ndarray, tuple[np.ndarray, np.ndarray] | None]:
        """Dense [B, d] and, for hybrid models, the top-k (term ids, weights) [B, k] of each row (ids ascending,
        zero weights where a row has fewer than k positive ones)."""
        tower = self.tower
        if not self.hybrid:
            emb = tower(ids, mask).embedding
            if self.cosine:
                emb = nn.functional.normalize(emb, dim=-1)
            return emb.float().cpu().numpy(), None
        out = tower.head(tower.backbone, ids, mask)
        emb = out.embedding if tower.projection is None else tower.projection(out.embedding)
        if self.cosine:  # a cosine model's own vector beside its sparse head
            emb = nn.functional.normalize(emb, dim=-1)
        seq = out.sequence_output
        if bool(mask.all()):  # no padding (one text): every position is a real token
            hidden, lengths = seq.reshape(-1, seq.shape[-1]), [seq.shape[1]] * seq.shape[0]
        else:
            live = mask.bool()
            hidden, lengths = seq[live], live.sum(dim=1).tolist()
        return emb.float().cpu().numpy(), self._top_k(self._pooled_weights(hidden, lengths))

    def _pooled_weights(self, hidden: torch.Tensor, lengths: list[int]) -> torch.Tensor:
        """[B, T] pooled term weights (paper 002 Sec. 4.1) from the hidden states [N, H] of the N real tokens
        (``lengths`` per text), over the T projected terms."""
        mlm = self.tower.mlm_head
        h = mlm.layer_norm(nn.functional.gelu(mlm.dense(hidden)))
        logits = torch.addmm(self._bias, h, self._weight_t)  # [N, T]
        chunks = torch.split(logits, lengths) if len(lengths) > 1 else (logits,)
        if self.pooling == "max":  # max first, then ReLU / log1p on [B, T] (monotone: the same weights)
            pooled = torch.stack([c.amax(dim=0) for c in chunks]).relu_().log1p_()
        else:  # sum: log1p(ReLU) per token, as the reference
            pooled = torch.stack([torch.log1p(torch.relu(c)).sum(dim=0) for c in chunks])
        if self.excluded.numel():
            pooled.index_fill_(1, self.excluded, 0.0)
        return pooled

    def _top_k(self, weights: torch.Tensor) -> tuple[np.ndarray, np.ndarray]:
        """Each row's top-k (``HybridHead.top_k``; all without one) weights of [B, T] ``weights`` as (term ids
        over the full vocabulary, weights), [B, k] each, ids ascending within a row."""
        k = weights.shape[1] if self.top_k is None else min(self.top_k, weights.shape[1])
        values, cols = torch.topk(weights, k, dim=1) if k < weights.shape[1] else (weights, None)
        values = values.float().cpu().numpy()
        if cols is None:
            cols_np = np.broadcast_to(np.arange(weights.shape[1]), values.shape)
        else:
            cols_np = cols.cpu().numpy()
        return self._sorted_terms(values, cols_np)

    def _sorted_terms(self, values: np.ndarray, cols: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(term ids over the full vocabulary, weights) [B, k] of the top-k `values` at projected columns `cols`,
        ids ascending within a row (also what ``madr.export.onnx.OnnxQueryEncoder`` turns its graph's top-k into)."""
        term = cols if self._terms_np is None else self._terms_np[cols]
        order = np.argsort(term, axis=1, kind="stable")
        return np.take_along_axis(term, order, axis=1), np.take_along_axis(values, order, axis=1)


def build_query_encoder(model: BiEncoder, term_ids: Sequence[int] | np.ndarray | None = None, backend: str = "torch",
                        precision: str = "fp32", threads: int = 1) -> LeanQueryEncoder:
    """The query encoder of `model` for a backend and precision (a Serve app's `encoder_backend` /
    `encoder_precision`; the evaluate job's `encoder_backend` / `encoder_precision`, so a run scores what the app
    serves); `term_ids`: the sparse terms to project onto (None: the whole vocabulary).
    "torch" + "fp32": `LeanQueryEncoder`; "torch" + "int8": its Linear layers dynamically quantised
    (`madr.export.quantize.Int8QueryEncoder`); "onnx": the query tower exported now and run in onnxruntime with
    `threads` threads (`madr.export.onnx.OnnxQueryEncoder`, the same vectors; int8: quantised first,
    `madr.export.quantize.onnx_int8_encoder`). The ONNX graph projects onto the whole vocabulary, so it takes no
    `term_ids`; it is exported at start, so it can never be stale against the model."""
    from madr.serve_config import ENCODER_BACKENDS, ENCODER_PRECISIONS

    if precision not in ENCODER_PRECISIONS:
        raise ValueError(f"query encoder precision must be 'fp32' or 'int8', got {precision!r}")
    if backend not in ENCODER_BACKENDS:
        raise ValueError(f"query encoder backend must be 'torch' or 'onnx', got {backend!r}")
    if backend == "torch":
        if precision == "int8":
            from madr.export.quantize import Int8QueryEncoder

            return Int8QueryEncoder(model, term_ids)
        return LeanQueryEncoder(model, term_ids)
    if term_ids is not None:
        raise ValueError("the ONNX query encoder projects onto the whole vocabulary, not the index's terms "
                         "(encoder_index_vocabulary needs encoder_backend 'torch')")
    if precision == "int8":
        from madr.export.quantize import onnx_int8_encoder

        return onnx_int8_encoder(model, "query", threads)
    import tempfile
    from pathlib import Path

    from madr.export.onnx import OnnxQueryEncoder, export_onnx

    with tempfile.TemporaryDirectory(prefix="madr-query-onnx-") as tmp:
        return OnnxQueryEncoder(model, export_onnx(model, Path(tmp) / "query.onnx"), threads=threads)
