"""Where a benchmark's result JSON goes and how it is written (one place for every quality script)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


def write_result_json(out_dir: str | Path, tag: str, result: dict[str, Any]) -> Path:
    """`result` as indented JSON at `<out_dir>/results/<tag>.json` (numpy scalars as floats); the path."""
    path = Path(out_dir) / "results" / f"{tag}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(result, indent=1, default=float))
    return path
