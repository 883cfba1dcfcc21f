"""The manifest of a sharded index: what every shard holds and how to check it (format ``madr.index/1``).

An index directory holds, per shard ``s`` (``shard-{s:05d}`` below):

- ``shard-{s:05d}.faiss``: the dense FAISS index, inner product, with *global* int64 ids
  (``add_with_ids``; Flat / HNSW wrapped in ``IndexIDMap2``, IVF indexes carry the ids themselves);
- ``shard-{s:05d}.ids.npy``: the shard's global ids in row order (ascending);
- ``shard-{s:05d}.sparse.npz``: hybrid models only, the sparse ``InvertedIndex`` of the same documents;
- ``shard-{s:05d}.lexical.npz``: indexes with a lexical part only, the raw word-piece term frequencies of the
  same documents (``madr.index.lexical``; BM25 weights are computed from them when the shard is opened);
- ``shard-{s:05d}.aspects.npz``: indexes of aspect models only, the products' calibrated top-k aspect values
  (``madr.index.aspects``);
- ``shard-{s:05d}.json``: the shard's ``ShardInfo``, written last: a shard is complete when this record
  exists and the checksums of its files match (the encode job's resume test);

and ``manifest.json`` (this module's ``Manifest``), written once all shards are complete (with a lexical
part: also ``lexical.df.npy``, the collection's document frequencies, named with its checksum in the
manifest's ``lexical`` record, ``madr.index.lexical.LexicalInfo``). Paths inside
records are relative to the directory that holds them, so an index directory can be moved or copied.
Every file is written to a temporary name and renamed (POSIX rename is atomic), so a crash never leaves a
half-written file under a final name.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import numpy as np

from madr.config_files import read_mapping

FORMAT = "madr.index/1"
MANIFEST_FILE = "manifest.json"
_CHUNK = 1 << 22


def shard_stem(shard: int) -> str:
    """File name stem of shard ``shard``: ``shard-00003``."""
    return f"shard-{shard:05d}"


def sha256_file(path: str | Path) -> str:
    """Hex sha256 of a file, read in 4 MiB chunks."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(_CHUNK):
            h.update(chunk)
    return h.hexdigest()


