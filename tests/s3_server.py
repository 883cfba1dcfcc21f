"""A real S3 API server for tests: moto in server mode on 127.0.0.1 at a free port (its own process), reached
through the AWS environment variables, as a cluster's nodes reach their object store."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager

from pipelines.jobs.local_cluster import free_port

CREDENTIALS = {"AWS_ACCESS_KEY_ID": "madr-test", "AWS_SECRET_ACCESS_KEY": "madr-test",
               "AWS_DEFAULT_REGION": "us-east-1", "AWS_REGION": "us-east-1"}


@contextmanager
def moto_server(timeout_s: float = 60.0) -> Iterator[str]:
    """Start `moto_server` on 127.0.0.1; yield its endpoint URL; stop it on exit."""
    port = free_port()
    exe = shutil.which("moto_server", path=os.path.dirname(sys.executable)) or "moto_server"
    proc = subprocess.Popen([exe, "-H", "127.0.0.1", "-p", str(port)], stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    endpoint = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                urllib.request.urlopen(endpoint + "/moto-api/", timeout=2).close()
                break
            except OSError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"moto_server did not start on {endpoint}") from None
                time.sleep(0.2)
        yield endpoint
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def create_bucket(endpoint: str, name: str) -> None:
    """Create bucket `name` on the server (through pyarrow, as the pipeline reaches it)."""
    import pyarrow.fs as pafs

    fs = pafs.S3FileSystem(endpoint_override=endpoint, scheme="http", access_key=CREDENTIALS["AWS_ACCESS_KEY_ID"],
                           secret_key=CREDENTIALS["AWS_SECRET_ACCESS_KEY"], region=CREDENTIALS["AWS_REGION"], allow_bucket_creation=True)
    fs.create_dir(name)
