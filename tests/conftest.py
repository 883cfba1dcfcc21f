"""Session fixtures: a small seeded catalog, a WordPiece tokenizer trained on it in-process, its aspect
vocabularies, (for Ray tests) one local Ray instance with the loopback-only network settings, and a tiny config
for the Home Depot benchmark's smoke tests."""

from __future__ import annotations

from pathlib import Path

import pytest

from pipelines.runtime import apply_ray_env

# Ray network hygiene: must be set before any ray.init in this process (see scripts/ray_env.sh).
apply_ray_env(offline=True)

ROOT = Path(__file__).resolve().parents[1]
SHARED = ROOT.parent / "shared"


def pytest_configure(config):
    config.addinivalue_line("markers", "e2e: the demo's flow through `ray job submit` and the README's cluster command "
                                       "on 2 nodes of a fresh install (minutes); `make test` leaves them out, .ci/run "
                                       "runs them as their own required step: make test-e2e")


@pytest.fixture(scope="session")
def catalog():
    from madr.data.synthetic.catalog import generate_catalog

    return generate_catalog(num_products=400, num_queries=200, seed=0)


@pytest.fixture(scope="session")
def tokenizer(catalog, tmp_path_factory):
    from madr.modeling.tokenization import train_wordpiece_tokenizer

    texts = [catalog.product_text(p) for p in catalog.products] + [q.text for q in catalog.queries]
    return train_wordpiece_tokenizer(texts, vocab_size=1200, out_dir=str(tmp_path_factory.mktemp("tok")))


@pytest.fixture(scope="session")
def vocabularies(catalog, tokenizer):
    from madr.modeling.aspect_vocabulary import build_vocabularies

    annotations = [p.aspects for p in catalog.products] + [q.aspects for q in catalog.queries]
    return build_vocabularies(annotations, catalog.aspect_names, ["phrase", "word", "token"],
                              tokenize=tokenizer.tokenize)


@pytest.fixture(scope="session")
def shared_data() -> Path:
    """Real public data beside the repository; tests using it skip only when ../shared is absent."""
    if not (SHARED / "data").is_dir():
        pytest.skip("../shared/data is not present")
    return SHARED / "data"


# address="local": a Ray of its own, never one that a `ray start` left on the machine (a bare ray.init() joins
# that, and then refuses num_cpus)
LOCAL_RAY = {"address": "local", "num_cpus": 2, "include_dashboard": False, "log_to_driver": False,
             "configure_logging": False}


@pytest.fixture(scope="session")
def ray_local_args() -> dict:
    """How `ray_local` starts Ray: what a module that needs another Ray for a while (tests/multinode) restarts
    it with afterwards."""
    return dict(LOCAL_RAY)


@pytest.fixture(scope="session")
def ray_local(ray_local_args):
    from pipelines.runtime import apply_ray_env

    apply_ray_env()  # as every pipeline process starts Ray: loopback defaults, workers at the driver's priority
    import ray

    ray.init(**ray_local_args)
    yield ray
    ray.shutdown()


@pytest.fixture(scope="session")
def s3_endpoint():
    """The endpoint URL of a moto S3 server on 127.0.0.1 (tests/s3_server.py), one per session."""
    from tests.s3_server import moto_server

    with moto_server() as endpoint:
        yield endpoint


@pytest.fixture()
def s3_bucket(s3_endpoint, tmp_path, monkeypatch) -> str:
    """`s3://<fresh bucket>` on the session's server, reached through the AWS environment variables (inherited by
    the stages' child processes), with this test's own local staging root (`madr.storage`)."""
    import uuid

    from tests.s3_server import CREDENTIALS, create_bucket

    for key, value in {**CREDENTIALS, "AWS_ENDPOINT_URL_S3": s3_endpoint,
                       "MADR_STAGING_DIR": str(tmp_path / "staging")}.items():
        monkeypatch.setenv(key, value)
    name = f"madr-{uuid.uuid4().hex[:12]}"
    create_bucket(s3_endpoint, name)
    return f"s3://{name}"
