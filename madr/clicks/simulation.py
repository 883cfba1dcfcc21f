"""A click log simulated where the truth is known: an old ranker shows its top k per search, users click by the
position-based model (Richardson et al., WWW'07; Craswell et al., WSDM'08): P(click) = examination(rank) x
attractiveness(grade).

The old ranker's scores get fresh Gaussian noise in every search (`noise` x the query's score spread), so the same
query-document pair is shown at several ranks: the randomised interventions that make the examination curve
identifiable from the log itself (Agarwal et al., WSDM'19; Wang et al., WSDM'18). A share `swap_share` of the
searches also has two of its shown ranks, drawn uniformly, swapped: the randomised swaps real logs get from A/B
tests and ranker updates (drawn from a stream of their own, so a log without swaps is the same as before). The
rows are the plain impressions layout of `madr.clicks.events` (search_id, session_id, query, doc_id, position,
clicked).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

Candidate = tuple[str, float, int]  # (doc id, old ranker's score, graded relevance)


def power_law_examination(ranks: int, eta: float = 1.0) -> np.ndarray:
    """examination(k) = (1 / k) ** eta for k = 1..ranks (Joachims et al., WSDM'17, Sec. 6)."""
    if ranks < 1 or eta < 0:
        raise ValueError(f"ranks must be >= 1 and eta >= 0, got {ranks}, {eta}")
    return (1.0 / np.arange(1, ranks + 1)) ** eta


def graded_attractiveness(max_grade: int, epsilon: float = 0.1) -> np.ndarray:
    """attractiveness(g) = epsilon + (1 - epsilon) (2^g - 1) / (2^max - 1) (Chapelle et al., CIKM'09's ERR
    mapping with click noise epsilon, as in Ai et al., SIGIR'18)."""
    grades = np.arange(max_grade + 1)
    return epsilon + (1 - epsilon) * (2.0 ** grades - 1) / (2.0 ** max_grade - 1)


@dataclass(frozen=True)
class ClickSimulation:
    """How the log is made: `searches` result lists of `top_k`, `noise` on the old ranker's scores, the share of
    searches with two ranks swapped (`swap_share`), the true `examination` per rank (length >= top_k) and
    `attractiveness` per grade, one seed."""

    searches: int
    top_k: int
    examination: np.ndarray
    attractiveness: np.ndarray
    noise: float = 0.5
    seed: int = 0
    swap_share: float = 0.0

    def __post_init__(self) -> None:
        if len(self.examination) < self.top_k:
            raise ValueError(f"examination has {len(self.examination)} ranks, top_k is {self.top_k}")
        if not 0 <= self.swap_share <= 1:
            raise ValueError(f"swap_share must be in [0, 1], got {self.swap_share}")


def swap_two(shown: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """`shown` with two uniformly drawn positions exchanged (a randomised swap intervention)."""
    if len(shown) < 2:
        return shown
    i, j = rng.choice(len(shown), 2, replace=False)
    out = shown.copy()
    out[[i, j]] = shown[[j, i]]
    return out


def simulate_impressions(candidates: Mapping[str, Sequence[Candidate]], sim: ClickSimulation) -> list[dict]:
    """`sim.searches` searches over the queries of `candidates` (query text -> candidates, drawn uniformly): rows
    of the plain impressions layout, one per shown document."""
    rng, swaps = np.random.default_rng(sim.seed), np.random.default_rng([sim.seed, 1])
    queries = sorted(q for q, c in candidates.items() if c)
    if not queries:
        raise ValueError("no query has candidates")
    arrays = {q: (np.array([c[0] for c in candidates[q]]), np.array([c[1] for c in candidates[q]], float),
                  np.array([c[2] for c in candidates[q]], int)) for q in queries}
    rows = []
    for s, qi in enumerate(rng.integers(0, len(queries), sim.searches)):
        query = queries[qi]
        ids, scores, grades = arrays[query]
        spread = float(scores.std()) or 1.0
        noisy = scores + rng.normal(0.0, sim.noise * spread, len(scores))
        shown = np.argsort(-noisy, kind="stable")[: sim.top_k]
        if sim.swap_share > 0 and swaps.random() < sim.swap_share:
            shown = swap_two(shown, swaps)
        ranks = np.arange(1, len(shown) + 1)
        p = sim.examination[ranks - 1] * sim.attractiveness[grades[shown]]
        clicked = rng.random(len(shown)) < p
        rows += [{"search_id": f"s{s}", "session_id": f"u{s}", "query": query, "doc_id": str(ids[d]),
                  "position": int(r), "clicked": bool(c)} for d, r, c in zip(shown, ranks, clicked, strict=True)]
    return rows
