"""benchmarks.common.config.over_seeds: the quality benchmarks' loop over training seeds."""

from __future__ import annotations

from benchmarks.common.config import over_seeds


def test_over_seeds_transposes_the_results_and_prints_each_seed(capsys):
    calls = []

    def run_seed(seed):
        calls.append(seed)
        return {"hybrid": {"mrr@5": 0.5 + seed / 10}}, f"chosen-{seed}", seed * 2

    rows, chosen, finals = over_seeds([3, 1], run_seed, lambda result: result[0])
    assert calls == [3, 1]
    assert rows == [{"hybrid": {"mrr@5": 0.8}}, {"hybrid": {"mrr@5": 0.6}}]
    assert chosen == ["chosen-3", "chosen-1"] and finals == [6, 2]
    assert capsys.readouterr().out.splitlines() == ["seed 3 test MRR@5: hybrid 0.800", "seed 1 test MRR@5: hybrid 0.600"]
    assert over_seeds([], run_seed, lambda result: result[0]) == []
