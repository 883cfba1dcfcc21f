"""An experiment's `output_dir` on any pyarrow filesystem (local, s3://, gs://, ...), mirrored locally.

The stages and Serve work on local files (FAISS, safetensors and Parquet writers want paths), so an
`output_dir` that is a URI has a local mirror, `local_dir(uri)`: `$MADR_STAGING_DIR/<scheme>/<bucket>/<path>`
(default `~/.cache/madr/staging`). The stage runner (`pipelines.jobs.runner`) `pull`s the remote tree into the
mirror, runs the stage on a copy of its config whose `output_dir` is the mirror, and `push`es the mirror back
after the stage exits 0; Serve pulls the index and its model before loading them (`pull_index`). A manifest
records its model's absolute path, so every node of a cluster needs the same staging root (the default, or one
`MADR_STAGING_DIR`). A stage killed part-way pushes nothing: its rerun finds the bucket as the last complete
stage left it (and, on the same node, the killed run's local files). Each push writes `_sync/checksums.json` (sha256 and size of every file) *last*, so a
push killed part-way leaves the previous record and the next push uploads again what differs from it; a pull
skips files whose local sha256 already matches the record and verifies every file it downloads.

Credentials and endpoints are those of the filesystem: for S3 the AWS environment variables
(`AWS_ACCESS_KEY_ID`, `AWS_SECRET_ACCESS_KEY`, `AWS_ENDPOINT_URL_S3` for an S3-compatible server).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pyarrow.fs as pafs

from madr.index.manifest import sha256_file

CHECKSUMS = "_sync/checksums.json"
SKIP_DIRS = ("_sync", "_stages")  # the record itself; the stage runner's markers live remotely only
CHUNK = 8 << 20


def is_uri(path: str | os.PathLike[str]) -> bool:
    """Whether `path` names a pyarrow filesystem URI (`s3://...`) rather than a local path."""
    return "://" in str(path) and not str(path).startswith("file://")


def filesystem(uri: str) -> tuple[pafs.FileSystem, str]:
    """(filesystem, path inside it) of `uri` (`pyarrow.fs.FileSystem.from_uri`)."""
    return pafs.FileSystem.from_uri(uri)


def staging_root() -> Path:
    return Path(os.environ.get("MADR_STAGING_DIR") or Path.home() / ".cache" / "madr" / "staging")


def local_dir(path: str | os.PathLike[str]) -> Path:
    """The local directory of `path`: itself when local, its mirror under `staging_root()` when a URI."""
    text = str(path)
    if text.startswith("file://"):
        return Path(text[len("file://"):])
    if not is_uri(text):
        return Path(text)
    scheme, rest = text.split("://", 1)
    return staging_root() / scheme / rest.strip("/")


def local_checksums(local: Path) -> dict[str, dict[str, Any]]:
    """{relative path: {sha256, size}} of every file below `local` (less `SKIP_DIRS` and temp files)."""
    out: dict[str, dict[str, Any]] = {}
    if not local.is_dir():
        return out
    for path in sorted(p for p in local.rglob("*") if p.is_file()):
        rel = path.relative_to(local).as_posix()
        if rel.split("/", 1)[0] in SKIP_DIRS or path.name.endswith(".tmp"):
            continue
        out[rel] = {"sha256": sha256_file(path), "size": path.stat().st_size}
    return out


def remote_checksums(uri: str) -> dict[str, dict[str, Any]]:
    """The record of the last complete push to `uri` ({} when there is none)."""
    fs, root = filesystem(uri)
    try:
        with fs.open_input_stream(f"{root.rstrip('/')}/{CHECKSUMS}") as f:
            return json.loads(f.read().decode())["files"]
    except FileNotFoundError:
        return {}


def push(local: Path, uri: str) -> dict[str, int]:
    """Upload the files below `local` that differ from `uri`'s record, then the new record. Returns counts."""
    fs, root = filesystem(uri)
    root = root.rstrip("/")
    before = remote_checksums(uri)
    now = local_checksums(local)
    changed = [rel for rel, info in now.items() if before.get(rel) != info]
    for rel in changed:
        target = f"{root}/{rel}"
        fs.create_dir(target.rsplit("/", 1)[0], recursive=True)
        pafs.copy_files(str(local / rel), target, destination_filesystem=fs, chunk_size=CHUNK)
    fs.create_dir(f"{root}/_sync", recursive=True)
    with fs.open_output_stream(f"{root}/{CHECKSUMS}") as f:
        f.write(json.dumps({"files": now}, indent=1, sort_keys=True).encode())
    return {"uploaded": len(changed), "unchanged": len(now) - len(changed)}


def pull(uri: str, local: Path | None = None, under: tuple[str, ...] = ()) -> dict[str, int]:
    """Download the files of `uri`'s record (those below the `under` prefixes when given) into `local` (default
    `local_dir(uri)`), skipping those whose local sha256 matches; ValueError when a download's sha256 differs
    from the record. Returns counts."""
    fs, root = filesystem(uri)
    root = root.rstrip("/")
    local = local or local_dir(uri)
    record = remote_checksums(uri)
    wanted = {rel: info for rel, info in record.items()
              if not under or any(rel == u or rel.startswith(u.rstrip("/") + "/") for u in under)}
    fetched = 0
    for rel, info in wanted.items():
        path = local / rel
        if path.is_file() and path.stat().st_size == info["size"] and sha256_file(path) == info["sha256"]:
            continue
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.pull.tmp")
        pafs.copy_files(f"{root}/{rel}", str(tmp), source_filesystem=fs,
                        destination_filesystem=pafs.LocalFileSystem(), chunk_size=CHUNK)
        got = sha256_file(tmp)
        if got != info["sha256"]:
            tmp.unlink()
            raise ValueError(f"{uri}/{rel}: sha256 {got[:16]}... does not match the record "
                             f"{info['sha256'][:16]}... (a partial or foreign upload)")
        os.replace(tmp, path)
        fetched += 1
    return {"downloaded": fetched, "unchanged": len(wanted) - fetched}


def run_root(uri: str) -> str:
    """The nearest prefix of `uri` (itself or a parent) that holds a push record: the run's `output_dir`."""
    candidate = uri.rstrip("/")
    while candidate.count("/") > 2:  # stop at scheme://bucket
        if remote_checksums(candidate):
            return candidate
        candidate = candidate.rsplit("/", 1)[0]
    raise FileNotFoundError(f"{uri}: no {CHECKSUMS} here or above (not a run pushed by the stage runner)")


def pull_index(manifest_uri: str) -> Path:
    """Download an index stored below a run's URI into the run's local mirror, with the model and document
    store its manifest names (when they lie in the same run), and return the local manifest's path."""
    from madr.index.manifest import Manifest

    index_uri = manifest_uri.rstrip("/")
    if index_uri.endswith(".json"):
        index_uri = index_uri.rsplit("/", 1)[0]
    root = run_root(index_uri)
    rel = index_uri[len(root):].strip("/")
    pull(root, under=(rel,) if rel else ())
    local_root = local_dir(root).resolve()
    index_dir = local_root / rel
    manifest = Manifest.load(index_dir)
    extra = []
    for named in (manifest.model_dir, manifest.docs_path):
        if named:
            path = (Path(named) if Path(named).is_absolute() else index_dir / named).resolve()
            if path.is_relative_to(local_root) and path != local_root:
                extra.append(path.relative_to(local_root).as_posix())
    if extra:
        pull(root, under=tuple(extra))
    return index_dir / "manifest.json"
