"""Retrieval over encoded collections: one ``SearchParams`` (``params``) and one ``Searcher`` protocol
(``protocol``) implemented by the exact reference (``exact``), FAISS shards (``sharded``), the sparse inverted
index and BM25 (``sparse``) and the hybrid searcher (``hybrid``); score fusion and training-free baselines."""
