"""An experiment whose `output_dir` is `s3://...` on a real S3 API server (moto on 127.0.0.1): the data stage
runs on the local mirror, its outputs are pushed with their checksums and its completion marker is an object."""

from __future__ import annotations

from pathlib import Path

import pyarrow.parquet as pq
import pytest
import yaml

from madr import storage
from pipelines.jobs import markers
from pipelines.jobs.runner import Invocation, run_stage_here
from pipelines.jobs.stages import STAGES
from tests.cluster.test_pipeline_e2e import tiny_experiment

pytestmark = [pytest.mark.ray]


def test_data_stage_writes_its_outputs_and_marker_to_s3(s3_bucket, tmp_path, capsys):
    uri = s3_bucket + "/run"
    config = tmp_path / "exp.yaml"
    config.write_text(yaml.safe_dump(tiny_experiment(uri)))  # type: ignore[arg-type]
    inv = Invocation(str(config))
    assert inv.state_dir == uri + "/_stages"

    assert run_stage_here(STAGES["data"], inv) == 0
    marker = markers.read_marker(inv.state_dir, "data")
    assert marker is not None and marker["key"] == inv.keys([STAGES["data"]])["data"]
    record = storage.remote_checksums(uri)
    assert {"data/catalog/prepared.json", "data/eval/queries.parquet", "data/vocab.json",
            "tokenizer/vocab.txt"} <= set(record), sorted(record)
    assert not list(Path.cwd().glob("s3:*")), "nothing lands in a local folder named after the URI"

    fresh = tmp_path / "elsewhere"  # another node: the run as stored in the bucket, checksums verified
    assert storage.pull(uri, fresh)["downloaded"] == len(record)
    assert pq.read_table(fresh / "data" / "catalog" / "products.parquet").num_rows == 300

    capsys.readouterr()
    assert run_stage_here(STAGES["data"], inv) == 0
    assert "[madr.jobs] data: skip, complete" in capsys.readouterr().out
