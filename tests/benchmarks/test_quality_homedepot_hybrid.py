"""benchmarks.quality.homedepot_hybrid end to end on a catalog a user brings (`data.catalog_dir`, no
`homedepot:` section): BM25 on two tokenizers, two untrained references and their fusions tuned on dev, BiBERT and
MADRAL (Presence Weighting) fine-tuned with 2 seeds, alone and fused with BM25, paired tests, the per-row list
cache a rerun resumes from (nothing recomputed; only the trained rows after a training change; only what a stop
lost) and the test aspect Accuracy@1.

The session's synthetic catalog is written in the `data.catalog_dir` layout; random 2-layer BERTs saved with the
session's WordPiece stand in for all-MiniLM ("minilm") and multilingual-e5-small ("e5", also the trained rows'
start); MADRAL pretrains its aspect heads 2 steps on the frozen, memoised backbone (`train.pretrain.mlm_weight
0`, `train.pretrain.freeze_backbone` / `memoise_backbone`), then every row fine-tunes 2 steps. This checks the wiring, not quality.
"""

from __future__ import annotations

import contextlib
import io
import json
import math
import re
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml

from benchmarks.quality import homedepot_hybrid as bench
from benchmarks.quality.aspect_models.evaluation import weight_grid
from tests.benchmarks.tiny_backbone import save_tiny_bert

pytestmark = pytest.mark.slow  # a marked step of its own: `make test-slow` (CI runs it)

STEP = 0.25  # bench.fusion_step: 5 weight pairs, 15 weight triples
NORMS = ["minmax", "zscore"]  # bench.fusion_normalisations: each with every weight vector
REFERENCES = ["minilm", "e5"]
TRAINED = ["bibert", "madral_pw"]
SEEDS = [0, 1]
STEPS = 2  # pretraining and fine-tuning steps per row
# the retrievers whose lists are kept in <output_dir>/lists (fusions are tuned from them on every run)
LISTED = ["bm25", "bm25_model", *REFERENCES, *[f"{row}@{s}" for s in SEEDS for row in TRAINED]]
ROWS = {
    "bm25",
    "bm25_model",
    "minilm",
    "e5",
    "bm25+minilm",
    "bm25+e5",
    "bm25+minilm+e5",
    "bm25+e5 rrf",
    *[f"{fusion}{row}" for row in TRAINED for fusion in ("", "bm25+", "bm25_model+", "bm25+minilm+")],
}


def _backbone(path: Path, tokenizer, seed: int) -> str:
    return save_tiny_bert(path, tokenizer, seed, max_positions=64)


@pytest.fixture(scope="module")
def user_config(catalog, tokenizer, tmp_path_factory) -> Path:
    """A config with no `homedepot:`: the catalog is the user's `data.catalog_dir`."""
    root = tmp_path_factory.mktemp("hybrid")
    catalog.write(root / "catalog")
    minilm, e5 = _backbone(root / "minilm", tokenizer, 1), _backbone(root / "e5", tokenizer, 2)
    prefixes = {"query": "query: ", "doc": "passage: "}
    cfg = {
        "bench": {
            "seeds": SEEDS,
            "corpus_size": 300,
            "dev_corpus_size": 320,
            "lexical_tokenizer": minilm,
            "references": {
                "minilm": {"label": "untrained tiny minilm", "backbone": minilm, "prefixes": {}},
                "e5": {"label": "untrained tiny e5", "backbone": e5, "prefixes": prefixes},
            },
            "trained": TRAINED,
            "fusion_step": STEP,
            "fusion_normalisations": NORMS,
            "target": "bm25+e5",
            "draws": 200,
            "encode_batch_size": 64,
            "save_models": ["madral_pw"],
        },
        "name": "tiny_hybrid",
        "output_dir": str(root / "run"),
        "data": {"catalog_dir": str(root / "catalog")},
        "model": {
            "name": "bibert",
            "backbone": {"name_or_path": e5},
            "shared_towers": True,
            "pooling": "mean",
            "aspect_init": "pooled",
            "text_prefixes": prefixes,
            "aspects": ["category", "brand", "color"],
            "similarity": "cosine",
            "temperature": 0.05,
            "max_query_length": 16,
            "max_doc_length": 40,
            "vocab_min_freq": 1,
        },
        "train": {
            "pretrain": {
                "steps": STEPS,
                "batch_size": 8,
                "learning_rate": 1.0e-3,
                "aspect_weight": 1.0,
                "mlm_weight": 0.0,
                "log_every": 2,
                "freeze_backbone": True,
                "memoise_backbone": True,
            },
            "finetune": {
                "steps": STEPS,
                "batch_size": 8,
                "learning_rate": 1.0e-3,
                "aspect_weight": 0.1,
                "log_every": 2,
            },
        },
        "eval": {
            "retrieval_metrics": ["recall@10", "recall@50", "mrr@10"],
            "rerank_metrics": ["ndcg@10", "auc"],
            "relevance_threshold": 3.0,
            "top_k": 50,
        },
    }
    path = root / "hybrid.yaml"
    path.write_text(yaml.safe_dump(cfg, sort_keys=False))  # references in order
    return path


