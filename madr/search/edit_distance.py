"""Minimum edit (Levenshtein) distance and a ranker on it: the "Minimum Edit Distance" baseline of paper 004
Sec. VI-D / Table III (ref. [35], Levenshtein 1966).

The distance is the least number of single-unit insertions, deletions and substitutions turning one
sequence into the other, over characters (Unicode code points, so CJK characters count one each) or over
tokens (words, or WordPiece pieces as paper 004's token-based BM25). It is computed with the classic
dynamic programme, one numpy row at a time: for row i (unit a[i-1]) and t[j] = min(D[i-1, j-1] + sub,
D[i-1, j] + 1),

    D[i, j] = min_{k <= j} (t[k] + j - k) = j + cummin_k(t[k] - k)

which folds the insertion chain D[i, j-1] + 1 into a cumulative minimum, so each row is a few vectorised
operations and no per-character Python objects exist beyond the row. Code points are not normalised
(compose with `unicodedata.normalize` first if the texts mix NFC and NFD).

`edit_distance_scores` runs the same recurrence for one query against all candidates at once: the
candidates are padded into an `[N, L]` matrix and the row over the query's units is updated for all of them
together (column j of the DP depends only on columns <= j, so padding never changes a candidate's cell
`D[m, len(candidate)]`). Cost: len(query) vectorised steps of size N x L instead of N Python-level DPs.

The ranker scores a candidate by `similarity = 1 - d / max(len(query), len(candidate))` (1.0 for two empty
sequences), or by `-d` with `score="distance"`; ties keep the candidates' order.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Sequence

import numpy as np

Tokenize = Callable[[str], Sequence[Hashable]]
LEVELS = ("char", "token")
SCORES = ("similarity", "distance")


def _codes(text: str) -> np.ndarray:
    """The Unicode code points of `text` as a uint32 array (one entry per character, CJK included)."""
    return np.frombuffer(text.encode("utf-32-le"), dtype="<u4")


def _ids(a: Sequence[Hashable], b: Sequence[Hashable]) -> tuple[np.ndarray, np.ndarray]:
    """Both token sequences as int arrays over one shared token -> id map."""
    vocab: dict[Hashable, int] = {}
    ia = np.array([vocab.setdefault(t, len(vocab)) for t in a], dtype=np.int64)
    ib = np.array([vocab.setdefault(t, len(vocab)) for t in b], dtype=np.int64)
    return ia, ib


def _distance(a: np.ndarray, b: np.ndarray) -> int:
    """Levenshtein distance of two 1-D integer arrays (the row-wise DP of the module docstring)."""
    n = min(len(a), len(b))
    prefix = int(np.argmax(a[:n] != b[:n])) if n and (a[:n] != b[:n]).any() else n
    a, b = a[prefix:], b[prefix:]
    n = min(len(a), len(b))
    ra, rb = a[::-1][:n], b[::-1][:n]
    suffix = int(np.argmax(ra != rb)) if n and (ra != rb).any() else n
    a, b = a[: len(a) - suffix], b[: len(b) - suffix]
    if len(a) < len(b):
        a, b = b, a  # the row runs over the shorter one
    if len(b) == 0:
        return len(a)
    cols = np.arange(len(b) + 1, dtype=np.int64)
    row = cols.copy()
    t = np.empty_like(row)
    for i in range(1, len(a) + 1):
        t[0] = i
        np.minimum(row[:-1] + (b != a[i - 1]), row[1:] + 1, out=t[1:])
        row = np.minimum.accumulate(t - cols) + cols
    return int(row[-1])


def _distances(query: np.ndarray, candidates: Sequence[np.ndarray]) -> np.ndarray:
    """Levenshtein distance of `query` to every candidate (1-D int arrays): the batched DP of the docstring."""
    lengths = np.array([len(c) for c in candidates], dtype=np.int64)
    width = int(lengths.max(initial=0))
    padded = np.full((len(candidates), width), -1, dtype=np.int64)  # -1 never equals a unit id / code point
    for i, c in enumerate(candidates):
        padded[i, :len(c)] = c
    cols = np.arange(width + 1, dtype=np.int64)
    row = np.broadcast_to(cols, (len(candidates), width + 1)).copy()
    t = np.empty_like(row)
    for i, unit in enumerate(query.tolist(), 1):
        t[:, 0] = i
        np.minimum(row[:, :-1] + (padded != unit), row[:, 1:] + 1, out=t[:, 1:])
        row = np.minimum.accumulate(t - cols, axis=1) + cols
    return row[np.arange(len(candidates)), lengths]


def char_levenshtein(a: str, b: str) -> int:
    """Character-level Levenshtein distance of two strings (Unicode code points)."""
    if not isinstance(a, str) or not isinstance(b, str):
        raise ValueError(f"char_levenshtein: both arguments must be str, got {type(a).__name__}, "
                         f"{type(b).__name__}")
    return _distance(_codes(a), _codes(b))


def _as_tokens(x: str | Sequence[Hashable], tokenize: Tokenize | None, what: str) -> Sequence[Hashable]:
    if isinstance(x, str):
        return (tokenize or str.split)(x)
    if isinstance(x, bytes) or not isinstance(x, Sequence | np.ndarray):
        raise ValueError(f"{what} must be a str or a sequence of tokens, got {type(x).__name__}")
    return x


def token_levenshtein(a: str | Sequence[Hashable], b: str | Sequence[Hashable],
                      tokenize: Tokenize | None = None) -> int:
    """Token-level Levenshtein distance; str arguments are split by `tokenize` (default: whitespace)."""
    ta, tb = _as_tokens(a, tokenize, "token_levenshtein: a"), _as_tokens(b, tokenize, "token_levenshtein: b")
    return _distance(*_ids(ta, tb))


def _check_level(level: str) -> None:
    if level not in LEVELS:
        raise ValueError(f"level must be one of {LEVELS}, got {level!r}")


def _units(x: str | Sequence[Hashable], level: str, tokenize: Tokenize | None, what: str) -> Sequence:
    if level == "char":
        if not isinstance(x, str):
            raise ValueError(f"{what} must be a str for level='char', got {type(x).__name__}")
        return x
    return _as_tokens(x, tokenize, what)


def levenshtein(a: str | Sequence[Hashable], b: str | Sequence[Hashable], level: str = "char",
                tokenize: Tokenize | None = None) -> int:
    """Levenshtein distance at `level` "char" (code points) or "token" (see `token_levenshtein`)."""
    _check_level(level)
    return char_levenshtein(a, b) if level == "char" else token_levenshtein(a, b, tokenize)  # type: ignore[arg-type]


def similarity(a: str | Sequence[Hashable], b: str | Sequence[Hashable], level: str = "char",
               tokenize: Tokenize | None = None) -> float:
    """1 - d(a, b) / max(len(a), len(b)) in [0, 1], lengths in units of `level`; 1.0 when both are empty."""
    _check_level(level)
    ua, ub = _units(a, level, tokenize, "similarity: a"), _units(b, level, tokenize, "similarity: b")
    longest = max(len(ua), len(ub))
    if longest == 0:
        return 1.0
    d = _distance(_codes(ua), _codes(ub)) if level == "char" else _distance(*_ids(ua, ub))
    return 1.0 - d / longest


def edit_distance_scores(query: str | Sequence[Hashable], candidates: Sequence[str | Sequence[Hashable]],
                         level: str = "char", tokenize: Tokenize | None = None, lowercase: bool = True,
                         score: str = "similarity") -> np.ndarray:
    """One score per candidate (higher = closer): `similarity`, or minus the distance for "distance".

    `lowercase` lowercases str inputs first (as the uncased tokenizers do).
    """
    _check_level(level)
    if score not in SCORES:
        raise ValueError(f"score must be one of {SCORES}, got {score!r}")
    if isinstance(candidates, str):
        raise ValueError("candidates must be a sequence of texts, got a single str")

    def prep(x: str | Sequence[Hashable], what: str) -> Sequence:
        x = x.lower() if lowercase and isinstance(x, str) else x
        return _units(x, level, tokenize, what)

    q = prep(query, "query")
    cands = [prep(cand, f"candidate {i}") for i, cand in enumerate(candidates)]
    if not cands:
        return np.empty(0, dtype=np.float64)
    if level == "char":
        units_q, units = _codes(q).astype(np.int64), [_codes(c).astype(np.int64) for c in cands]
    else:
        vocab: dict[Hashable, int] = {}
        units_q = np.array([vocab.setdefault(t, len(vocab)) for t in q], dtype=np.int64)
        units = [np.array([vocab.setdefault(t, len(vocab)) for t in c], dtype=np.int64) for c in cands]
    d = _distances(units_q, units).astype(np.float64)
    if score == "distance":
        return -d
    longest = np.maximum(len(q), np.array([len(c) for c in cands], dtype=np.float64))
    return np.where(longest == 0, 1.0, 1.0 - d / np.maximum(longest, 1.0))


def rank_by_edit_distance(query: str | Sequence[Hashable], candidates: Sequence[str | Sequence[Hashable]],
                          k: int | None = None, level: str = "char", tokenize: Tokenize | None = None,
                          lowercase: bool = True, score: str = "similarity") -> tuple[np.ndarray, np.ndarray]:
    """(scores, indices) of the top `k` candidates (all when None), best first, ties in candidate order.

    The paper 004 Table III "Minimum Edit Distance" ranker; see `edit_distance_scores` for the arguments.
    """
    if k is not None and k < 0:
        raise ValueError(f"k must be >= 0 or None, got {k}")
    scores = edit_distance_scores(query, candidates, level, tokenize, lowercase, score)
    order = np.argsort(-scores, kind="stable")[: len(scores) if k is None else k]
    return scores[order], order
