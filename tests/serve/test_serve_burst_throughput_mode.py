"""The proxy's rules for bursts and outages (`test_serve_burst.py`'s HTTP case: refused beyond the queue bound with
503 + Retry-After at once, refused after the queue's time bound, 503 + Retry-After when the replica running a
request dies and while none is alive) hold in Ray Serve's throughput mode too (`serve.direct_ingress`), the mode
docs/serving.md recommends for bursty traffic. The mode is fixed when Serve's processes start, so the case runs in
a child pytest with a Ray of its own."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from serve.direct_ingress import THROUGHPUT_ENV

pytestmark = [pytest.mark.ray, pytest.mark.slow]

HERE = Path(__file__).resolve().parent


def test_the_proxy_rules_hold_in_serve_throughput_mode():
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"} | THROUGHPUT_ENV
    child = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-m", "",
                            str(HERE / "test_serve_burst.py"), "-k", "proxy_sheds"],
                           capture_output=True, text=True, timeout=600, cwd=HERE.parents[1], env=env)
    assert child.returncode == 0 and "1 passed" in child.stdout, child.stdout[-4000:] + child.stderr[-2000:]