def _main(config: Path, out: Path, tag: str, *sets: str) -> tuple[dict, str]:
    """(result, what it printed) of one invocation on 1 thread."""
    threads, printed = torch.get_num_threads(), io.StringIO()
    try:
        with contextlib.redirect_stdout(printed):
            result = bench.main(
                [
                    "--config",
                    str(config),
                    "--out-dir",
                    str(out),
                    "--tag",
                    tag,
                    "--threads",
                    "1",
                    *[a for s in sets for a in ("--set", s)],
                ]
            )
    finally:
        torch.set_num_threads(threads)  # main() sets the process-wide count
    return result, printed.getvalue()


def _json(value) -> str:
    """`value` as sorted JSON: equal for equal content."""
    return json.dumps(value, sort_keys=True)


def _kept(config: Path) -> tuple[dict[str, dict], dict[str, dict[str, np.ndarray]]]:
    """What the output dir keeps of each trained row now: its info (training, test aspect Accuracy@1) and its
    lists."""
    lists = Path(yaml.safe_load(config.read_text())["output_dir"]) / "lists"
    trained = [k for k in LISTED if "@" in k]
    info = {k: json.loads((lists / f"{k}.info.json").read_text()) for k in trained}
    arrays = {}
    for k in trained:
        with np.load(lists / f"{k}.npz") as z:
            arrays[k] = {f: z[f].copy() for f in z.files if f != "key"}
    return info, arrays


@pytest.fixture(scope="module")
def runs(user_config, tmp_path_factory) -> dict:
    """In this order (they share the output dir and its list cache): the first run; the same command again;
    one with another fine-tuning learning rate; and that one resumed after a stop that lost MADRAL's seed-1
    lists, with BiBERT's models to save as well."""
    out = tmp_path_factory.mktemp("out")
    lr = "train.finetune.learning_rate=2.0e-3"
    runs = {
        "first": _main(user_config, out, "first"),
        "again": _main(user_config, out, "again"),
        "retrained": _main(user_config, out, "retrained", lr),
        "out": out,
    }
    runs["kept"] = _kept(user_config)
    lists = Path(yaml.safe_load(user_config.read_text())["output_dir"]) / "lists"
    (lists / "madral_pw@1.npz").unlink()
    runs["resumed"] = _main(user_config, out, "resumed", lr, "bench.save_models=[madral_pw, bibert]")
    return runs


def test_the_table_has_every_reference_fusion_and_trained_row(runs, user_config, catalog):
    result, printed = runs["first"]
    metrics = ["recall@10", "recall@50", "mrr@10", "ndcg@10", "auc"]
    assert set(result["mean"]) == ROWS, sorted(set(result["mean"]) ^ ROWS)
    for key in ROWS:
        assert list(result["mean"][key]) == metrics, (key, result["mean"][key])
        assert all(math.isfinite(v) and 0.0 <= v <= 1.0 for v in result["mean"][key].values()), result[
            "mean"
        ][key]
        assert f"| {result['labels'][key]} |" in result["table"], f"row {key} missing from the printed table"
    assert set(result["tests"]) == ROWS - {"bm25+e5"}, "every row is tested against the target"
    n = result["data"]["test_queries"]
    assert all(t["n"] == n for per_metric in result["tests"].values() for t in per_metric.values())
    for key in ("bibert", "bm25+madral_pw"):  # two seeds: a spread over seeds for the trained rows
        assert any(v > 0 for v in result["std"][key].values()), (key, result["std"][key])
    assert all(v == 0 for v in result["std"]["e5"].values()), "a reference has no seed"
    saved = json.loads((runs["out"] / "results" / "first.json").read_text())
    assert set(saved["mean"]) == ROWS and saved["seeds"] == SEEDS
    assert (runs["out"] / "plots" / "first.png").is_file()
    assert "Traceback" not in printed


