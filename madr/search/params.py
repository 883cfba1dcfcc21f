"""The search-time settings every searcher takes: one declaration, passed down by every config that needs them.

``SearchParams`` is what a ``madr.search.protocol.Searcher`` reads; each searcher uses the fields that apply
to it and ignores the others (an exact or sparse searcher has no ``nprobe``):

- ``k``: results per query;
- ``candidates``: hybrid and fused search only, how many documents the dense and the sparse (or BM25)
  retriever each nominate per query before they are combined (None: ``max(k, 100)``);
- ``lam``: the interpolation weight, ``s = lam * dense + (1 - lam) * sparse`` (paper 002 Eq. 1) or
  ``lam * dense + (1 - lam) * bm25`` for an index with a BM25 part (None: the index's own ``hybrid_lambda``
  or ``fusion_lambda``, recorded when it was built; 1 = dense only, 0 = sparse / BM25 only);
- ``normalisation``: per-query normalisation of both parts before interpolating (``madr.search.score_fusion``;
  None: the searcher's default, ``"none"`` for dense and hybrid search, ``"minmax"`` for dense + BM25
  fusion; sharded SPLADE-hybrid search supports only ``"none"``, which keeps a score independent of the
  shard a document is in);
- ``nprobe``: IVF indexes, inverted lists probed (None: the index's own);
- ``ef_search``: HNSW indexes, the search beam (None: the index's own);
- ``aspect_weight``: indexes with aspect data only, the weight ``w`` of the aspect-match score fused with the
  candidates' retrieval score, ``(1 - w) * minmax(s) + w * match`` (``madr.search.aspect_match``; None: the
  index's own, recorded by the tune stage, 0 when it has none; 0 = the retrieval score alone).

Configs hold a ``search: SearchParams`` field (YAML section ``search:``): the experiment
(``madr.config.ExperimentConfig``), an evaluation or mining run (``madr.search.spec.SearchSpec``)
and the Serve app (``madr.serve_config.ServeSettings``). A searcher's ``search(queries, params, **overrides)`` takes
``SearchParams`` and/or single fields as keywords (``index.search(q, k=10, nprobe=8)``), checked here.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

DEFAULT_CANDIDATES = 100
NORMALISATIONS = ("none", "minmax", "zscore")


@dataclass(frozen=True)
class SearchParams:
    """Search-time settings (module docstring). Frozen and hashable: equal params can share one batched call."""

    k: int = 10
    candidates: int | None = None
    lam: float | None = None
    normalisation: str | None = None
    nprobe: int | None = None
    ef_search: int | None = None
    aspect_weight: float | None = None

    def __post_init__(self) -> None:
        for name in ("k", "candidates", "nprobe", "ef_search"):
            value = getattr(self, name)
            if value is None and name != "k":
                continue
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"search.{name} must be >= 1 (an integer{'' if name == 'k' else ' or null'}), "
                                 f"got {value!r}")
        if self.lam is not None:
            if isinstance(self.lam, bool | str) or not _is_unit(self.lam):
                raise ValueError(f"search.lam must be in [0, 1] or null, got {self.lam!r}")
            object.__setattr__(self, "lam", float(self.lam))
        if self.aspect_weight is not None:
            if isinstance(self.aspect_weight, bool | str) or not _is_unit(self.aspect_weight):
                raise ValueError(f"search.aspect_weight must be in [0, 1] or null, got {self.aspect_weight!r}")
            object.__setattr__(self, "aspect_weight", float(self.aspect_weight))
        if self.normalisation is not None and self.normalisation not in NORMALISATIONS:
            raise ValueError(f"search.normalisation must be one of {', '.join(NORMALISATIONS)} or null, "
                             f"got {self.normalisation!r}")

    @property
    def num_candidates(self) -> int:
        """Documents each retriever nominates in hybrid search: ``candidates``, else ``max(k, 100)``."""
        return max(self.k, DEFAULT_CANDIDATES) if self.candidates is None else self.candidates

    def normalisation_or(self, default: str) -> str:
        """``normalisation``, or the searcher's ``default`` when it is None."""
        return default if self.normalisation is None else self.normalisation

    def replace(self, **changes: Any) -> SearchParams:
        """A copy with ``changes`` applied (checked like the constructor; unknown names are a TypeError)."""
        _check_names(changes)
        return dataclasses.replace(self, **changes) if changes else self


def _is_unit(value: Any) -> bool:
    try:
        return 0.0 <= float(value) <= 1.0
    except (TypeError, ValueError):
        return False


def _check_names(changes: dict[str, Any]) -> None:
    known = {f.name for f in dataclasses.fields(SearchParams)}
    unknown = sorted(set(changes) - known)
    if unknown:
        raise TypeError(f"unknown search setting(s) {', '.join(unknown)}; known: {', '.join(sorted(known))}")


def resolve(params: SearchParams | None, overrides: dict[str, Any]) -> SearchParams:
    """``params`` (default ``SearchParams()``) with the keyword ``overrides`` of a ``search`` call applied."""
    if params is not None and not isinstance(params, SearchParams):
        raise TypeError(f"search: params must be a SearchParams, got {type(params).__name__} "
                        "(pass k as a keyword: search(queries, k=10))")
    return (params or SearchParams()).replace(**overrides)
