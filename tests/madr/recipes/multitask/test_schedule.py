"""Multi-task read schedules of paper 004 Sec. III-B: coverage, order, proportions, resume, sharding."""

from __future__ import annotations

import math
from collections import Counter

import numpy as np
import pytest

from madr.recipes.multitask import TaskSchedule

UNEVEN = {"snli": 95, "wiki": 301, "clicks": 17}  # batch 10 -> 10, 31, 2 batches; last ones 5, 1, 7 records


def records_by_task(batches) -> dict[str, list[int]]:
    seen: dict[str, list[int]] = {}
    for b in batches:
        seen.setdefault(b.task, []).extend(b.indices.tolist())
    return seen


def assert_each_record_once(batches, sizes):
    seen = records_by_task(batches)
    for name, size in sizes.items():
        assert sorted(seen.get(name, [])) == list(range(size)), f"task {name}: records not used exactly once"


@pytest.mark.parametrize("mode", ["proportional", "sequential", "random"])
def test_every_record_used_once_per_epoch_and_each_batch_from_one_task(mode):
    sched = TaskSchedule(UNEVEN, mode=mode, batch_size=10, seed=1)
    batches = list(sched)
    assert len(batches) == 10 + 31 + 2 == len(sched), f"{mode}: {len(batches)} steps"
    assert_each_record_once(batches, UNEVEN)
    sizes = Counter(len(b.indices) for b in batches)
    assert sizes == Counter({10: 40, 5: 1, 1: 1, 7: 1}), f"{mode}: batch sizes {sizes}"
    assert [b.step for b in batches] == list(range(len(batches))), "steps are numbered 0.."


def test_drop_last_keeps_only_full_batches():
    batches = list(TaskSchedule(UNEVEN, batch_size=10, drop_last=True, seed=0))
    assert all(len(b.indices) == 10 for b in batches), "drop_last leaves full batches only"
    assert Counter(b.task for b in batches) == {"snli": 9, "wiki": 30, "clicks": 1}
    seen = records_by_task(batches)
    assert all(len(set(v)) == len(v) for v in seen.values()), "no record twice"


def test_sequential_reads_tasks_in_the_given_order():
    sched = TaskSchedule(UNEVEN, mode="sequential", batch_size=10, shuffle=False)
    assert sched.tasks() == ["snli"] * 10 + ["wiki"] * 31 + ["clicks"] * 2
    first = next(iter(sched))
    assert first.indices.tolist() == list(range(10)), "shuffle=False reads consecutive records"


def test_proportional_share_follows_sizes_at_every_prefix():
    sizes = {"a": 1000, "b": 3000, "c": 6000}  # batch 10 -> 100, 300, 600 of M = 1000 batches
    tasks = np.array(TaskSchedule(sizes, mode="proportional", batch_size=10, seed=7).tasks())
    total = len(tasks)
    assert total == 1000
    for m in (100, 250, 500, 750, 900):
        for name, size in sizes.items():
            p = size / 10_000
            expected = m * p
            sd = math.sqrt(m * p * (1 - p) * (total - m) / (total - 1))  # hypergeometric
            got = int((tasks[:m] == name).sum())
            assert abs(got - expected) <= 4 * sd + 1, f"first {m} steps: {name} {got}, expected {expected} +- {4 * sd}"
    # no task runs dry early: each appears within the last 5% of the epoch
    assert set(tasks[-50:]) == set(sizes), f"tail {Counter(tasks[-50:].tolist())}"


def test_random_picks_tasks_uniformly_and_ends_with_the_largest():
    sizes = {"a": 1000, "b": 2000, "c": 4000}  # 100, 200, 400 batches
    counts: Counter = Counter()
    for seed in range(20):
        tasks = TaskSchedule(sizes, mode="random", batch_size=10, seed=seed).tasks()
        counts.update(tasks[:150])  # before any task can be exhausted (a needs 100 of the first 150)
        assert tasks[-100:] == ["c"] * 100, f"seed {seed}: the tail must come from the largest task only"
    # 3000 uniform draws: 1000 each, binomial sd ~ 26; tolerance 4 sd
    assert all(abs(counts[name] - 1000) <= 105 for name in sizes), f"not uniform: {counts}"


def test_weights_first_exhausted_stops_when_a_task_runs_out():
    sizes = {"a": 1000, "b": 1000}  # 100 batches each
    batches = list(TaskSchedule(sizes, mode="weights", weights={"a": 3, "b": 1}, batch_size=10, seed=3))
    counts = Counter(b.task for b in batches)
    assert counts["a"] == 100 and batches[-1].task == "a", f"a (weight .75) runs out first and ends it: {counts}"
    assert 15 <= counts["b"] <= 60, f"b expected ~33 batches: {counts}"  # negative binomial, sd ~ 6.7
    seen = records_by_task(batches)
    assert all(len(set(v)) == len(v) for v in seen.values()), "no record twice before the epoch ends"


def test_weights_all_exhausted_cycles_tasks_until_all_are_read():
    sizes = {"a": 1000, "b": 1000}
    sched = TaskSchedule(sizes, mode="weights", weights={"a": 0.75, "b": 0.25}, batch_size=10, seed=3,
                         stopping_condition="all_exhausted")
    batches = list(sched)
    counts = Counter(b.task for b in batches)
    assert counts["b"] == 100 and batches[-1].task == "b", f"ends when b is read through: {counts}"
    share = counts["a"] / len(batches)
    sd = math.sqrt(0.75 * 0.25 / len(batches))
    assert abs(share - 0.75) <= 4 * sd, f"a's share {share:.3f} vs weight .75 +- {4 * sd:.3f}"
    a_batches = [b for b in batches if b.task == "a"]
    assert max(b.cycle for b in a_batches) >= 1, "a cycles"
    first_cycle = [i for b in a_batches if b.cycle == 0 for i in b.indices.tolist()]
    assert sorted(first_cycle) == list(range(1000)), "each cycle reads every record of a once"


