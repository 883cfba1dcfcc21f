"""Which sparse retrieval backend a hybrid index searches with, chosen in the index config and recorded in
the manifest:

- ``exact`` (default): the inverted index, searched in one compiled pass (``InvertedIndex``,
  ``madr.search.sparse.compiled``); exact top-k.
- ``seismic``: Seismic's approximate index (``SeismicSparseIndex``), built by the encode job into each shard
  beside the exact one (``shard-NNNNN.sparse.seismic``, checksummed like every shard file); candidates come
  from Seismic, exact re-scoring of dense candidates still from the inverted index.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from madr.search.sparse.inverted_index import InvertedIndex
from madr.search.sparse.seismic_index import SeismicParams, SeismicSparseIndex

BACKENDS = ("exact", "seismic")
SEISMIC_SUFFIX = ".sparse.seismic"


@dataclass
class SparseBackend:
    """``name`` (``exact`` | ``seismic``) and, for ``seismic``, its build and search knobs."""

    name: str = "exact"
    seismic: SeismicParams = field(default_factory=SeismicParams)

    def __post_init__(self) -> None:
        if self.name not in BACKENDS:
            raise ValueError(f"sparse_backend must be one of {BACKENDS}, got {self.name!r}")
        if isinstance(self.seismic, dict):
            self.seismic = SeismicParams.from_dict(self.seismic)

    @classmethod
    def from_dict(cls, d: dict[str, Any] | None) -> SparseBackend:
        """From a manifest record or a config section (None: exact)."""
        d = dict(d or {})
        return cls(name=d.pop("name", "exact"), seismic=SeismicParams.from_dict(d.pop("seismic", None)))

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "seismic": self.seismic.to_dict()} if self.approximate else {"name": self.name}

    @property
    def approximate(self) -> bool:
        return self.name == "seismic"

    def write(self, exact: InvertedIndex, path: str | Path) -> None:
        """Build this backend's own index over ``exact``'s documents into ``path`` (nothing for ``exact``)."""
        if self.approximate:
            SeismicSparseIndex.build(exact, self.seismic).save(path)

    def open(self, exact: InvertedIndex, path: str | Path | None) -> InvertedIndex | SeismicSparseIndex:
        """The searcher of a shard: ``exact`` itself, or the Seismic index at ``path`` over it."""
        if not self.approximate:
            return exact
        if path is None:
            raise ValueError("the manifest asks for the seismic sparse backend but the shard has no Seismic file")
        return SeismicSparseIndex.load(path, exact, self.seismic)
