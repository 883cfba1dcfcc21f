"""The per-query exchange format of trained product-search rows: rows trained on one machine (a lent GPU) are
tested on another against the references there, without carrying their top lists back (28 MB per row and
seed; a device machine returns 64 MiB in all).

`write_row` (called by `benchmarks.quality.homedepot_hybrid --export DIR`) writes <DIR>/seed<s>/<row>.json: the
per-query test metrics of the row alone and of its fusions, their labels, the training info and the machine;
`read_rows` gathers such folders back per key and seed (for `benchmarks.quality.homedepot_claims`, whose code is
retired; last at commit ab8b945).
"""

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


def read_rows(folders: list[Path]) -> tuple[dict, dict, dict, dict]:
    """From every <folder>/seed<s>/<row>.json: ({key: {seed: per-query metrics}}, {key: label}, {row: {seed:
    info}}, {(folder, seed): where it ran}). A key exported twice for one seed is refused (two runs mixed)."""
    per_seed: dict[str, dict[int, dict]] = {}
    labels, info, machines = {}, {}, {}
    for folder in folders:
        for path in sorted(Path(folder).glob("seed*/*.json")):
            data = json.loads(path.read_text())
            seed = int(data["seed"])
            machines[f"{folder}:{seed}"] = {"device": data.get("device"), "accelerator": data.get("accelerator"),
                                            **data.get("machine", {})}
            for key, values in data["per_query"].items():
                if seed in per_seed.get(key, {}):
                    raise SystemExit(f"{path}: {key} seed {seed} is exported twice (in {folders})")
                per_seed.setdefault(key, {})[seed] = values
                labels[key] = data["labels"][key].replace(" (trained, multilingual-e5-small)", "")
            info.setdefault(data["row"], {})[seed] = data["info"].get(data["row"]) or {}
    if not per_seed:
        raise SystemExit(f"{folders}: no seed*/<row>.json (run homedepot_hybrid with --export)")
    return per_seed, labels, info, machines
