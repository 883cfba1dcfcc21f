"""Training metrics: a JSON-lines history and TensorBoard event files, written by a Ray Train callback on the
controller (it receives every worker's report, wherever the workers run), and a PNG of the curves.

History rows: `{"time", "step", <rank-0 metrics>, "<field>/rank<r>" for the per-worker fields (data
position, row-id CRC, pid, Ray node id)}`. After a restart the steps since the last checkpoint are run and logged
again; `read_history` keeps the last row per step (`all=True` keeps every row, for checking a resume).
TensorBoard scalars use `tensorboardX` (pulled in by ray[train]): `tensorboard --logdir <stage dir>/logs`.
"""

from __future__ import annotations

import json
import math
import time
from pathlib import Path
from typing import Any

from ray.train import UserCallback

HISTORY_FILE = "history.jsonl"
PER_WORKER = ("epoch", "batch", "rows", "data_crc", "pid", "node", "resumes")
NOT_SCALARS = ("step", "time", "backend", "kind", "data_crc", "pid", "node", "rank", "epoch", "batch", "rows", "resumes",
               "world_size", "zero_stage", "resumed")


def flatten(metrics: list[dict[str, Any]]) -> dict[str, Any]:
    """One history row from the reports of all workers (rank 0's metrics + per-worker fields)."""
    row = {k: v for k, v in metrics[0].items() if k not in PER_WORKER}
    for rank, m in enumerate(metrics):
        for key in PER_WORKER:
            if key in m:
                row[f"{key}/rank{rank}"] = m[key]
    return row


class MetricsLogger(UserCallback):
    """Appends every report to `<log_dir>/history.jsonl` and to TensorBoard events under `<log_dir>`."""

    def __init__(self, log_dir: str) -> None:
        self.log_dir = str(log_dir)
        self._writer: Any = None

    def _tb(self) -> Any:
        if self._writer is None:
            from tensorboardX import SummaryWriter

            self._writer = SummaryWriter(self.log_dir, flush_secs=5)
        return self._writer

    def after_report(self, run_context: Any, metrics: list[dict[str, Any]], checkpoint: Any) -> None:
        if not metrics:
            return
        row = {"time": time.time(), **flatten(metrics), "checkpoint": checkpoint is not None}
        path = Path(self.log_dir)
        path.mkdir(parents=True, exist_ok=True)
        with open(path / HISTORY_FILE, "a") as f:
            f.write(json.dumps(row) + "\n")
        writer, step = self._tb(), int(row.get("step", 0))
        for key, value in metrics[0].items():
            if key in NOT_SCALARS or isinstance(value, bool) or not isinstance(value, int | float):
                continue
            if math.isfinite(float(value)):
                writer.add_scalar(key, float(value), step)
        writer.flush()

    def __getstate__(self) -> dict[str, Any]:
        return {"log_dir": self.log_dir, "_writer": None}


def read_history(log_dir: str | Path, all: bool = False) -> list[dict[str, Any]]:
    """The history rows in order; by default only the last row of each step (the run that counted)."""
    path = Path(log_dir) / HISTORY_FILE
    if not path.is_file():
        return []
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    if all:
        return rows
    last = {int(r["step"]): r for r in rows}
    return [last[s] for s in sorted(last)]


def headline(key: str) -> bool:
    """Validation metrics worth a curve: losses / distances and the ranking / accuracy metrics."""
    return key in ("val_loss", "val_distance") or ("@" in key and "_ap_" not in key) or key.endswith("auc")


def plot_curves(log_dir: str | Path, out: str | Path, title: str = "") -> Path:
    """PNG: training loss (restarts marked) | validation loss / distance | validation ranking metrics."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = read_history(log_dir)
    if not rows:
        raise ValueError(f"{Path(log_dir) / HISTORY_FILE}: no metrics to plot")
    keys = sorted({k for r in rows for k in r if k.startswith("val_") and headline(k)})
    losses = [k for k in keys if k in ("val_loss", "val_distance")]
    scores = [k for k in keys if k not in losses]
    fig, axes = plt.subplots(1, 3, figsize=(15, 4))
    train = [r for r in rows if "loss" in r]
    axes[0].plot([r["step"] for r in train], [r["loss"] for r in train], label="train loss")
    for i, s in enumerate(r["step"] for r in read_history(log_dir, all=True) if r.get("resumed")):
        axes[0].axvline(s, color="red", linestyle=":", label="resumed" if i == 0 else None)
    for ax, group, label in ((axes[1], losses, "validation loss"), (axes[2], scores, "validation metric")):
        for key in group:
            pts = [(r["step"], r[key]) for r in rows if key in r]
            ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=key.removeprefix("val_"))
        ax.set_ylabel(label)
    for ax in axes:
        ax.set_xlabel("optimiser step")
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=7)
    axes[0].set_ylabel("training loss")
    fig.suptitle(title)
    fig.tight_layout()
    out = Path(out)
    fig.savefig(out, dpi=80)
    plt.close(fig)
    return out
