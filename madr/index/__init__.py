"""Sharded dense (FAISS) + sparse indexes: manifest, writing, searching, display fields, encoding.

``encode_documents`` / ``encode_queries`` (``madr.index.encode``) need torch and the model code; they are
imported on first use (module ``__getattr__``, PEP 562), so ``from madr.index import ShardedIndex`` in a
search-only process (Serve shard replicas) does not import torch.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from madr.index.docstore import DocStore
from madr.index.manifest import Manifest, ShardInfo
from madr.index.sharded import Shard, ShardedIndex, build_index, load_shard, merge_topk

if TYPE_CHECKING:
    from madr.index.encode import encode_documents, encode_queries

_LAZY = {"encode_documents": "madr.index.encode", "encode_queries": "madr.index.encode"}

__all__ = ["DocStore", "Manifest", "Shard", "ShardInfo", "ShardedIndex", "build_index", "encode_documents",
           "encode_queries", "load_shard", "merge_topk"]


def __getattr__(name: str) -> Any:
    """Import the torch-dependent names of ``_LAZY`` on first access."""
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
