"""Sparse lexical retrieval: compact term-weight vectors, an exact inverted index and BM25 (paper 002)."""

from madr.sparse.bm25 import BM25Index
from madr.sparse.inverted_index import InvertedIndex
from madr.sparse.vectors import SparseBatch

__all__ = ["BM25Index", "InvertedIndex", "SparseBatch"]
