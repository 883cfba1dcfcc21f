"""Retrieval over encoded collections: sparse indexes and BM25, score fusion, the hybrid searcher,
and training-free baselines."""