def test_epochs_reshuffle_and_seed_reproduces():
    a = TaskSchedule(UNEVEN, batch_size=10, seed=5)
    b = TaskSchedule(UNEVEN, batch_size=10, seed=5)
    epoch0 = [(x.task, x.indices.tolist()) for x in a]
    assert epoch0 == [(x.task, x.indices.tolist()) for x in b], "same seed, same epoch"
    epoch1 = [(x.task, x.indices.tolist()) for x in a]  # the next iteration is epoch 1
    assert a.epoch == 1 and epoch1 != epoch0, "a new epoch reshuffles"
    assert TaskSchedule(UNEVEN, batch_size=10, seed=6).tasks() != a.tasks(0), "another seed, another order"


@pytest.mark.parametrize("mode, extra", [("proportional", {}), ("random", {}), ("sequential", {}),
                                         ("weights", {"weights": {"snli": 1, "wiki": 2, "clicks": 1},
                                                      "stopping_condition": "all_exhausted"})])
def test_resume_from_state_dict_gives_the_identical_remaining_sequence(mode, extra):
    sched = TaskSchedule(UNEVEN, mode=mode, batch_size=10, seed=11, **extra)
    full = [(b.task, b.indices.tolist()) for b in TaskSchedule(UNEVEN, mode=mode, batch_size=10, seed=11, **extra)]
    it = iter(sched)
    head = [next(it) for _ in range(17)]
    state = sched.state_dict()
    resumed = TaskSchedule(UNEVEN, mode=mode, batch_size=10, seed=11, **extra)
    resumed.load_state_dict(state)
    rest = [(b.task, b.indices.tolist()) for b in resumed]
    assert [(b.task, b.indices.tolist()) for b in head] + rest == full, f"{mode}: resume diverged"
    # a state saved at the end of an epoch resumes with the next epoch
    list(it)
    sched2 = TaskSchedule(UNEVEN, mode=mode, batch_size=10, seed=11, **extra)
    sched2.load_state_dict(sched.state_dict())
    assert [b.indices.tolist() for b in sched2] == [b.indices.tolist() for b in sched], "next epoch differs"


def test_load_state_dict_rejects_another_configuration():
    state = TaskSchedule(UNEVEN, batch_size=10, seed=1).state_dict()
    with pytest.raises(ValueError, match="different seed"):
        TaskSchedule(UNEVEN, batch_size=10, seed=2).load_state_dict(state)
    with pytest.raises(ValueError, match="step/2"):
        TaskSchedule(UNEVEN, batch_size=10, seed=1).shard(0, 2, split="step").load_state_dict(state)
    with pytest.raises(ValueError, match="missing"):
        TaskSchedule(UNEVEN, batch_size=10, seed=1).load_state_dict({"epoch": 0})


@pytest.mark.parametrize("split", ["batch", "step"])
def test_two_way_sharding_is_disjoint_and_complete(split):
    sizes = {"snli": 96, "wiki": 300, "clicks": 18}  # every batch has >= 2 records
    full = TaskSchedule(sizes, batch_size=10, seed=4)
    parts = [list(full.shard(rank, 2, split=split)) for rank in range(2)]
    assert_each_record_once(parts[0] + parts[1], sizes)
    for name in sizes:
        r0, r1 = (set(records_by_task(p).get(name, [])) for p in parts)
        assert not r0 & r1, f"{split}: ranks share records of {name}"
    if split == "batch":
        assert [b.task for b in parts[0]] == [b.task for b in parts[1]] == full.tasks(), \
            "batch split: both ranks follow the global task order step by step"
    else:
        assert [b.task for b in parts[0]] == full.tasks()[0::2] and [b.task for b in parts[1]] == full.tasks()[1::2]


def test_batch_split_resumes_under_another_world_size():
    sizes = {"snli": 96, "wiki": 300}
    two = TaskSchedule(sizes, batch_size=10, seed=4).shard(1, 2)
    it = iter(two)
    for _ in range(5):
        next(it)
    one = TaskSchedule(sizes, batch_size=10, seed=4)
    one.load_state_dict(two.state_dict())
    assert next(iter(one)).step == 5, "global position carries over"


def test_bad_arguments_raise():
    with pytest.raises(ValueError, match="mode"):
        TaskSchedule({"a": 1}, mode="roundrobin")
    with pytest.raises(ValueError, match="sizes must be ints >= 1"):
        TaskSchedule({"a": 0})
    with pytest.raises(ValueError, match="weights must be given"):
        TaskSchedule({"a": 5}, mode="weights")
    with pytest.raises(ValueError, match="weights keys"):
        TaskSchedule({"a": 5, "b": 5}, mode="weights", weights={"a": 1})
    with pytest.raises(ValueError, match="> 0"):
        TaskSchedule({"a": 5}, mode="weights", weights={"a": 0})
    with pytest.raises(ValueError, match="fewer records than batch_size"):
        TaskSchedule({"a": 5}, batch_size=10, drop_last=True)
    with pytest.raises(ValueError, match="smaller than world_size"):
        TaskSchedule(UNEVEN, batch_size=10).shard(0, 2)  # wiki's last batch has one record
    with pytest.raises(ValueError, match="rank"):
        TaskSchedule(UNEVEN, batch_size=10).shard(2, 2, split="step")
