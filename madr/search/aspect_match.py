"""Aspects as an explicit search signal: the aspect-match score, its fusion with the retrieval score, and
aspect filters / boosts over the candidates (numpy only; the distributions come from ``madr.index.aspects``).

Aspect-match score. For aspect ``a``, the query's and the product's calibrated value distributions
``p_q(a)`` and ``p_d(a)`` (paper 000 Sec. 5: ``P(x) = softmax(E_a U_a^T + b_a)`` over the aspect's values,
temperature-scaled, ``madr.modeling.calibration``) match by their inner product, the probability that the two
draw the same value::

    score_a(q, d) = <p_q(a), p_d(a)> = sum_x p_q(a)[x] * p_d(a)[x]

and the aspects are weighted by how present each is in the *query* (paper 000 Sec. 6.2, Eq. 5: ``P_a(Q)``, the
presence probability; L1-normalised over the aspects as the paper's aspect weights are)::

    match(q, d) = sum_a P_a(q) * score_a(q, d) / sum_a P_a(q)        (0 when sum_a P_a(q) = 0)

so a query that names no colour is not scored on colour. Both distributions are cut to the index's top-k values
(the mass beyond them is dropped, so a score is a slight under-estimate); ``match`` lies in [0, 1]. Models
without a presence head count every aspect as present (``P_a = 1``).

Fusion (a third signal after dense and BM25): the base search's candidates (for dense + BM25 fusion the whole
union of both retrievers' top-``candidates``; else the top-``candidates``) keep their fused score ``s``, min-max
normalised per query over the candidates, and are re-scored as ``(1 - w) * s + w * match`` with ``w`` the
``aspect_weight`` (``madr.search.params.SearchParams``; 0 leaves the ranking unchanged).

Filters / boosts: a condition ``{aspect: value ids}`` (the caller's values, or the query's own predicted values
whose confidence ``P_a(q) * p_q(a)[x]`` reaches ``min_confidence``) holds for a product when, for every aspect
of the condition, the product's most probable stored value is one of the wanted ones. ``filter`` keeps those
products only; ``boost`` ranks them first (each group in its score order).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from madr.index.aspects import AspectInfo, AspectTable, AspectTopK, load_shard_aspects
from madr.index.manifest import MANIFEST_FILE, Manifest
from madr.search.protocol import PAD_ID, TopK, pad_rows
from madr.search.score_fusion import normalise
from madr.serve_config import ASPECT_FILTER_MODES

Condition = dict[str, frozenset[int]]  # aspect -> wanted value ids


def aspect_scores(q_values: np.ndarray, q_probs: np.ndarray, d_values: np.ndarray, d_probs: np.ndarray) -> np.ndarray:
    """``score_a`` (module docstring) of one query's top-k [kq] against C products' top-k [C, kd]: [C] float64,
    the sum of ``p_q[x] * p_d[x]`` over the values ``x`` both hold (-1 padding never matches)."""
    same = (d_values[:, :, None] == q_values[None, None, :]) & (q_values[None, None, :] >= 0)
    return (same * d_probs[:, :, None].astype(np.float64) * q_probs[None, None, :].astype(np.float64)).sum(axis=(1, 2))


@dataclass
class MatchExplained:
    """The aspect match of one query against C products: ``total`` [C], per aspect ``scores`` [C], the query's
    ``presence`` and the aspect's share ``weight`` = ``P_a(q) / sum P(q)`` (contribution = weight * score)."""

    total: np.ndarray
    scores: dict[str, np.ndarray]
    presence: dict[str, float]
    weight: dict[str, float]


def aspect_match(query: AspectTable, row: int, docs: AspectTable) -> MatchExplained:
    """``match(q, d)`` of query ``row`` of ``query`` against every product of ``docs`` (module docstring)."""
    names = [a for a in query if a in docs]
    n = len(next(iter(docs.values()))) if docs else 0
    presence = {a: float(query[a].presence[row]) for a in names}
    mass = sum(presence.values())
    weight = {a: (presence[a] / mass if mass > 0 else 0.0) for a in names}
    scores = {a: aspect_scores(query[a].values[row], query[a].probs[row], docs[a].values, docs[a].probs)
              for a in names}
    total = np.zeros(n)
    for a in names:
        total += weight[a] * scores[a]
    return MatchExplained(total, scores, presence, weight)


