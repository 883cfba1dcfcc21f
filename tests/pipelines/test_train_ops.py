"""`python -m pipelines.train.ops` (run by scripts/bootstrap.sh): DeepSpeed's CPU op is built into the venv once,
where every training process of that venv (Ray workers included) finds it."""

from __future__ import annotations

import os
from pathlib import Path

import pytest


def test_the_cpu_op_is_built_where_deepspeed_looks(monkeypatch):
    pytest.importorskip("deepspeed")
    from pipelines.train.ops import build_deepspeed_ops

    monkeypatch.delenv("TORCH_EXTENSIONS_DIR", raising=False)
    monkeypatch.setenv("DS_ACCELERATOR", "cpu")
    assert build_deepspeed_ops() == ["deepspeed_shm_comm"]
    built = Path(os.environ["TORCH_EXTENSIONS_DIR"]) / "deepspeed_shm_comm" / "deepspeed_shm_comm.so"
    assert built.is_file(), built


def test_settings_already_made_are_kept(monkeypatch):
    from pipelines.train.ops import deepspeed_env

    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", "/opt/ops")
    monkeypatch.delenv("DS_ACCELERATOR", raising=False)
    deepspeed_env(use_gpu=True)
    assert os.environ["TORCH_EXTENSIONS_DIR"] == "/opt/ops" and "DS_ACCELERATOR" not in os.environ
