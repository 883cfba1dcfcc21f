"""Batch encode job: corpus -> sharded FAISS (+ sparse) indexes with a manifest (``python -m pipelines.encode``)."""