def test_the_user_catalog_is_read_without_a_homedepot_section(runs, user_config, catalog):
    """`data.catalog_dir` is the catalog: its test / dev queries with a product of relevance >= 3 over a corpus
    of `bench.corpus_size` / `bench.dev_corpus_size` of its products; no Home Depot catalog is written."""
    result, _ = runs["first"]
    relevant = {j.query_id for j in catalog.judgments if j.relevance >= 3}
    for split, size in (("test", 300), ("dev", 320)):
        queries = {q.query_id for q in catalog.queries if q.split == split and q.query_id in relevant}
        judged = {j.product_id for j in catalog.judgments if j.query_id in queries}
        assert result["data"][f"{split}_queries"] == len(queries) > 0, (split, result["data"])
        # every judged product of the evaluated queries, then a sample of the others up to the size
        assert result["data"][f"{split}_corpus"] == max(size, len(judged)) < len(catalog.products), (
            split,
            result,
        )
    cfg = yaml.safe_load(user_config.read_text())
    assert "homedepot" not in cfg and result["config"]["data"]["catalog_dir"] == cfg["data"]["catalog_dir"]
    assert not list(Path(cfg["output_dir"]).glob("catalog*")), "nothing but the user's catalog is read"


def _fusions(result: dict) -> dict[str, dict]:
    """Every tuned fusion: the references' and each seed's trained rows'."""
    out = dict(result["fusions"])
    for seed, rows in result["training"].items():
        out |= {f"{key}@{seed}": f for key, f in rows.items() if "+" in key}
    return out


def _dev_key(normalisation: str, weights) -> str:
    return f"{normalisation}:" + "/".join(map(str, weights))


def test_fusion_weights_are_on_the_grid_and_the_best_on_dev(runs):
    result, _ = runs["first"]
    fusions = _fusions(result)
    expected = {
        "bm25+minilm",
        "bm25+e5",
        "bm25+minilm+e5",
        *[
            f"{f}{row}@{s}"
            for s in SEEDS
            for row in TRAINED
            for f in ("bm25+", "bm25_model+", "bm25+minilm+")
        ],
    }
    assert set(fusions) == expected, sorted(set(fusions) ^ expected)
    for key, f in fusions.items():
        grid = [(n, w) for n in NORMS for w in weight_grid(len(f["parts"]), STEP)]
        assert set(f["dev"]) == {_dev_key(n, w) for n, w in grid}, (key, sorted(f["dev"]))
        chosen = _dev_key(f["normalisation"], f["weights"])
        best = max(f["dev"].values())
        assert f["dev"][chosen] == best, (key, chosen, f["dev"])
        first_best = next(_dev_key(n, w) for n, w in grid if f["dev"][_dev_key(n, w)] == best)
        assert chosen == first_best, (
            f"{key}: ties go to the first normalisation, then the first in grid order"
        )
        assert all(0.0 <= v <= 1.0 for v in f["dev"].values())
    assert fusions["bm25+minilm+e5"]["parts"] == ["bm25", "minilm", "e5"]
    assert fusions["bm25_model+madral_pw@1"]["parts"] == ["bm25_model", "madral_pw@1"]
    weights = " / ".join(f"{w:g}" for w in fusions["bm25+e5"]["weights"])
    assert f"weights {weights} (dev)" in result["labels"]["bm25+e5"]


def test_a_second_run_recomputes_nothing(runs):
    (first, _), (again, printed) = runs["first"], runs["again"]
    labels = {k: first["labels"][k.split("@")[0]] for k in LISTED}
    assert set(first["seconds"]) == set(again["seconds"]) == set(LISTED), sorted(first["seconds"])
    assert all(first["seconds"][k] > 0 for k in LISTED), first["seconds"]
    assert all(again["seconds"][k] == 0.0 for k in LISTED), again["seconds"]
    assert printed.count("(kept)") == len(LISTED), printed[-3000:]
    assert all(f"{labels[k].split(',')[0]}" in printed for k in LISTED)
    assert (
        again["mean"] == first["mean"] and again["std"] == first["std"] and again["tests"] == first["tests"]
    )
    assert _fusions(again) == _fusions(first), "same lists, same tuned weights"
    for seed in SEEDS:  # the kept training info (aspect accuracy) comes back with the kept lists
        assert _json(again["training"][seed]) == _json(first["training"][seed]), seed


