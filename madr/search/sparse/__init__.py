"""Sparse lexical retrieval: compact term-weight vectors, an exact inverted index and BM25 (paper 002)."""

from madr.search.sparse.bm25 import BM25Index
from madr.search.sparse.inverted_index import InvertedIndex
from madr.search.sparse.vectors import SparseBatch

__all__ = ["BM25Index", "InvertedIndex", "SparseBatch"]
