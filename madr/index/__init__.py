"""Sharded dense (FAISS) + sparse indexes: manifest, writing, searching, display fields, encoding."""

from madr.index.docstore import DocStore
from madr.index.encode import encode_documents, encode_queries
from madr.index.manifest import Manifest, ShardInfo
from madr.index.sharded import Shard, ShardedIndex, build_index, load_shard, merge_topk

__all__ = ["DocStore", "Manifest", "Shard", "ShardInfo", "ShardedIndex", "build_index", "encode_documents",
           "encode_queries", "load_shard", "merge_topk"]