def test_a_changed_training_setting_retrains_only_the_trained_rows(runs):
    (first, _), (retrained, printed) = runs["first"], runs["retrained"]
    trained = [k for k in LISTED if "@" in k]
    assert all(retrained["seconds"][k] == 0.0 for k in LISTED if k not in trained), retrained["seconds"]
    assert all(retrained["seconds"][k] > 0 for k in trained), retrained["seconds"]
    assert printed.count("(kept)") == len(LISTED) - len(trained), printed[-3000:]
    for key in (
        "bm25",
        "bm25_model",
        "minilm",
        "e5",
        "bm25+minilm",
        "bm25+e5",
        "bm25+minilm+e5",
        "bm25+e5 rrf",
    ):
        assert retrained["mean"][key] == first["mean"][key], key
    assert any(retrained["mean"][row] != first["mean"][row] for row in TRAINED), (
        "another learning rate, other models"
    )
    assert retrained["config"]["train"]["finetune"]["learning_rate"] == 2.0e-3


def test_a_stopped_run_resumes(runs, user_config):
    """A lost list (a run stopped before keeping it) and a model to save that the kept run did not save are
    computed again, nothing else. Trained again with the same seed they are the very same lists, also while
    MADRAL pretrains on the memoised backbone."""
    (retrained, _), (resumed, printed) = runs["retrained"], runs["resumed"]
    redone = {"madral_pw@1", "bibert@0", "bibert@1"}  # BiBERT: kept lists, but no model was saved
    assert {k for k in LISTED if resumed["seconds"][k] > 0} == redone, resumed["seconds"]
    assert printed.count("(kept)") == len(LISTED) - len(redone), printed[-3000:]
    info, lists = _kept(user_config)
    for key, arrays in runs["kept"][1].items():
        for field, values in arrays.items():
            np.testing.assert_array_equal(lists[key][field], values, err_msg=f"{key} {field}")
    assert resumed["mean"] == retrained["mean"] and resumed["tests"] == retrained["tests"]
    run = Path(resumed["config"]["output_dir"])
    assert all((run / f"seed{s}" / row / "model").is_dir() for s in SEEDS for row in TRAINED), (
        "bench.save_models"
    )
    # a saved aspect model carries its dev-fitted confidence temperatures (what `/explain` reads); BiBERT has none
    assert all((run / f"seed{s}" / "madral_pw" / "model" / "aspect_calibration.json").is_file() for s in SEEDS)
    assert not any((run / f"seed{s}" / "bibert" / "model" / "aspect_calibration.json").exists() for s in SEEDS)
    fitted = info["madral_pw@1"]["calibration"]
    assert fitted and all(r["nll_after"] <= r["nll_before"] and r["temperature"] > 0 for r in fitted.values())


def test_the_training_info_and_the_test_aspect_accuracy(runs, user_config):
    """MADRAL pretrains (aspect losses only), BiBERT has nothing to pretrain; test aspect Accuracy@1 for MADRAL."""
    result, _ = runs["retrained"]
    kept = runs["kept"][0]  # what the output dir kept after it
    for row in TRAINED:
        info = kept[f"{row}@0"]
        assert _json(info) == _json(result["training"][0][row]), row
        assert info["finetune"]["steps"] == STEPS and ("pretrain" in info) == (row == "madral_pw"), info
    madral, bibert = kept["madral_pw@0"], kept["bibert@0"]
    assert madral["pretrain"]["steps"] == STEPS and math.isfinite(madral["pretrain"]["final_loss"])
    test_acc = madral["aspects"]["test"]
    assert {f"{side}_acc@1_{a}" for side in ("query", "doc") for a in ("category", "brand", "color")} == set(
        test_acc
    )
    assert all(0.0 <= v <= 1.0 for v in test_acc.values()), test_acc
    assert bibert["aspects"] == {}, "BiBERT predicts no aspect"
    assert "## Aspect Accuracy@1 on the test queries" in result["table"]
    aspect_rows = result["table"].split("## Aspect Accuracy@1")[1].split("\nmachine:")[0]
    assert (
        f"| {result['labels']['madral_pw']} |" in aspect_rows
        and result["labels"]["bibert"] not in aspect_rows
    )