class AspectStore:
    """Every product's stored top-k aspect values (all shards), looked up by global id, and each aspect's value
    strings; ``aspect_weight`` is the manifest's (the weight of a search that sets none)."""

    def __init__(self, ids: np.ndarray, table: AspectTable, values: dict[str, list[str]], info: AspectInfo) -> None:
        order = np.argsort(ids, kind="stable")
        self.ids = np.asarray(ids, dtype=np.int64)[order]
        self.table = {a: t.select(order) for a, t in table.items()}
        self.values, self.info = values, info
        self._index = {a: {v.strip().casefold(): i for i, v in enumerate(vs)} for a, vs in values.items()}

    @classmethod
    def open(cls, manifest_path: str | Path) -> AspectStore | None:
        """The store of an index (a manifest or its directory); None when it has no aspect data."""
        path = Path(manifest_path)
        path = path / MANIFEST_FILE if path.is_dir() else path
        manifest = Manifest.load(path)
        if manifest.aspects is None:
            return None
        info, base = AspectInfo.from_dict(manifest.aspects), path.parent
        ids = [np.load(base / s.ids_path, allow_pickle=False) for s in manifest.shards]
        tables = [load_shard_aspects(base / s.aspects_path, info.aspects) for s in manifest.shards]
        table = {a: AspectTopK(np.concatenate([t[a].values for t in tables]), np.concatenate([t[a].probs for t in tables]),
                               np.concatenate([t[a].presence for t in tables])) for a in info.aspects}
        return cls(np.concatenate(ids), table, info.values(base), info)

    @property
    def aspects(self) -> list[str]:
        return list(self.table)

    @property
    def aspect_weight(self) -> float:
        return self.info.aspect_weight

    def lookup(self, ids: np.ndarray) -> AspectTable:
        """The rows of global ``ids`` ([C]); a ValueError names an id the index does not hold."""
        ids = np.asarray(ids, dtype=np.int64).reshape(-1)
        pos = np.minimum(np.searchsorted(self.ids, ids), max(self.ids.size - 1, 0))
        if ids.size and (self.ids.size == 0 or (self.ids[pos] != ids).any()):
            raise ValueError(f"aspects: id {int(ids[self.ids[pos] != ids][0])} is not in the index")
        return {a: t.select(pos) for a, t in self.table.items()}

    def value_ids(self, aspect: str, strings: Iterable[str]) -> frozenset[int]:
        """Ids of ``strings`` (case-insensitive) in ``aspect``'s values; a ValueError names the aspect and the first
        unknown value."""
        if aspect not in self._index:
            raise ValueError(f"aspects.{aspect}: not an aspect of this index ({', '.join(self.aspects)})")
        out = set()
        for s in strings:
            i = self._index[aspect].get(str(s).strip().casefold())
            if i is None:
                raise ValueError(f"aspects.{aspect}: value {s!r:.60} is not in the index's {aspect} values")
            out.add(i)
        return frozenset(out)

    def condition(self, wanted: Mapping[str, Iterable[str]]) -> Condition:
        """``{aspect: value ids}`` of caller-given value strings (``value_ids``)."""
        return {a: self.value_ids(a, vs) for a, vs in wanted.items()}

    def names(self, aspect: str, ids: Iterable[int]) -> list[str]:
        """The value strings of value ids (padding ids skipped)."""
        return [self.values[aspect][int(i)] for i in ids if int(i) >= 0]


def aspect_rescore(base: TopK, query: AspectTable, store: AspectStore, weight: float, k: int) -> TopK:
    """Per query, the base candidates re-scored ``(1 - weight) * minmax(s) + weight * match`` (module docstring);
    top ``k``, ties by id ascending; [Q, k] padded. ``weight`` 0 returns the base ranking cut to ``k``."""
    if not 0.0 <= weight <= 1.0:
        raise ValueError(f"aspect_weight must be in [0, 1], got {weight}")
    scores, ids = np.asarray(base[0], dtype=np.float64), np.asarray(base[1], dtype=np.int64)
    rows = []
    for q in range(ids.shape[0]):
        live = (ids[q] != PAD_ID) & np.isfinite(scores[q])
        s, i = scores[q][live], ids[q][live]
        if weight > 0 and i.size:
            s = (1.0 - weight) * normalise(s, "minmax") + weight * aspect_match(query, q, store.lookup(i)).total
        order = np.lexsort((i, -s))[:k]
        rows.append((s[order], i[order]))
    return pad_rows(rows, k)


