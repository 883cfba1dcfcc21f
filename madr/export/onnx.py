"""A tower as an ONNX graph, and an encoder that runs it with onnxruntime.

`TowerGraph` is what `madr.search.query_encoder.LeanQueryEncoder` computes for one padded batch, written as one
traceable module: inputs `input_ids`, `attention_mask` [B, L] (int64; B and L dynamic), outputs

- `dense` [B, d]: the tower's vector (L2-normalised for cosine dense models; raw for the hybrid model, as
  `encode_hybrid` and the lean encoder give it);
- models with sparse vectors (paper 002; `model.sparse_head`) also `sparse_values`, `sparse_ids` [B, k]: the k
  largest SPLADE term weights (over a lean head's terms only)
  w_j = pool_i log(1 + ReLU(mlm_logit[i, j])) over the real tokens i (max or sum, `HybridHead.pooling`), special
  tokens zeroed, and their vocabulary ids, k = `HybridHead.top_k` (the whole vocabulary without one). Max pooling
  takes the max of the masked logits first, then ReLU / log1p (both monotone: the same weights).

`export_onnx(model, path)` writes it with the dynamo exporter (`torch.onnx.export(dynamo=True)`, which needs
`onnxscript`) as one self-contained file (weights inside: protobuf caps that at 2 GB, far above a query tower);
`OnnxQueryEncoder` is a `LeanQueryEncoder` whose forward pass is the onnxruntime session: the same
tokenisation, batching by length, output order and sparse rows (`encode` returns the same types), so it can
stand in for the torch encoder wherever that one serves (`madr.serve_config.ServeSettings.encoder_backend`).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
from torch import nn

from madr.modeling.backbone import max_positions
from madr.modeling.heads import MultiPoolHead
from madr.modeling.model import BiEncoder
from madr.search.query_encoder import LeanQueryEncoder

INPUTS = ("input_ids", "attention_mask")


def output_names(hybrid: bool) -> list[str]:
    """The graph's outputs: the dense vector, and the sparse top-k for hybrid models."""
    return ["dense", "sparse_values", "sparse_ids"] if hybrid else ["dense"]


class TowerGraph(nn.Module):
    """The `side` tower of `model` as one graph: (input_ids, attention_mask) -> dense [, sparse_values, sparse_ids]."""

    def __init__(self, model: BiEncoder, side: str = "query") -> None:
        super().__init__()
        self.tower = model.tower(side)
        self.hybrid = bool(model.config.has_sparse)
        self.cosine = model.config.unit_dense
        # MpBERT pools the first K positions and pads in Python when a batch is shorter than K: a branch the
        # exported graph would freeze. K masked pad positions always appended keep every batch past K (masked
        # positions change no real position's state and get fusion weight 0).
        self.pad_id = int(model.tokenizer.pad_token_id or 0)
        self.min_pad = self.tower.head.num_tokens if isinstance(self.tower.head, MultiPoolHead) else 0
        longest = model.config.max_query_length if side == "query" else model.config.max_doc_length
        if self.min_pad and longest + self.min_pad > max_positions(self.tower.backbone):
            raise ValueError(f"{model.config.name} {side} tower: {longest} tokens + {self.min_pad} pad positions exceed "
                             f"the backbone's max_position_embeddings={max_positions(self.tower.backbone)}")
        if self.hybrid:
            head = self.tower.sparse_terms
            lean = self.tower.sparse_ids  # a lean head: logits of its terms only, ids mapped back to the vocabulary
            self.register_buffer("terms", None if lean is None else lean.clone(), persistent=False)
            vocab = int(self.tower.word_embeddings.shape[0] if lean is None else lean.numel())
            keep = torch.ones(vocab)
            if lean is None:
                keep[head.excluded_ids] = 0.0
            self.register_buffer("keep", keep, persistent=False)
            self.pooling = head.pooling
            self.top_k = None if head.top_k is None or head.top_k >= vocab else int(head.top_k)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> tuple[torch.Tensor, ...]:
        tower = self.tower
        if self.min_pad:
            input_ids = nn.functional.pad(input_ids, (0, self.min_pad), value=self.pad_id)
            attention_mask = nn.functional.pad(attention_mask, (0, self.min_pad), value=0)
        if not self.hybrid:
            emb = tower(input_ids, attention_mask).embedding
            return (nn.functional.normalize(emb, dim=-1) if self.cosine else emb,)
        out = tower.head(tower.backbone, input_ids, attention_mask)
        emb = out.embedding if tower.projection is None else tower.projection(out.embedding)
        if self.cosine:
            emb = nn.functional.normalize(emb, dim=-1)
        logits = tower.mlm_head(out.sequence_output, tower.word_embeddings, self.terms)  # [B, L, V] (or T)
        real = attention_mask.bool().unsqueeze(-1)
        if self.pooling == "max":
            pooled = torch.log1p(torch.relu(logits.masked_fill(~real, float("-inf")).amax(dim=1)))
        else:
            pooled = (torch.log1p(torch.relu(logits)) * real.to(logits.dtype)).sum(dim=1)
        pooled = pooled * self.keep
        if self.top_k is None:
            ids = torch.arange(pooled.shape[1], device=pooled.device).expand(pooled.shape[0], -1)
        else:
            pooled, ids = torch.topk(pooled, self.top_k, dim=1)
        return emb, pooled, (ids if self.terms is None else self.terms[ids])


