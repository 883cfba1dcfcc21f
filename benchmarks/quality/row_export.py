"""Per-query test metrics of a trained row and its fusions (`homedepot_hybrid --export DIR`), for pairing across
runs and machines (`benchmarks.quality.pipeline_equivalence`)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch

from benchmarks.common.machine import load_average, machine_info


def write_row(export: Path, row: str, seed: int, per_query: dict[str, dict], labels: dict[str, str],
              info: dict[str, Any], device: str) -> Path:
    """<export>/seed<seed>/<row>.json with `per_query` ({key: {metric: {query id: value}}}: the row and its
    fusions), their `labels`, the training `info` and where it ran (`device`, the accelerator's name, the
    machine)."""
    path = export / f"seed{seed}" / f"{row}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    payload = {"row": row, "seed": seed, "per_query": per_query, "labels": labels, "info": info, "device": device,
               "accelerator": torch.cuda.get_device_name() if device.startswith("cuda") else None,
               "machine": machine_info(load_average=load_average())}
    path.write_text(json.dumps(payload))
    return path
