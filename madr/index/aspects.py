"""The products' calibrated aspect distributions, stored in an index beside the shards (numpy only).

An aspect model (paper 000 MADRAL, Sec. 5: ``P(x) = softmax(E_a U_a^T + b_a)`` over the values of aspect ``a``;
paper 001 MURAL, Sec. 4.2, at phrase granularity) predicts for every product a distribution over each aspect's
value vocabulary, and with Presence Weighting (paper 000 Sec. 6.2, Eq. 5) the probability ``P_a`` that the
aspect is present at all. The encode job keeps, per product and aspect, the ``k`` most probable values of the
*calibrated* distribution (``softmax(logits / T)``, ``madr.modeling.calibration``) with their probabilities, and
the presence (1 for models without a presence head):

- ``shard-NNNNN.aspects.npz``: for every aspect ``a``, ``{a}.values`` [n, k] int32 value ids (-1 where the
  vocabulary has fewer than ``k`` values), ``{a}.probs`` [n, k] float32 (0 there) and ``{a}.presence`` [n]
  float32; rows in the shard's id order (``ShardInfo.aspects_path``);
- ``aspect_values.json``: ``{aspect: [value strings]}``, the model's phrase vocabularies, so a value id means the
  same string to every reader (search filters by strings the caller sends);
- the manifest's ``aspects`` record (``AspectInfo``): ``k``, the aspect names, that file with its checksum and
  ``aspect_weight``, the weight of the aspect-match score in a search that sets none (the tune stage's choice).
"""

from __future__ import annotations

import dataclasses
import io
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from madr.index.manifest import atomic_write, atomic_write_text, sha256_file

ASPECT_VALUES_FILE = "aspect_values.json"
ASPECTS_SUFFIX = ".aspects.npz"


@dataclass
class AspectTopK:
    """Top-``k`` calibrated values of one aspect for ``n`` texts: ``values`` [n, k] int32 (-1 padding),
    ``probs`` [n, k] float32 (0 padding), ``presence`` [n] float32 (paper 000 Eq. 5's ``P_a``; 1 without it)."""

    values: np.ndarray
    probs: np.ndarray
    presence: np.ndarray

    def __post_init__(self) -> None:
        self.values = np.asarray(self.values, dtype=np.int32)
        self.probs = np.asarray(self.probs, dtype=np.float32)
        self.presence = np.asarray(self.presence, dtype=np.float32).reshape(-1)
        if self.values.ndim != 2 or self.values.shape != self.probs.shape or self.presence.size != len(self.values):
            raise ValueError(f"aspect top-k: values {self.values.shape}, probs {self.probs.shape} and presence "
                             f"{self.presence.shape} must be [n, k], [n, k] and [n]")

    def __len__(self) -> int:
        return int(self.values.shape[0])

    def select(self, rows: np.ndarray) -> AspectTopK:
        return AspectTopK(self.values[rows], self.probs[rows], self.presence[rows])


AspectTable = dict[str, AspectTopK]  # aspect name -> its top-k over the same n texts


def select_rows(table: AspectTable, rows: np.ndarray) -> AspectTable:
    """The rows ``rows`` of every aspect of ``table``."""
    return {a: t.select(rows) for a, t in table.items()}


def concat_tables(tables: list[AspectTable]) -> AspectTable:
    """Row-wise concatenation of tables over the same aspects."""
    names = list(tables[0])
    return {a: AspectTopK(np.concatenate([t[a].values for t in tables]), np.concatenate([t[a].probs for t in tables]),
                          np.concatenate([t[a].presence for t in tables])) for a in names}


def save_shard_aspects(path: str | Path, table: AspectTable) -> Path:
    """Write one shard's aspect table (rows already in the shard's id order) atomically."""
    arrays = {}
    for a, t in table.items():
        arrays.update({f"{a}.values": t.values, f"{a}.probs": t.probs, f"{a}.presence": t.presence})

    def write(tmp: str) -> None:
        buf = io.BytesIO()
        np.savez(buf, **arrays)
        Path(tmp).write_bytes(buf.getvalue())

    return atomic_write(path, write)


def load_shard_aspects(path: str | Path, aspects: list[str]) -> AspectTable:
    """One shard's aspect table; a ValueError names the file when an aspect is missing."""
    with np.load(path, allow_pickle=False) as data:
        missing = [a for a in aspects if f"{a}.values" not in data]
        if missing:
            raise ValueError(f"{path}: no top-k values for aspect(s) {missing}")
        return {a: AspectTopK(data[f"{a}.values"], data[f"{a}.probs"], data[f"{a}.presence"]) for a in aspects}


@dataclass
class AspectInfo:
    """The manifest's ``aspects`` record (module docstring)."""

    k: int
    aspects: list[str]
    values_path: str = ASPECT_VALUES_FILE
    sha256: str = ""
    aspect_weight: float = 0.0
    calibrated: bool = False

    def __post_init__(self) -> None:
        if isinstance(self.k, bool) or not isinstance(self.k, int) or self.k < 1:
            raise ValueError(f"aspects.k must be an integer >= 1, got {self.k!r}")
        if not self.aspects or not all(isinstance(a, str) and a for a in self.aspects):
            raise ValueError(f"aspects.aspects must be a non-empty list of names, got {self.aspects!r}")
        if isinstance(self.aspect_weight, bool) or not 0.0 <= float(self.aspect_weight) <= 1.0:
            raise ValueError(f"aspects.aspect_weight must be in [0, 1], got {self.aspect_weight!r}")
        self.aspect_weight = float(self.aspect_weight)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> AspectInfo:
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(data) - names)
        if unknown:
            raise ValueError(f"manifest aspects: unknown field(s) {unknown}")
        return cls(**data)

    def values(self, base: str | Path) -> dict[str, list[str]]:
        """``{aspect: [value strings]}`` from the index directory ``base`` (checksum checked)."""
        path = Path(base) / self.values_path
        if self.sha256 and sha256_file(path) != self.sha256:
            raise ValueError(f"{path}: checksum mismatch with the manifest's aspects record")
        return json.loads(path.read_text())


def write_aspect_values(out_dir: str | Path, values: dict[str, list[str]]) -> str:
    """Write ``aspect_values.json``; returns its sha256."""
    path = atomic_write_text(Path(out_dir) / ASPECT_VALUES_FILE, json.dumps(values))
    return sha256_file(path)
