"""The multilingual recipe's `serve:` section is checked when the config loads (as the deploy stage reads it), so a
typo fails before training, naming the dotted key."""

from __future__ import annotations

from pathlib import Path

import pytest

from pipelines.multitask.config import load_pipeline_config

CONFIG = Path(__file__).resolve().parents[2] / "configs" / "real" / "multilingual.yaml"


def test_the_shipped_serve_section_loads():
    assert load_pipeline_config(CONFIG).serve["encoder_precision"] == "int8"


@pytest.mark.parametrize(("key", "value", "named"), [
    ("serve.encoder_precison", "int8", "serve.encoder_precison"),
    ("serve.encoder_precision", "int4", "serve.encoder_precision"),
    ("serve.searcher.max_ongoing", 4, "serve.searcher.max_ongoing"),
    ("serve.manifest_path", "/elsewhere", "serve.manifest_path"),
])
def test_a_bad_serve_key_fails_at_load(key, value, named):
    with pytest.raises(ValueError, match=named.replace(".", r"\.")) as err:
        load_pipeline_config(CONFIG, {key: value})
    assert "multilingual.yaml" in str(err.value)
