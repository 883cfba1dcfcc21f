"""pipelines.runtime: the loopback defaults of ENVIRONMENT.md, set where unset, and the bootstrap file."""

from __future__ import annotations

import os
from pathlib import Path

from pipelines.runtime import BOOTSTRAP, LOOPBACK_DEFAULTS, OFFLINE_DEFAULTS, apply_ray_env


def test_defaults_fill_only_unset_keys_and_bootstrap_is_written(monkeypatch, tmp_path: Path) -> None:
    monkeypatch.setenv("HOME", str(tmp_path))
    for key in (*LOOPBACK_DEFAULTS, *OFFLINE_DEFAULTS):
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setenv("RAY_USAGE_STATS_ENABLED", "1")  # a user's explicit choice stays
    apply_ray_env()
    assert os.environ["RAY_USAGE_STATS_ENABLED"] == "1"
    assert os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] == "0"
    assert "HF_HUB_OFFLINE" not in os.environ
    assert (tmp_path / "ray_bootstrap_config.yaml").read_text() == BOOTSTRAP
    apply_ray_env(offline=True)
    assert os.environ["HF_HUB_OFFLINE"] == "1" and os.environ["TOKENIZERS_PARALLELISM"] == "false"
