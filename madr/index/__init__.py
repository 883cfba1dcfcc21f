"""Sharded dense (FAISS) + sparse indexes: manifest, writing, checksums, display fields, encoding.
Searching them is ``madr.search.sharded``.

``encode_documents`` / ``encode_queries`` (``madr.index.encode``) need torch and the model code; they are
imported on first use (module ``__getattr__``, PEP 562), so ``from madr.index import Manifest`` in a
search-only process (Serve shard replicas) does not import torch.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from madr.index.build import build_index
from madr.index.docstore import DocStore
from madr.index.manifest import Manifest, ShardInfo

if TYPE_CHECKING:
    from madr.index.encode import encode_documents, encode_queries

_LAZY = {"encode_documents": "madr.index.encode", "encode_queries": "madr.index.encode"}

__all__ = ["DocStore", "Manifest", "ShardInfo", "build_index", "encode_documents", "encode_queries"]


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
