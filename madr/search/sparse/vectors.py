"""Compact sparse lexical vectors: (term id, weight) pairs per row, stored as one CSR batch.

Paper 002 Sec. 4.2 keeps only the top-k SPLADE weights of each query / document ("retaining only the top-k
weights ... and zeroing out the rests") and stores "key-value (key: vocabulary token index) pairs
corresponding to non-zero elements" (Sec. 6.1, Resource Requirements). ``SparseBatch`` is that storage:
row ``i`` holds the non-zero terms of vector ``i``, term ids ascending, no duplicates, no zero weights.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import scipy.sparse as sp

_FORMAT = "madr.sparse.SparseBatch/1"


def _as_numpy_2d(dense: Any) -> np.ndarray:
    """A torch tensor or array-like [N, V] -> float32 numpy array (torch is only touched if given)."""
    if hasattr(dense, "detach") and hasattr(dense, "cpu"):  # torch.Tensor without importing torch
        dense = dense.detach().cpu().float().numpy()
    arr = np.asarray(dense, dtype=np.float32)
    if arr.ndim != 2:
        raise ValueError(f"from_dense: expected a 2-d [N, V] matrix, got shape {arr.shape}")
    if not np.isfinite(arr).all():
        row = int(np.flatnonzero(~np.isfinite(arr).all(axis=1))[0])
        raise ValueError(f"from_dense: row {row} has a NaN or infinite weight")
    return arr


def _top_k_mask(arr: np.ndarray, top_k: int) -> np.ndarray:
    """Bool mask of the ``top_k`` largest entries of each row; ties at the cut go to the lower term id."""
    if top_k >= arr.shape[1]:
        return np.ones(arr.shape, dtype=bool)
    kth = -np.partition(-arr, top_k - 1, axis=1)[:, top_k - 1 : top_k]  # k-th largest value per row
    above = arr > kth
    at_cut = arr == kth
    room = top_k - above.sum(axis=1, keepdims=True)  # how many of the tied entries still fit
    return above | (at_cut & (np.cumsum(at_cut, axis=1) <= room))


@dataclass(frozen=True)
class SparseBatch:
    """N sparse vectors over a vocabulary of ``vocab_size`` terms, CSR layout.

    ``indptr`` int64 [N + 1], ``indices`` int32 [nnz] (term ids, ascending within a row), ``values`` float32
    [nnz] (non-zero weights). Row ``i`` is ``indices[indptr[i]:indptr[i+1]]`` with its weights.
    """

    indptr: np.ndarray
    indices: np.ndarray
    values: np.ndarray
    vocab_size: int

    def __post_init__(self) -> None:
        raw = np.asarray(self.indices)
        if raw.size and (raw.min() < 0 or raw.max() >= int(self.vocab_size)):
            raise ValueError(f"SparseBatch: term ids must lie in [0, {int(self.vocab_size)}), "
                             f"got min {raw.min()} max {raw.max()}")
        if int(self.vocab_size) > 2**31:
            raise ValueError(f"SparseBatch: vocab_size {self.vocab_size} does not fit int32 term ids")
        object.__setattr__(self, "indptr", np.ascontiguousarray(self.indptr, dtype=np.int64))
        object.__setattr__(self, "indices", np.ascontiguousarray(self.indices, dtype=np.int32))
        object.__setattr__(self, "values", np.ascontiguousarray(self.values, dtype=np.float32))
        object.__setattr__(self, "vocab_size", int(self.vocab_size))
        self._validate()

    def _validate(self) -> None:
        ip, ix, v = self.indptr, self.indices, self.values
        if self.vocab_size < 1:
            raise ValueError(f"SparseBatch: vocab_size must be >= 1, got {self.vocab_size}")
        if ip.ndim != 1 or ip.size < 1 or ip[0] != 0 or np.any(np.diff(ip) < 0):
            raise ValueError("SparseBatch: indptr must be 1-d, start at 0 and be non-decreasing")
        if ix.shape != (int(ip[-1]),) or v.shape != ix.shape:
            raise ValueError(f"SparseBatch: indptr ends at {int(ip[-1])} but indices has shape {ix.shape} "
                             f"and values {v.shape}")
        if not np.isfinite(v).all():
            raise ValueError("SparseBatch: values contain NaN or infinity")
        steps = np.diff(ix.astype(np.int64))
        row_starts = ip[1:-1][(ip[1:-1] > 0) & (ip[1:-1] < ix.size)]
        steps[row_starts - 1] = 1  # a new row may restart at any term id
        if np.any(steps <= 0):
            row = int(np.searchsorted(ip, int(np.flatnonzero(steps <= 0)[0]) + 1, side="right") - 1)
            raise ValueError(f"SparseBatch: row {row} has unsorted or duplicate term ids")

    # ---- construction ------------------------------------------------------------------------------------

    @classmethod
    def from_dense(cls, dense: Any, top_k: int | None = None) -> SparseBatch:
        """[N, V] torch tensor or numpy array -> batch keeping, per row, the ``top_k`` largest weights
        (paper 002 Sec. 4.2 top-k sparsification; ties at the cut keep the lower term id), then dropping
        zeros. ``top_k=None`` keeps every non-zero."""
        arr = _as_numpy_2d(dense)
        mask = arr != 0
        if top_k is not None:
            if top_k < 1:
                raise ValueError(f"from_dense: top_k must be >= 1 or None, got {top_k}")
            mask &= _top_k_mask(arr, top_k)
        rows, cols = np.nonzero(mask)  # row-major order: cols ascending within a row
        indptr = np.zeros(arr.shape[0] + 1, dtype=np.int64)
        np.cumsum(np.bincount(rows, minlength=arr.shape[0]), out=indptr[1:])
        return cls(indptr, cols, arr[rows, cols], vocab_size=arr.shape[1])

    @classmethod
    def from_pairs(cls, pairs: Sequence[tuple[Sequence[int], Sequence[float]]],
                   vocab_size: int | None = None) -> SparseBatch:
        """List of (term ids, weights) per row -> batch. Ids are sorted, zero weights dropped; duplicate
        ids in a row are an error. ``vocab_size`` defaults to the largest id + 1."""
        ids_list, w_list, max_id = [], [], -1
        for r, pair in enumerate(pairs):
            if len(pair) != 2:
                raise ValueError(f"from_pairs: row {r} must be an (ids, weights) pair")
            ids = np.asarray(pair[0], dtype=np.int64).reshape(-1)
            w = np.asarray(pair[1], dtype=np.float32).reshape(-1)
            if ids.shape != w.shape:
                raise ValueError(f"from_pairs: row {r} has {ids.size} ids but {w.size} weights")
            order = np.argsort(ids, kind="stable")
            ids, w = ids[order], w[order]
            if np.any(ids[1:] == ids[:-1]):
                raise ValueError(f"from_pairs: row {r} has duplicate term id {int(ids[1:][ids[1:] == ids[:-1]][0])}")
            max_id = max(max_id, int(ids[-1]) if ids.size else -1)
            keep = w != 0
            ids_list.append(ids[keep])
            w_list.append(w[keep])
        if vocab_size is None:
            vocab_size = max(max_id + 1, 1)
        indptr = np.zeros(len(ids_list) + 1, dtype=np.int64)
        np.cumsum([i.size for i in ids_list], out=indptr[1:])
        cat = np.concatenate(ids_list) if ids_list else np.zeros(0, np.int64)
        if cat.size and (cat.min() < 0 or cat.max() >= vocab_size):
            raise ValueError(f"from_pairs: term ids must lie in [0, {vocab_size}), got min {cat.min()} "
                             f"max {cat.max()}")
        vals = np.concatenate(w_list) if w_list else np.zeros(0, np.float32)
        return cls(indptr, cat, vals, vocab_size=vocab_size)

    @classmethod
    def from_scipy(cls, matrix: sp.spmatrix | sp.sparray) -> SparseBatch:
        """Any scipy sparse [N, V] matrix -> batch (duplicates summed, ids sorted, zeros dropped)."""
        csr = sp.csr_array(matrix, dtype=np.float32)
        csr.sum_duplicates()
        csr.eliminate_zeros()
        csr.sort_indices()
        return cls(csr.indptr, csr.indices, csr.data, vocab_size=csr.shape[1])

    @classmethod
    def concat(cls, batches: Sequence[SparseBatch]) -> SparseBatch:
        """Rows of ``batches`` one after the other; all must share ``vocab_size``."""
        if not batches:
            raise ValueError("concat: need at least one SparseBatch")
        vocab = {b.vocab_size for b in batches}
        if len(vocab) != 1:
            raise ValueError(f"concat: batches have different vocab_size {sorted(vocab)}")
        offsets = np.cumsum([0] + [b.nnz for b in batches[:-1]])
        indptr = np.concatenate([[0]] + [b.indptr[1:] + o for b, o in zip(batches, offsets, strict=True)])
        return cls(indptr, np.concatenate([b.indices for b in batches]),
                   np.concatenate([b.values for b in batches]), vocab_size=vocab.pop())

    # ---- access ------------------------------------------------------------------------------------------

    def __len__(self) -> int:
        return self.indptr.size - 1

    @property
    def nnz(self) -> int:
        return int(self.indices.size)

    @property
    def nbytes(self) -> int:
        """Bytes held by the three CSR arrays."""
        return int(self.indptr.nbytes + self.indices.nbytes + self.values.nbytes)

    def row(self, i: int) -> tuple[np.ndarray, np.ndarray]:
        """(term ids int32, weights float32) of row ``i`` (views, ids ascending)."""
        n = len(self)
        if not -n <= i < n:
            raise ValueError(f"row: index {i} out of range for {n} rows")
        i %= n
        s, e = self.indptr[i], self.indptr[i + 1]
        return self.indices[s:e], self.values[s:e]

    def select(self, rows: Sequence[int] | np.ndarray | slice) -> SparseBatch:
        """The batch of the given rows (indices or a slice), in that order."""
        picked = np.arange(len(self))[rows]
        return SparseBatch.from_scipy(self.to_scipy()[np.atleast_1d(picked)])

    def to_scipy(self) -> sp.csr_array:
        """scipy CSR array [N, vocab_size] sharing this batch's arrays where dtypes allow."""
        return sp.csr_array((self.values, self.indices, self.indptr), shape=(len(self), self.vocab_size))

    def to_dense(self) -> np.ndarray:
        """Dense float32 [N, vocab_size] (for tests and small batches)."""
        return self.to_scipy().toarray()

    # ---- persistence -------------------------------------------------------------------------------------

    def save(self, path: str | Path) -> None:
        """Write an uncompressed ``.npz`` (plain arrays, no pickled objects)."""
        np.savez(path, format=np.array(_FORMAT), indptr=self.indptr, indices=self.indices,
                 values=self.values, vocab_size=np.array(self.vocab_size, dtype=np.int64))

    @classmethod
    def load(cls, path: str | Path) -> SparseBatch:
        """Read a file written by ``save`` (``allow_pickle=False``)."""
        with np.load(path, allow_pickle=False) as f:
            missing = {"format", "indptr", "indices", "values", "vocab_size"} - set(f.files)
            if missing:
                raise ValueError(f"{path}: not a SparseBatch file, missing fields {sorted(missing)}")
            if str(f["format"]) != _FORMAT:
                raise ValueError(f"{path}: field 'format' is {str(f['format'])!r}, expected {_FORMAT!r}")
            try:
                return cls(f["indptr"], f["indices"], f["values"], vocab_size=int(f["vocab_size"]))
            except ValueError as e:
                raise ValueError(f"{path}: {e}") from e
