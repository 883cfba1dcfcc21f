"""Classical, training-free ranking baselines (paper 004 Sec. VI-D, Table III): minimum edit distance.

BM25 lives with the sparse index (`madr.sparse.bm25`)."""

from madr.baselines.edit_distance import (
    char_levenshtein,
    edit_distance_scores,
    levenshtein,
    rank_by_edit_distance,
    similarity,
    token_levenshtein,
)

__all__ = [
    "char_levenshtein",
    "edit_distance_scores",
    "levenshtein",
    "rank_by_edit_distance",
    "similarity",
    "token_levenshtein",
]