def predicted_condition(query: AspectTable, row: int, min_confidence: float, store: AspectStore) -> Condition:
    """The query's own values whose confidence ``P_a(q) * p_q(a)[x]`` is at least ``min_confidence``, per aspect of
    the index (aspects with none are left out)."""
    out: Condition = {}
    for a in store.aspects:
        if a not in query:
            continue
        t = query[a]
        keep = (t.values[row] >= 0) & (t.presence[row] * t.probs[row] >= min_confidence)
        if keep.any():
            out[a] = frozenset(int(v) for v in t.values[row][keep])
    return out


def condition_mask(docs: AspectTable, condition: Condition) -> np.ndarray:
    """[C] True where every aspect of ``condition`` has its wanted value as the product's top stored value."""
    n = len(next(iter(docs.values()))) if docs else 0
    mask = np.ones(n, dtype=bool)
    for a, wanted in condition.items():
        mask &= np.isin(docs[a].values[:, 0], np.fromiter(wanted, dtype=np.int64, count=len(wanted)))
    return mask


def apply_condition(scores: np.ndarray, ids: np.ndarray, mask: np.ndarray, mode: str) -> tuple[np.ndarray, np.ndarray]:
    """One query's ranked candidates after ``filter`` (matching only) or ``boost`` (matching first, each group in
    the given order). Boosted candidates' scores are raised above every other candidate's (by the score range + 1),
    so the returned scores order the ranking (a run file's reader, or an API client, that sorts by score gets it)."""
    if mode not in ASPECT_FILTER_MODES:
        raise ValueError(f"aspect_filter.mode must be one of {', '.join(ASPECT_FILTER_MODES)}, got {mode!r}")
    if mode == "filter":
        return scores[mask], ids[mask]
    if scores.size:
        scores = np.where(mask, scores + (scores.max() - scores.min()) + 1.0, scores)
    order = np.concatenate([np.flatnonzero(mask), np.flatnonzero(~mask)])
    return scores[order], ids[order]


def predicted_filter(base: TopK, query: AspectTable, store: AspectStore, min_confidence: float, mode: str,
                     k: int) -> TopK:
    """Per query, the base candidates filtered / boosted (``apply_condition``) by the query's own predicted values
    of confidence >= ``min_confidence`` (``predicted_condition``), cut to ``k`` and padded; a query with no such
    value keeps its ranking."""
    scores, ids = np.asarray(base[0], dtype=np.float64), np.asarray(base[1], dtype=np.int64)
    rows = []
    for q in range(ids.shape[0]):
        live = ids[q] != PAD_ID
        s, i = scores[q][live], ids[q][live]
        condition = predicted_condition(query, q, min_confidence, store)
        if condition and i.size:
            s, i = apply_condition(s, i, condition_mask(store.lookup(i), condition), mode)
        rows.append((s[:k], i[:k]))
    return pad_rows(rows, k)


def filter_precision(kept: Iterable[int], known: Mapping[int, Mapping[str, Iterable[str]]],
                     wanted: Mapping[str, Iterable[str]]) -> float:
    """Precision of an aspect filter: the share of the ``kept`` products whose known (judged / annotated) values
    hold a wanted value for every aspect of ``wanted`` (compared case-insensitively). Products without a known
    value of an asked aspect are left out; NaN when none remains."""
    norm = {a: {str(v).strip().casefold() for v in vs} for a, vs in wanted.items()}
    hits = total = 0
    for doc in kept:
        values = known.get(int(doc), {})
        have = {a: {str(v).strip().casefold() for v in values.get(a, [])} for a in norm}
        if not all(have[a] for a in norm):
            continue
        total += 1
        hits += all(have[a] & norm[a] for a in norm)
    return hits / total if total else float("nan")
