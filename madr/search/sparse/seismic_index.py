"""Approximate sparse top-k with Seismic (Bruch, Nardini, Rulli, Venturini, SIGIR'24; `pyseismic-lsr`):
posting lists pruned to their largest weights, split into clusters each summarised by a sparse vector, and
scanned only where a summary's score can beat the current heap (``heap_factor``), over the query's
``query_cut`` largest terms.

Seismic generates candidates; the exact inverted index of the same documents (``InvertedIndex``) stays beside
it for ``score`` (the hybrid searcher re-scores dense candidates exactly) and for the term list. Results keep
madr's convention: scores > 0, score descending, ties by global id ascending, padded -inf / -1.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from madr.search.params import SearchParams, resolve
from madr.search.protocol import TopK, pad_rows
from madr.search.sparse.inverted_index import InvertedIndex, top_k_row
from madr.search.sparse.vectors import SparseBatch


@dataclass
class SeismicParams:
    """Build (``n_postings`` .. ``doc_cut``) and search (``query_cut``, ``heap_factor``) knobs of Seismic
    (the names and meanings of `pyseismic-lsr`'s ``build_from_dataset`` / ``batch_search``); defaults are the
    library's for SPLADE on MS MARCO scaled down to catalogs of 10^4-10^6 documents."""

    n_postings: int = 1000
    centroid_fraction: float = 0.1
    summary_energy: float = 0.4
    doc_cut: int = 15
    query_cut: int = 10
    heap_factor: float = 0.7

    def __post_init__(self) -> None:
        if self.n_postings < 1 or self.doc_cut < 1 or self.query_cut < 1:
            raise ValueError(f"seismic: n_postings, doc_cut and query_cut must be >= 1, got {self}")
        if not 0.0 < self.centroid_fraction <= 1.0 or not 0.0 < self.summary_energy <= 1.0:
            raise ValueError(f"seismic: centroid_fraction and summary_energy must be in (0, 1], got {self}")
        if not 0.0 < self.heap_factor <= 1.0:
            raise ValueError(f"seismic: heap_factor must be in (0, 1], got {self.heap_factor}")

    @classmethod
    def from_dict(cls, d: dict | None) -> SeismicParams:
        return cls(**(d or {}))

    def to_dict(self) -> dict:
        return asdict(self)


def _seismic():
    try:
        import seismic
    except ImportError as e:  # pragma: no cover - a dependency of madr
        raise ImportError("the seismic sparse backend needs pyseismic-lsr (pip install pyseismic-lsr)") from e
    return seismic


def _components(terms: np.ndarray):
    return np.array([str(t) for t in terms], dtype=_seismic().get_seismic_string())


class SeismicSparseIndex:
    """Seismic over the documents of an exact ``InvertedIndex`` (a ``madr.search.protocol.Searcher``)."""

    def __init__(self, seismic_index, exact: InvertedIndex, params: SeismicParams) -> None:
        self.seismic, self.exact, self.params = seismic_index, exact, params

    @classmethod
    def build(cls, exact: InvertedIndex, params: SeismicParams | None = None,
              num_threads: int = 1) -> SeismicSparseIndex:
        """Index the documents of ``exact`` (their global ids become Seismic's document ids)."""
        params = params or SeismicParams()
        seismic = _seismic()
        docs = exact.documents()
        dataset = seismic.SeismicDataset(dim=exact.vocab_size)
        if len(docs) and docs.indptr[-1]:
            dataset.add_documents_by_id([str(i) for i in exact.ids], np.asarray(docs.indices, np.int64),
                                        np.asarray(docs.values, np.float32), np.asarray(docs.indptr, np.int64))
        index = seismic.SeismicIndex.build_from_dataset(
            dataset, n_postings=params.n_postings, centroid_fraction=params.centroid_fraction,
            summary_energy=params.summary_energy, doc_cut=params.doc_cut, num_threads=num_threads)
        return cls(index, exact, params)

    def __len__(self) -> int:
        return len(self.exact)

    @property
    def ids(self) -> np.ndarray:
        return self.exact.ids

    @property
    def vocab_size(self) -> int:
        return self.exact.vocab_size

    def search(self, queries: SparseBatch, params: SearchParams | None = None, *, num_threads: int = 1,
               query_cut: int | None = None, heap_factor: float | None = None, **overrides) -> TopK:
        """Approximate top ``params.k`` by dot product: (scores [Q, k] float32, ids [Q, k] int64)."""
        k = resolve(params, overrides).k
        self.exact.check_queries(queries)
        if len(queries) == 0:
            return pad_rows([], k)
        rows = [(queries.indices[s:e], queries.values[s:e])
                for s, e in zip(queries.indptr[:-1], queries.indptr[1:], strict=True)]
        results = self.seismic.batch_search(
            _components(np.arange(len(rows))), [_components(t) for t, _ in rows],
            [np.asarray(v, np.float32) for _, v in rows], k,
            query_cut or self.params.query_cut, heap_factor or self.params.heap_factor, num_threads=num_threads)
        by_query: dict[int, list] = {}
        for hits in results:  # Seismic's result lists need not come back in query order
            if hits:
                by_query[int(hits[0][0])] = hits
        return pad_rows([_ranked(by_query.get(q, []), k) for q in range(len(rows))], k)

    def score(self, queries: SparseBatch, ids: np.ndarray, batch_size: int | None = None) -> np.ndarray:
        """Exact scores of given documents (``InvertedIndex.score``)."""
        return self.exact.score(queries, ids, batch_size)

    def term_ids(self) -> np.ndarray:
        return self.exact.term_ids()

    def save(self, path: str | Path) -> None:
        """Write the Seismic index to exactly ``path`` (the library appends ``.index.seismic``)."""
        path = Path(path)
        stem = path.with_name(path.name + ".tmp")
        self.seismic.save(str(stem))
        Path(str(stem) + ".index.seismic").replace(path)

    @classmethod
    def load(cls, path: str | Path, exact: InvertedIndex, params: SeismicParams | None = None) -> SeismicSparseIndex:
        """Read a file written by ``save``; ``exact`` is the inverted index of the same documents."""
        index = _seismic().SeismicIndex.load(str(path))
        non_empty = exact.documents_with_terms()  # Seismic skips empty documents
        if index.len != non_empty:
            raise ValueError(f"{path}: Seismic holds {index.len} documents, the exact index {non_empty} "
                             f"non-empty ones (files of different shards?)")
        return cls(index, exact, params or SeismicParams())


def _ranked(hits, k: int) -> tuple[np.ndarray, np.ndarray]:
    """Seismic's (query id, score, doc id) hits -> madr's order (``top_k_row``: scores > 0, desc, ties by id)."""
    scores = np.array([h[1] for h in hits], dtype=np.float32)
    ids = np.array([int(h[2]) for h in hits], dtype=np.int64)
    return top_k_row(scores, ids, k)
