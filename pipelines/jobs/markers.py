"""Completion markers: `<state_dir>/<stage>.done.json`, written only after a stage exits 0.

A stage is complete when its marker exists, records the stage's current key (`stages.stage_keys`) and
records the run id of its upstream stage's current marker (`runner.status`); a missing marker (never ran, or
crashed before the end), a different key (config changed) or a newer upstream run means run it.
The state dir is a local path or a pyarrow filesystem URI (s3://, gs://), so the check works on any node
of a cluster whose outputs live on shared storage.
"""

from __future__ import annotations

import json
import os
import socket
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

MARKER_SUFFIX = ".done.json"


def is_uri(path: str) -> bool:
    return "://" in path


def default_state_dir(config: dict[str, Any], config_path: str) -> str:
    """`<output_dir>/_stages` when the config has a top-level output_dir, else runs/_stages/<config stem>."""
    out = config.get("output_dir")
    if isinstance(out, str) and out:
        return out.rstrip("/") + "/_stages"
    return str(Path("runs") / "_stages" / Path(config_path).stem)


def marker_path(state_dir: str, stage: str) -> str:
    return state_dir.rstrip("/") + "/" + stage + MARKER_SUFFIX


def read_marker(state_dir: str, stage: str) -> dict[str, Any] | None:
    """The marker's content, or None when there is none (an unreadable marker counts as none)."""
    path = marker_path(state_dir, stage)
    try:
        text = _read_text(path)
    except FileNotFoundError:
        return None
    try:
        data = json.loads(text)
    except json.JSONDecodeError:
        return None
    return data if isinstance(data, dict) else None


def write_marker(state_dir: str, stage: str, key: str, **info: Any) -> str:
    """Write the marker atomically (temp file + rename locally; one object put on object stores)."""
    record = {"stage": stage, "key": key, "finished_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
              "host": socket.gethostname(), **info}
    path = marker_path(state_dir, stage)
    _write_text(path, json.dumps(record, indent=1, sort_keys=True, default=str) + "\n")
    return path


def clear_marker(state_dir: str, stage: str) -> None:
    path = marker_path(state_dir, stage)
    if is_uri(path):
        fs, p = _fs(path)
        try:
            fs.delete_file(p)
        except FileNotFoundError:
            pass
    else:
        Path(path).unlink(missing_ok=True)


@dataclass
class PlanItem:
    stage: str
    key: str
    action: str  # "run" | "skip" | "unknown" (state dir not visible from here: decided where it runs)
    reason: str


def _read_text(path: str) -> str:
    if is_uri(path):
        fs, p = _fs(path)
        with fs.open_input_stream(p) as f:
            return f.read().decode()
    return Path(path).read_text()


def _write_text(path: str, text: str) -> None:
    if is_uri(path):
        fs, p = _fs(path)
        fs.create_dir(p.rsplit("/", 1)[0], recursive=True)
        with fs.open_output_stream(p) as f:
            f.write(text.encode())
        return
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=target.name, suffix=".tmp")
    with os.fdopen(fd, "w") as f:
        f.write(text)
    os.replace(tmp, target)


def _fs(uri: str) -> tuple[Any, str]:
    import pyarrow.fs as pafs

    return pafs.FileSystem.from_uri(uri)