def test_a_bad_bench_setting_fails_naming_the_file(user_config, tmp_path):
    cfg = yaml.safe_load(user_config.read_text())
    cfg["bench"]["save_model"] = ["bibert"]
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump(cfg))
    with pytest.raises(SystemExit, match=re.escape(f"{bad}: unknown bench key(s) ['save_model']")):
        _main(bad, tmp_path, "bad")
    with pytest.raises(SystemExit, match=re.escape(f"{user_config}: unknown bench key(s) ['tune']")):
        _main(user_config, tmp_path, "bad", "bench.tune=1")
    assert not (tmp_path / "results").exists(), "nothing ran"


def test_the_shipped_product_search_config_runs_on_a_user_catalog(user_config, tmp_path):
    """configs/real/product_search.yaml (the configuration to use) as a user runs it: their
    `data.catalog_dir`, every setting of the shipped file but the backbones (tiny ones here), the sizes and the step
    count; its row, BiBERT fine-tuned on BM25-mined negatives, is trained, saved, fused and tested against BM25 + e5."""
    tiny = yaml.safe_load(user_config.read_text())
    refs = tiny["bench"]["references"]
    shipped = bench.ROOT / "configs" / "real" / "product_search.yaml"
    result, printed = _main(
        shipped,
        tmp_path,
        "shipped",
        f"data.catalog_dir={tiny['data']['catalog_dir']}",
        f"output_dir={tmp_path / 'run'}",
        f"model.backbone.name_or_path={refs['e5']['backbone']}",
        f"bench.lexical_tokenizer={refs['minilm']['backbone']}",
        f"bench.references.minilm.backbone={refs['minilm']['backbone']}",
        f"bench.references.e5.backbone={refs['e5']['backbone']}",
        "bench.corpus_size=300",
        "bench.dev_corpus_size=320",
        "bench.fusion_step=0.5",
        "bench.draws=100",
        "bench.freeze_layers=1",
        "train.finetune.steps=2",
        "train.finetune.batch_size=8",
        "model.max_doc_length=40",
        "eval.top_k=50",
        "eval.retrieval_metrics=[recall@10, mrr@10]",
    )
    assert result["config"]["train"]["finetune"]["negatives"] == "mined"
    assert {"bibert_mined", "bm25+bibert_mined", "bm25_model+bibert_mined", "bm25+e5"} <= set(result["mean"])
    assert "bm25+bibert_mined" in result["tests"], "tested against the target"
    assert "BiBERT, BM25-mined negatives" in result["labels"]["bibert_mined"]
    assert (tmp_path / "run" / "seed0" / "bibert_mined" / "model" / "config.json").is_file()
    assert "Relative to BM25 + e5" in printed


def test_exported_rows_carry_the_full_runs_per_query_metrics(runs, user_config, tmp_path):
    """`--export` (rows trained on another machine, e.g. a GPU) writes each trained row-seed's per-query test
    metrics, of the row alone and of its fusions (`benchmarks.quality.pipeline_equivalence.write_row`): read back, their seed means
    are the full run's table."""
    from madr.metrics import query_means

    lr = "train.finetune.learning_rate=2.0e-3"  # the settings of the last run: every list is kept
    export = tmp_path / "export"
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        bench.main(["--config", str(user_config), "--out-dir", str(tmp_path), "--tag", "export", "--threads", "1",
                    "--set", lr, "--export", str(export)])
    torch.set_num_threads(1)
    assert "s train" not in printed.getvalue(), "the export reused the kept lists: nothing was retrained"
    assert sorted(p.relative_to(export).as_posix() for p in export.rglob("*.json")) == sorted(
        f"seed{s}/{row}.json" for s in SEEDS for row in TRAINED)
    exported = {s: {} for s in SEEDS}
    for s in SEEDS:
        for row in TRAINED:
            exported[s] |= json.loads((export / f"seed{s}" / f"{row}.json").read_text())["per_query"]
    full = runs["resumed"][0]
    for key in [*TRAINED, *[f"bm25+{row}" for row in TRAINED], *[f"bm25+minilm+{row}" for row in TRAINED]]:
        for m, v in full["mean"][key].items():
            got = np.mean([query_means(exported[s][key])[m] for s in SEEDS])
            assert got == pytest.approx(v, abs=1e-9), (key, m)

