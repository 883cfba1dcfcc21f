"""Wall time of the demo pipeline at the e2e test's tiny size with `output_dir` on local disk and on S3 (a moto
server on loopback): the stages' sync cost.

    python -m benchmarks.speed.pipeline_storage --out /tmp/pipeline_storage.json
"""

from __future__ import annotations

import json
import os
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import yaml

from benchmarks.common.config import parser, write_json
from pipelines.jobs import cli, markers
from tests.cluster.test_pipeline_s3 import STAGES, s3_experiment
from tests.s3_server import CREDENTIALS, create_bucket, moto_server


def run_pipeline(output_dir: str, work: Path, stages: str) -> dict[str, Any]:
    """Run `stages` of the tiny experiment on `output_dir`; wall time and each stage's marker duration."""
    config = work / "experiment.yaml"
    config.write_text(yaml.safe_dump(s3_experiment(output_dir)))
    started = time.time()
    rc = cli.main(["pipeline", "--config", str(config), "--stages", stages])
    wall = time.time() - started
    if rc != 0:
        raise RuntimeError(f"pipeline on {output_dir} failed with exit code {rc}")
    state = output_dir.rstrip("/") + "/_stages"
    durations = {s: (markers.read_marker(state, s) or {}).get("duration_s") for s in stages.split(",")}
    return {"output_dir": output_dir, "wall_s": round(wall, 1), "stage_s": durations}


def measure(stages: str) -> dict[str, Any]:
    """Both modes, local first; the S3 server's environment is set only for the S3 run."""
    results: dict[str, Any] = {"stages": stages}
    with tempfile.TemporaryDirectory(prefix="madr-pipeline-local-") as work:
        results["local"] = run_pipeline(str(Path(work) / "out"), Path(work), stages)
    with moto_server() as endpoint, tempfile.TemporaryDirectory(prefix="madr-pipeline-s3-") as work:
        saved = dict(os.environ)
        bucket = f"madr-{uuid.uuid4().hex[:12]}"
        os.environ.update({**CREDENTIALS, "AWS_ENDPOINT_URL_S3": endpoint, "MADR_STAGING_DIR": str(Path(work) / "staging")})
        try:
            create_bucket(endpoint, bucket)
            results["s3"] = run_pipeline(f"s3://{bucket}/demo", Path(work), stages)
        finally:
            os.environ.clear()
            os.environ.update(saved)
    results["s3_over_local"] = round(results["s3"]["wall_s"] / results["local"]["wall_s"], 3)
    return results


def main(argv: list[str] | None = None) -> int:
    p = parser(__spec__.name, __doc__)
    p.add_argument("--out", default=None, help="write the JSON here too")
    args = p.parse_args(argv)
    results = measure(STAGES)
    print(json.dumps(results, indent=1))
    if args.out:
        write_json(args.out, results)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
