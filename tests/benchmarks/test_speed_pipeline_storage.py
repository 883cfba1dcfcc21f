"""benchmarks.speed.pipeline_storage on its shortest run (the data stage alone): both modes run, the S3 one on
the bucket, and every stage's time comes from its marker. The stages join the session's local Ray (RAY_ADDRESS, as on
a cluster) instead of each starting its own."""

from __future__ import annotations

import pytest

from benchmarks.speed import pipeline_storage

pytestmark = [pytest.mark.ray, pytest.mark.slow]


def test_both_modes_report_wall_and_stage_times(ray_local, monkeypatch):
    monkeypatch.setenv("RAY_ADDRESS", ray_local.get_runtime_context().gcs_address)
    results = pipeline_storage.measure("data")
    assert results["s3"]["output_dir"].startswith("s3://madr-") and results["s3"]["output_dir"].endswith("/demo")
    assert not results["local"]["output_dir"].startswith("s3://")
    for mode in ("local", "s3"):
        assert results[mode]["wall_s"] > 0 and results[mode]["stage_s"]["data"] > 0, results
    assert results["s3_over_local"] == pytest.approx(results["s3"]["wall_s"] / results["local"]["wall_s"], abs=1e-3)