def atomic_write(path: str | Path, write: Callable[[str], Any]) -> Path:
    """Call ``write(tmp_path)`` for a temporary file beside ``path``, fsync it, then rename it to ``path``."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(fd)
    try:
        write(tmp)
        with open(tmp, "rb+") as f:
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    return path


def atomic_write_text(path: str | Path, text: str) -> Path:
    return atomic_write(path, lambda tmp: Path(tmp).write_text(text))


def atomic_save_npy(path: str | Path, array: np.ndarray) -> Path:
    def write(tmp: str) -> None:
        with open(tmp, "wb") as f:
            np.save(f, array, allow_pickle=False)

    return atomic_write(path, write)


@dataclass
class ShardInfo:
    """One shard: its files (relative paths), its global ids and their checksums."""

    shard: int
    dense_path: str
    sparse_path: str | None
    ids_path: str
    count: int
    min_id: int
    max_id: int
    sha256: dict[str, str] = field(default_factory=dict)
    lexical_path: str | None = None
    approx_sparse_path: str | None = None  # the approximate sparse backend's index (manifest.sparse_backend)
    aspects_path: str | None = None  # the products' top-k aspect values (madr.index.aspects)

    def files(self) -> list[str]:
        return [p for p in (self.dense_path, self.sparse_path, self.ids_path, self.lexical_path,
                            self.approx_sparse_path, self.aspects_path) if p is not None]

    def verify(self, base: str | Path) -> None:
        """Raise a ValueError naming the file whose sha256 differs from the record (or that is missing);
        every file of the shard and every other file the record lists are checked."""
        base = Path(base)
        for rel in dict.fromkeys([*self.files(), *self.sha256]):
            path = base / rel
            if not path.is_file():
                raise ValueError(f"shard {self.shard}: file {path} is missing")
            want = self.sha256.get(rel)
            if want is None:
                raise ValueError(f"shard {self.shard}: no checksum recorded for {rel}")
            got = sha256_file(path)
            if got != want:
                raise ValueError(f"shard {self.shard}: checksum mismatch for {path}: sha256 {got[:16]}..., "
                                 f"manifest says {want[:16]}... (corrupted or replaced file)")

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any], where: str = "shard") -> ShardInfo:
        return _from_dict(cls, data, where)

    def save(self, path: str | Path) -> Path:
        return atomic_write_text(path, json.dumps(self.to_dict(), indent=1))

    @classmethod
    def load(cls, path: str | Path) -> ShardInfo:
        return cls.from_dict(_read_json(path), str(path))


@dataclass
class Manifest:
    """A sharded index (see the module docstring). ``hybrid_lambda``: the lam of paper 002 Eq. 1 the index
    was built with (the model's ``hybrid_lambda`` unless the encode job set another), the lam of a hybrid
    search whose ``madr.search.params.SearchParams.lam`` is None; None = a dense-only index. ``lexical``:
    the BM25 part's record (``madr.index.lexical.LexicalInfo.to_dict``), None without one. ``aspects``: the
    products' aspect distributions' record (``madr.index.aspects.AspectInfo.to_dict``), None without them."""

    dim: int
    index_factory: str
    num_docs: int
    shards: list[ShardInfo]
    metric: str = "ip"
    model_dir: str | None = None
    config_hash: str | None = None
    hybrid_lambda: float | None = None
    sparse_vocab_size: int | None = None
    docs_path: str | None = None
    lexical: dict[str, Any] | None = None
    sparse_backend: dict[str, Any] | None = None  # madr.search.sparse.backend.SparseBackend.to_dict; None: exact
    aspects: dict[str, Any] | None = None  # madr.index.aspects.AspectInfo.to_dict; None: no aspect data
    created_at: str = field(default_factory=lambda: datetime.now(timezone.utc).isoformat(timespec="seconds"))
    format: str = FORMAT

    def __post_init__(self) -> None:
        if self.format != FORMAT:
            raise ValueError(f"manifest: format is {self.format!r}, expected {FORMAT!r}")
        if self.metric != "ip":
            raise ValueError(f"manifest: metric {self.metric!r} is not supported (only 'ip')")
        if self.hybrid_lambda is not None and not 0.0 <= self.hybrid_lambda <= 1.0:
            raise ValueError(f"manifest: hybrid_lambda must be in [0, 1] or null, got {self.hybrid_lambda}")
        numbers = [s.shard for s in self.shards]
        if numbers != list(range(len(numbers))):
            raise ValueError(f"manifest: shards must be numbered 0..{len(numbers) - 1} in order, got {numbers}")
        total = sum(s.count for s in self.shards)
        if total != self.num_docs:
            raise ValueError(f"manifest: num_docs is {self.num_docs} but the shards hold {total}")
        if self.lexical is not None:
            from madr.index.lexical import LexicalInfo

            info = LexicalInfo.from_dict(self.lexical)
            if info.num_docs != self.num_docs:
                raise ValueError(f"manifest: lexical.num_docs is {info.num_docs} but the index holds {self.num_docs}")
        if self.aspects is not None:
            from madr.index.aspects import AspectInfo

            AspectInfo.from_dict(self.aspects)
            missing = [s.shard for s in self.shards if not s.aspects_path]
            if missing:
                raise ValueError(f"manifest: an aspects record but shards {missing} have no aspect file")

    @property
    def has_sparse(self) -> bool:
        return bool(self.shards) and all(s.sparse_path is not None for s in self.shards)

    @property
    def has_lexical(self) -> bool:
        return self.lexical is not None and bool(self.shards) and all(s.lexical_path for s in self.shards)

    @property
    def has_aspects(self) -> bool:
        """The index stores its products' calibrated aspect distributions (``madr.index.aspects``)."""
        return self.aspects is not None

    @property
    def aspect_weight(self) -> float:
        """The aspect-match weight a search that sets none uses (0 without aspect data)."""
        return float(self.aspects["aspect_weight"]) if self.aspects is not None else 0.0

    @property
    def fusion(self) -> tuple[float | None, str | None]:
        """(fusion_lambda, normalisation) of the dense + BM25 fusion this index serves when a search sets
        neither (written by the encode job, then by the tune stage); (None, None) without a BM25 part."""
        if not self.has_lexical:
            return None, None
        assert self.lexical is not None
        return float(self.lexical["fusion_lambda"]), str(self.lexical.get("normalisation", "minmax"))

    @property
    def search_mode(self) -> str:
        """What a search of this index fuses: ``dense``, ``hybrid`` (SPLADE, paper 002 Eq. 1) or ``dense+bm25``."""
        return "dense+bm25" if self.has_lexical else "hybrid" if self.has_sparse else "dense"

    def to_dict(self) -> dict[str, Any]:
        out = dataclasses.asdict(self)
        out["shards"] = [s.to_dict() for s in self.shards]
        return {"format": out.pop("format"), **out}

    def save(self, path: str | Path) -> Path:
        """Write JSON atomically (temp file + rename)."""
        return atomic_write_text(path, json.dumps(self.to_dict(), indent=1))

    @classmethod
    def load(cls, path: str | Path) -> Manifest:
        """Read a manifest; a directory means its ``manifest.json``. Errors name the file and field."""
        path = Path(path)
        if path.is_dir():
            path = path / MANIFEST_FILE
        data = _read_json(path)
        if "lam" in data and "hybrid_lambda" not in data:  # indexes written before the field was renamed
            data["hybrid_lambda"] = data.pop("lam")
        shards = data.get("shards")
        if not isinstance(shards, list):
            raise ValueError(f"{path}: field 'shards' must be a list")
        data = dict(data, shards=[ShardInfo.from_dict(s, f"{path}: shards[{i}]") for i, s in enumerate(shards)])
        try:
            return _from_dict(cls, data, str(path))
        except ValueError as e:
            if str(e).startswith(str(path)):
                raise
            raise ValueError(f"{path}: {e}") from None

    def verify(self, base: str | Path) -> None:
        """Checksums of every shard file (ValueError naming the first bad file)."""
        for s in self.shards:
            s.verify(base)
        if self.lexical is not None:
            from madr.index.lexical import LexicalInfo

            LexicalInfo.from_dict(self.lexical).verify(base)
        if self.aspects is not None:
            from madr.index.aspects import AspectInfo

            AspectInfo.from_dict(self.aspects).values(base)


def record_fusion(path: str | Path, lam: float, normalisation: str) -> Manifest:
    """Set the dense + BM25 fusion an index serves by default (its `lexical` record's `fusion_lambda` and
    `normalisation`; the tune stage's choice) and rewrite the manifest atomically. The shards are unchanged."""
    manifest = Manifest.load(path)
    if manifest.lexical is None:
        raise ValueError(f"{path}: the index has no BM25 part: no fusion to record")
    manifest.lexical = {**manifest.lexical, "fusion_lambda": float(lam), "normalisation": normalisation}
    manifest.__post_init__()  # the record is checked as when it is loaded
    manifest.save(Path(path) / MANIFEST_FILE if Path(path).is_dir() else path)
    return manifest


def record_aspect_weight(path: str | Path, weight: float) -> Manifest:
    """Set the aspect-match weight an index serves by default (its ``aspects`` record's ``aspect_weight``; the
    tune stage's choice) and rewrite the manifest atomically. The shards are unchanged."""
    manifest = Manifest.load(path)
    if manifest.aspects is None:
        raise ValueError(f"{path}: the index has no aspect data: no aspect weight to record")
    manifest.aspects = {**manifest.aspects, "aspect_weight": float(weight)}
    manifest.__post_init__()
    manifest.save(Path(path) / MANIFEST_FILE if Path(path).is_dir() else path)
    return manifest


def _read_json(path: str | Path) -> dict[str, Any]:
    """The JSON object at `path` (`madr.config.read_mapping`); a missing file is a ValueError, as is every
    other unusable index input."""
    try:
        return read_mapping(path, "json")
    except FileNotFoundError as err:
        raise ValueError(str(err)) from None


def _from_dict(cls: type, data: dict[str, Any], where: str) -> Any:
    names = {f.name for f in dataclasses.fields(cls)}
    required = {f.name for f in dataclasses.fields(cls)
                if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING}
    unknown, missing = sorted(set(data) - names), sorted(required - set(data))
    if unknown or missing:
        raise ValueError(f"{where}: unknown field(s) {unknown}, missing field(s) {missing}")
    return cls(**data)
