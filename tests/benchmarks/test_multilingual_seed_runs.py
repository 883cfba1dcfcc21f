"""benchmarks.quality.multilingual.seed_runs: per-seed runs kept after each seed, merged with earlier JSONs."""

from __future__ import annotations

import json

from benchmarks.quality.multilingual import seed_runs


def test_partial_after_each_seed_then_merge_adds_only_seeds_not_run(tmp_path):
    partial = tmp_path / "results" / "t.partial.json"
    seen = []

    def run_one(seed: int) -> dict:
        if seen:  # the previous seed is on disk before the next one starts
            assert [r["seed"] for r in json.loads(partial.read_text())["runs"]] == seen
        seen.append(seed)
        return {"seed": seed, "rows": {"m": {"auc": seed / 10}}}

    earlier = tmp_path / "earlier.json"
    earlier.write_text(json.dumps({"runs": [{"seed": 0, "rows": {"m": {"auc": -1.0}}},
                                            {"seed": 1, "rows": {"m": {"auc": 0.5}}}]}))
    runs = seed_runs([2, 0], run_one, partial, {"n": 3}, [str(earlier)])
    assert [r["seed"] for r in runs] == [0, 1, 2], "sorted by seed, seed 1 merged in"
    assert runs[0]["rows"]["m"]["auc"] == 0.0, "a seed run here wins over the merged JSON's"
    assert json.loads(partial.read_text())["sizes"] == {"n": 3}


def test_a_rerun_of_the_same_configuration_resumes_from_the_partial_file(tmp_path):
    partial = tmp_path / "t.partial.json"
    calls = []

    def run_one(seed: int) -> dict:
        calls.append(seed)
        if seed == 2 and len(calls) == 2:
            raise RuntimeError("killed mid-run")
        return {"seed": seed}

    try:
        seed_runs([0, 2], run_one, partial, {}, [], key="cfg A")
    except RuntimeError:
        pass
    assert [r["seed"] for r in seed_runs([0, 2], run_one, partial, {}, [], key="cfg A")] == [0, 2]
    assert calls == [0, 2, 2], "seed 0 came from the partial file, seed 2 ran again"
    seed_runs([0], run_one, partial, {}, [], key="cfg B")
    assert calls[-1] == 0, "another configuration does not take the cached seeds"
