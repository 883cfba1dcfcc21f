"""The click-debiasing study at a tiny size: a synthetic judged catalog where the study keeps its catalog, a
random 2-layer BERT, two fine-tuning steps per run; every row trains, the report has its paired tests and curve
error, and a second call resumes from the per-run cache without training."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from benchmarks.quality.click_debias import main
from madr.data.synthetic.catalog import generate_catalog

pytestmark = pytest.mark.slow  # a marked step of its own: `make test-slow` (CI runs it)


def test_click_debias_tiny_and_resumable(tmp_path: Path) -> None:
    cfg = {"name": "tiny_clicks", "output_dir": str(tmp_path / "unused"),
           "data": {"tokenizer_vocab_size": 600},
           "model": {"name": "bibert", "backbone": {"name_or_path": None, "tiny": {
               "hidden_size": 32, "num_hidden_layers": 1, "num_attention_heads": 2, "intermediate_size": 64,
               "max_position_embeddings": 64}}, "shared_towers": True, "max_query_length": 12, "max_doc_length": 24},
           "train": {"pretrain": {"steps": 0}, "finetune": {"steps": 2, "batch_size": 8, "negatives": "mined",
                                                             "mined_depth": 5, "aspect_weight": 0.0}},
           "eval": {"relevance_threshold": 3.0}}
    path = tmp_path / "tiny.yaml"
    path.write_text(yaml.safe_dump(cfg))
    generate_catalog(120, 60, seed=0).write(tmp_path / "study" / "catalog")  # used instead of Home Depot's
    argv = ["--config", str(path), "--sizes", "400", "--seeds", "0", "--top-k", "5", "--pool", "15",
            "--corpus-size", "0", "--draws", "200", "--threads", "1", "--out", str(tmp_path / "study"),
            "--results-dir", str(tmp_path)]
    first = main(argv)
    report = first["sizes"]["400"]
    assert set(report["means"]) == {"naive", "debiased", "filtered", "judgments"}
    assert set(report["tests"]) == {"debiased vs naive", "filtered vs naive", "judgments vs debiased",
                                    "judgments vs naive"}
    assert set(report["gap_recovered"]) == {"debiased", "filtered"}
    assert report["tests"]["debiased vs naive"]["recall@10"]["n"] > 0
    assert len(report["curve_max_abs_error"]) == 1 and len(report["estimated_curves"][0]) == 5
    assert (tmp_path / "results" / "click_debias.json").is_file()
    second = main(argv)
    assert all(r["cached"] for rows in second["runs"].values() for rs in rows.values() for r in rs), \
        "a second call reads every run from its cache"
    assert second["sizes"] == first["sizes"]