def export_onnx(model: BiEncoder, path: str | Path, side: str = "query", optimize: bool = True) -> Path:
    """Write `model`'s `side` tower (`TowerGraph`) as an ONNX file at `path`; batch and length are dynamic.
    `optimize`: run the exporter's graph optimiser (constant folding, dead code; about half the export time on a
    tiny model; onnxruntime optimises the graph again when it loads it)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    model.eval()
    graph = TowerGraph(model, side).eval()
    probe = model.tokenize(["a probe text of a few words", "probe"], side)  # padding inside: a real mask
    dims = {0: torch.export.Dim("batch"), 1: torch.export.Dim("length")}
    with torch.no_grad():
        torch.onnx.export(graph, (probe["input_ids"], probe["attention_mask"]), str(path), dynamo=True,
                          input_names=list(INPUTS), output_names=output_names(graph.hybrid),
                          dynamic_shapes={name: dims for name in INPUTS}, external_data=False, optimize=optimize,
                          verbose=False)
    return path


def onnx_session(path: str | Path, threads: int = 1):
    """An onnxruntime CPU session of `path` with `threads` intra-op threads (one inter-op thread)."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    return ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])


class OnnxQueryEncoder(LeanQueryEncoder):
    """`LeanQueryEncoder` whose forward pass runs `onnx_path` (written by `export_onnx` from the same model and
    side) in onnxruntime; `model` still tokenises. The index-vocabulary projection (`term_ids`) is torch-only."""

    def __init__(self, model: BiEncoder, onnx_path: str | Path, side: str = "query", batch_size: int = 64,
                 threads: int = 1) -> None:
        super().__init__(model, None, side, batch_size)
        self._terms_np = None  # the graph's sparse_ids are vocabulary ids already (a lean head's mapped inside)
        self.session = onnx_session(onnx_path, threads)
        names = [o.name for o in self.session.get_outputs()]
        want = output_names(self.hybrid)
        if names != want:
            raise ValueError(f"{onnx_path}: outputs {names}, but model {model.config.name!r} needs {want} "
                             "(exported from another model?)")

    def _refresh(self) -> None:
        """No torch decoder copy: the graph holds the decoder (weights as they were at export)."""

    def _encode_batch(self, ids: torch.Tensor, mask: torch.Tensor
                      ) -> tuple[np.ndarray, tuple[np.ndarray, np.ndarray] | None]:
        feeds = {"input_ids": ids.cpu().numpy().astype(np.int64), "attention_mask": mask.cpu().numpy().astype(np.int64)}
        outs = self.session.run(None, feeds)
        if not self.hybrid:
            return outs[0], None
        return outs[0], self._sorted_terms(outs[1], outs[2])
