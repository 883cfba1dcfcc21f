"""Fixtures of the Ray pipeline tests."""

from __future__ import annotations

import os

import pytest


@pytest.fixture(scope="module")
def fast_train_health_check():
    """Ray Train polls its workers every 2 s by default; 0.2 s saves seconds per fit and notices a killed
    worker fast."""
    old = os.environ.get("RAY_TRAIN_HEALTH_CHECK_INTERVAL_S")
    os.environ["RAY_TRAIN_HEALTH_CHECK_INTERVAL_S"] = "0.2"
    yield
    if old is None:
        os.environ.pop("RAY_TRAIN_HEALTH_CHECK_INTERVAL_S", None)
    else:
        os.environ["RAY_TRAIN_HEALTH_CHECK_INTERVAL_S"] = old
