"""pipelines.runtime: the loopback defaults of ENVIRONMENT.md and Ray's worker priority, set where unset, and the
bootstrap file; a local Ray started after them runs its workers at the driver's priority."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from pipelines.runtime import BOOTSTRAP, LOOPBACK_DEFAULTS, OFFLINE_DEFAULTS, PRIORITY_DEFAULTS, apply_ray_env


def test_defaults_fill_only_unset_keys_and_bootstrap_is_written(monkeypatch, tmp_path: Path) -> None:
    monkeypatch.setenv("HOME", str(tmp_path))
    for key in (*LOOPBACK_DEFAULTS, *OFFLINE_DEFAULTS, *PRIORITY_DEFAULTS):
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setenv("RAY_USAGE_STATS_ENABLED", "1")  # a user's explicit choice stays
    apply_ray_env()
    assert os.environ["RAY_USAGE_STATS_ENABLED"] == "1"
    assert os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] == "0" and os.environ["RAY_worker_niceness"] == "0"
    assert "HF_HUB_OFFLINE" not in os.environ
    assert (tmp_path / "ray_bootstrap_config.yaml").read_text() == BOOTSTRAP
    apply_ray_env(offline=True)
    assert os.environ["HF_HUB_OFFLINE"] == "1" and os.environ["TOKENIZERS_PARALLELISM"] == "false"


@pytest.mark.ray
def test_ray_workers_run_at_the_drivers_priority(ray_local) -> None:
    """Serve's replicas and every task run at the niceness of the process that started Ray (Ray's own default, 15,
    lets any nice-0 process on the machine starve them)."""

    @ray_local.remote
    def niceness() -> int:
        return os.nice(0)

    assert ray_local.get(niceness.remote()) == os.nice(0)
