"""SparseBatch: CSR storage of (term id, weight) pairs with top-k sparsification (paper 002 Sec. 4.2)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from madr.search.sparse.vectors import SparseBatch


def test_from_dense_keeps_nonzeros_in_term_order():
    dense = np.array([[0.0, 2.0, 0.0, 1.0], [0.0, 0.0, 0.0, 0.0], [3.0, 0.0, 0.5, 0.0]], dtype=np.float32)
    b = SparseBatch.from_dense(dense)
    assert b.indptr.tolist() == [0, 2, 2, 4], f"indptr {b.indptr}"
    assert b.indices.tolist() == [1, 3, 0, 2], f"indices {b.indices}"
    assert b.values.tolist() == [2.0, 1.0, 3.0, 0.5], f"values {b.values}"
    assert (b.indptr.dtype, b.indices.dtype, b.values.dtype) == (np.int64, np.int32, np.float32)
    assert b.vocab_size == 4 and len(b) == 3 and b.nnz == 4
    np.testing.assert_array_equal(b.to_dense(), dense, err_msg="to_dense must invert from_dense")


def test_from_dense_top_k_keeps_largest_and_breaks_ties_by_lower_term_id():
    dense = torch.tensor([[0.1, 0.9, 0.5, 0.5, 0.5, 0.0], [0.0, 0.0, 0.0, 0.0, 0.3, 0.0]])
    b = SparseBatch.from_dense(dense, top_k=3)
    ids, w = b.row(0)
    assert ids.tolist() == [1, 2, 3], f"top-3 of row 0 should be 0.9 and the two lowest-id 0.5s, got {ids}"
    np.testing.assert_allclose(w, [0.9, 0.5, 0.5])
    ids, w = b.row(1)
    assert ids.tolist() == [4], f"zeros are dropped even inside the top-k, got {ids}"


def test_from_dense_top_k_larger_than_vocab_keeps_all_nonzeros():
    dense = np.array([[1.0, 0.0, 2.0]])
    assert SparseBatch.from_dense(dense, top_k=10).indices.tolist() == [0, 2]


def test_from_pairs_sorts_drops_zeros_and_infers_vocab():
    b = SparseBatch.from_pairs([([5, 2, 7], [0.5, 1.0, 0.0]), ([], [])])
    assert b.vocab_size == 8, f"vocab_size = max id + 1 = 8, got {b.vocab_size}"
    ids, w = b.row(0)
    assert ids.tolist() == [2, 5] and w.tolist() == [1.0, 0.5], f"row 0 {ids} {w}"
    assert b.row(1)[0].size == 0, "empty row stays empty"


@pytest.mark.parametrize("pairs, match", [
    ([([1, 1], [1.0, 2.0])], "duplicate term id 1"),
    ([([1, 2], [1.0])], "2 ids but 1 weights"),
    ([([-1], [1.0])], "term ids must lie in"),
])
def test_from_pairs_rejects_bad_rows(pairs, match):
    with pytest.raises(ValueError, match=match):
        SparseBatch.from_pairs(pairs, vocab_size=4)


def test_constructor_rejects_unsorted_rows_and_nan():
    with pytest.raises(ValueError, match="row 1 has unsorted or duplicate"):
        SparseBatch(np.array([0, 1, 3]), np.array([2, 3, 1]), np.ones(3), vocab_size=4)
    with pytest.raises(ValueError, match="NaN"):
        SparseBatch.from_dense(np.array([[np.nan, 1.0]]))


def test_constructor_allows_rows_restarting_at_lower_ids():
    b = SparseBatch(np.array([0, 2, 2, 3]), np.array([1, 3, 0]), np.ones(3), vocab_size=4)
    assert b.row(2)[0].tolist() == [0]


def test_to_scipy_concat_and_nbytes():
    a = SparseBatch.from_pairs([([0, 2], [1.0, 2.0])], vocab_size=3)
    b = SparseBatch.from_pairs([([1], [3.0]), ([0], [4.0])], vocab_size=3)
    c = SparseBatch.concat([a, b])
    np.testing.assert_array_equal(c.to_scipy().toarray(), [[1, 0, 2], [0, 3, 0], [4, 0, 0]])
    assert c.nbytes == 4 * 8 + 4 * 4 + 4 * 4, f"nbytes counts indptr int64 + indices int32 + values f32, {c.nbytes}"
    with pytest.raises(ValueError, match="different vocab_size"):
        SparseBatch.concat([a, SparseBatch.from_pairs([([0], [1.0])], vocab_size=5)])


def test_save_load_round_trip(tmp_path):
    rng = np.random.default_rng(0)
    dense = rng.random((6, 20)) * (rng.random((6, 20)) < 0.3)
    b = SparseBatch.from_dense(dense)
    b.save(tmp_path / "b.npz")
    r = SparseBatch.load(tmp_path / "b.npz")
    for name in ("indptr", "indices", "values"):
        np.testing.assert_array_equal(getattr(r, name), getattr(b, name), err_msg=name)
    assert r.vocab_size == 20


def test_load_rejects_foreign_file(tmp_path):
    np.savez(tmp_path / "x.npz", a=np.zeros(2))
    with pytest.raises(ValueError, match=r"x\.npz: not a SparseBatch file"):
        SparseBatch.load(tmp_path / "x.npz")


def test_select_rows():
    b = SparseBatch.from_pairs([([0], [1.0]), ([1], [2.0]), ([2], [3.0])], vocab_size=3)
    assert [b.select([2, 0]).row(i)[0].tolist() for i in range(2)] == [[2], [0]], "rows in the given order"
    assert len(b.select(slice(1, None))) == 2
