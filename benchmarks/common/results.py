"""Writing a benchmark's result JSON."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


def write_json(path: str | Path, result: Any, indent: int = 1) -> Path:
    """`result` as JSON at `path` (folders created; numpy scalars as floats); the path."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(result, indent=indent, default=float))
    return path


def write_result_json(out_dir: str | Path, tag: str, result: dict[str, Any]) -> Path:
    """`result` at `<out_dir>/results/<tag>.json`."""
    return write_json(Path(out_dir) / "results" / f"{tag}.json", result)
