"""Session fixtures: a small seeded catalog, a WordPiece tokenizer trained on it in-process, its aspect
vocabularies, and (for Ray tests) one local Ray instance with the loopback-only network settings."""

from __future__ import annotations

from pathlib import Path

import pytest

from pipelines.ray_env import apply_ray_env

# Ray network hygiene: must be set before any ray.init in this process (see scripts/ray_env.sh).
apply_ray_env(offline=True)

SHARED = Path(__file__).resolve().parents[1].parent / "shared"


@pytest.fixture(scope="session")
def catalog():
    from madr.data.synthetic import generate_catalog

    return generate_catalog(num_products=400, num_queries=200, seed=0)


@pytest.fixture(scope="session")
def tokenizer(catalog, tmp_path_factory):
    from madr.tokenization import train_wordpiece_tokenizer

    texts = [catalog.product_text(p) for p in catalog.products] + [q.text for q in catalog.queries]
    return train_wordpiece_tokenizer(texts, vocab_size=1200, out_dir=str(tmp_path_factory.mktemp("tok")))


@pytest.fixture(scope="session")
def vocabularies(catalog, tokenizer):
    from madr.aspects.vocabulary import build_vocabularies

    annotations = [p.aspects for p in catalog.products] + [q.aspects for q in catalog.queries]
    return build_vocabularies(annotations, catalog.aspect_names, ["phrase", "word", "token"],
                              tokenize=tokenizer.tokenize)


@pytest.fixture(scope="session")
def shared_data() -> Path:
    """Real public data beside the repository; tests using it skip only when ../shared is absent."""
    if not (SHARED / "data").is_dir():
        pytest.skip("../shared/data is not present")
    return SHARED / "data"


@pytest.fixture(scope="session")
def ray_local():
    import ray

    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, configure_logging=False)
    yield ray
    ray.shutdown()
