"""Compile the sparse search kernels ahead of first use: `python -m madr.search.sparse.warm`.

The numba kernels (`compiled.py`, `maxscore.py`) are cached on disk (`cache=True`, beside their source or under
`NUMBA_CACHE_DIR`), but the first process that searches compiles them, which takes a while, and every process after
it loads the cache. Installing runs this once (`scripts/bootstrap.sh`; a cluster image's setup can too), so
that a served replica's or a test's first query does not pay the compiler. Every variant a search can take is
compiled: exact and MaxScore, one thread and many.
"""

from __future__ import annotations

import time

import numpy as np

from madr.search.sparse.inverted_index import InvertedIndex
from madr.search.sparse.vectors import SparseBatch


def _random_batch(rows: int, vocab: int, terms: int, rng: np.random.Generator) -> SparseBatch:
    indices = np.concatenate([np.sort(rng.choice(vocab, terms, replace=False)) for _ in range(rows)])
    return SparseBatch(indptr=np.arange(rows + 1, dtype=np.int64) * terms, indices=indices.astype(np.int32),
                       values=rng.random(rows * terms, dtype=np.float32) + 0.1, vocab_size=vocab)


def warm_kernels() -> list[str]:
    """Search a small random index with every engine and thread setting; returns what was run."""
    rng = np.random.default_rng(0)
    index = InvertedIndex.build(_random_batch(64, 50, 5, rng))
    queries = _random_batch(4, 50, 3, rng)
    done = []
    for engine in ("compiled", "maxscore"):
        for threads in (1, 2):
            index.search(queries, k=3, engine=engine, num_threads=threads)
            done.append(f"{engine}/{threads}")
    return done


if __name__ == "__main__":
    start = time.perf_counter()
    ran = warm_kernels()
    print(f"sparse kernels compiled and cached ({', '.join(ran)}) in {time.perf_counter() - start:.1f} s")
