"""Task mixing over Ray Data streams: the TaskSchedule's order and proportions, one task per batch, every
row exactly once per epoch across 2 workers; tokenisation on an actor pool feeding int-only batches."""

from __future__ import annotations

import math
from collections import Counter

import numpy as np
import pyarrow as pa
import pytest
import torch

from pipelines.data.mixing import TaskMixer
from pipelines.data.tokenize import collate_to_torch, pad_batch, tokenize_dataset, tokenize_table

SIZES = {"nli": 400, "click": 200, "parallel": 100}  # batch 10 -> 40, 20, 10 batches
OFFSET = {"nli": 0, "click": 10_000, "parallel": 20_000}  # row ids tell which task a row came from


@pytest.fixture(scope="module")
def task_data(ray_local):
    ray_local.data.DataContext.get_current().enable_progress_bars = False
    return {name: ray_local.data.from_arrow([pa.table({"id": part + OFFSET[name]})  # 3 blocks per task
                                             for part in np.array_split(np.arange(n), 3)])
            for name, n in SIZES.items()}


def owner(row_id: int) -> str:
    return max((off, name) for name, off in OFFSET.items() if row_id >= off)[1]


def hypergeometric_sd(m: int, p: float, total: int) -> float:
    return math.sqrt(m * p * (1 - p) * (total - m) / (total - 1))


def test_proportional_follows_the_schedule_and_uses_every_row_once(task_data):
    mixer = TaskMixer(task_data, batch_size=10, seed=3, sizes=SIZES)
    batches = list(mixer)
    tasks = [b.task for b in batches]
    assert tasks == mixer.tasks(0), "the stream must follow the TaskSchedule's task order"
    for b in batches:
        assert {owner(i) for i in b.data["id"].tolist()} == {b.task}, f"step {b.step} mixes tasks"
    ids = np.concatenate([b.data["id"] for b in batches])
    assert sorted(ids.tolist()) == sorted(i + OFFSET[t] for t, n in SIZES.items() for i in range(n)), "once each"
    # Tolerance: the whole epoch is exact (each task contributes all its batches); every prefix of m steps
    # stays within 4 hypergeometric standard deviations of m * n_i / M (the schedule's stated spread).
    total, batches_per_task = len(tasks), {t: n // 10 for t, n in SIZES.items()}
    assert Counter(tasks) == batches_per_task
    for t, n in batches_per_task.items():
        p = n / total
        for m in range(1, total):
            count = tasks[:m].count(t)
            assert abs(count - m * p) <= 4 * hypergeometric_sd(m, p, total) + 1e-9, f"{t} after {m} steps: {count}"
    second = [b.task for b in mixer]
    assert second == mixer.tasks(1) and second != tasks, "the next iteration is a new, reshuffled epoch"


def test_sequential_random_and_weights_modes(task_data):
    seq = [b.task for b in TaskMixer(task_data, batch_size=10, mode="sequential", sizes=SIZES)]
    assert seq == ["nli"] * 40 + ["click"] * 20 + ["parallel"] * 10, "sequential reads task after task"

    rnd = TaskMixer(task_data, batch_size=10, mode="random", seed=5, sizes=SIZES)
    tasks = [b.task for b in rnd]
    assert tasks == rnd.tasks(0) and Counter(tasks) == {"nli": 40, "click": 20, "parallel": 10}
    first = Counter(tasks[:21])  # before the smallest task (10 batches) can run out, draws are uniform
    assert all(abs(c - 7) <= 4 * math.sqrt(21 * (1 / 3) * (2 / 3)) for c in first.values()), first

    weights = {"nli": 1.0, "click": 1.0, "parallel": 6.0}
    sizes = {"nli": 400, "click": 200, "parallel": 100}
    mixer = TaskMixer(task_data, batch_size=5, mode="weights", weights=weights, seed=2, sizes=sizes)
    tasks = [b.task for b in mixer]
    assert tasks == mixer.tasks(0), "weights mode follows the schedule's draws"
    assert tasks[-1] == "parallel" and tasks.count("parallel") == 20, "first_exhausted ends after parallel's last batch"
    # Tolerance: the share of each task within 4 binomial standard deviations of w_i / sum(w).
    steps = len(tasks)
    for t, w in weights.items():
        p = w / sum(weights.values())
        assert abs(tasks.count(t) / steps - p) <= 4 * math.sqrt(p * (1 - p) / steps), f"{t}: {tasks.count(t)}/{steps}"


def test_two_workers_get_every_row_exactly_once(task_data):
    mixer = TaskMixer(task_data, batch_size=13, seed=7, sizes=SIZES, world_size=2)  # odd: parts 7 + 6
    try:
        shard0, shard1 = mixer.shards()
        assert len(shard0) == len(shard1) == len(mixer.tasks(0)), "same number of steps on both workers"
        seen: dict[int, list[int]] = {0: [], 1: []}
        for b0, b1 in zip(shard0, shard1, strict=True):  # consumed in lockstep, like DDP workers
            assert b0.task == b1.task and b0.step == b1.step, "both workers run the same task at each step"
            assert abs(b0.num_rows - b1.num_rows) <= 1, "global batch split evenly"
            for rank, b in ((0, b0), (1, b1)):
                assert {owner(i) for i in b.data["id"].tolist()} == {b.task}
                seen[rank] += b.data["id"].tolist()
        everything = sorted(i + OFFSET[t] for t, n in SIZES.items() for i in range(n))
        assert not set(seen[0]) & set(seen[1]), "a row went to both workers"
        assert sorted(seen[0] + seen[1]) == everything, "rows lost or duplicated within the epoch"
        again = [b.task for b in shard0]  # rank 0 runs ahead into epoch 1 alone; rank 1 follows
        assert again == mixer.tasks(1) and len(list(shard1)) == len(again)
    finally:
        mixer.shutdown()


def test_wrong_sizes_are_an_error_not_a_silent_loss(task_data):
    with pytest.raises(ValueError, match="more rows than sizes"):
        list(TaskMixer(task_data, batch_size=10, sizes={**SIZES, "click": 190}))
    with pytest.raises(ValueError, match="fewer rows than sizes|schedule expects"):
        list(TaskMixer(task_data, batch_size=10, sizes={**SIZES, "parallel": 120}))


def test_tokenized_rows_mix_into_int_tensors(ray_local, tokenizer, tmp_path):
    path = tmp_path / "tok"
    tokenizer.save_pretrained(str(path))
    rows = pa.table({"premise": ["a red shoe", "blue running shoes for men " * 3, "hat"] * 20,
                     "hypothesis": ["shoe", "blue shoes", "a small green hat"] * 20,
                     "label": ["entailment", "neutral", "contradiction"] * 20, "language": ["en"] * 60})
    direct = tokenize_table(rows, tokenizer, "nli", max_length=16)
    assert direct.schema.names == ["premise_input_ids", "hypothesis_input_ids", "label_id"], direct.schema
    assert direct.column("premise_input_ids").to_pylist() == tokenizer(
        rows.column("premise").to_pylist(), truncation=True, max_length=16)["input_ids"], "same ids as the tokenizer"
    assert max(len(x) for x in direct.column("premise_input_ids").to_pylist()) == 16, "truncated to max_length"

    ds = tokenize_dataset(ray_local.data.from_arrow(rows), "nli", path, max_length=16, window=60, bucket=True,
                          max_actors=1)
    mixer = TaskMixer({"nli": ds}, batch_size=12, sizes={"nli": 60}, collate=collate_to_torch)
    batches = list(mixer)
    assert sum(b.num_rows for b in batches) == 60
    for b in batches:
        assert all(isinstance(v, torch.Tensor) and not v.is_floating_point() for v in b.data.values()), b.data
        assert b.data["premise_input_ids"].shape == b.data["premise_attention_mask"].shape
    padding = sum(int((1 - b.data["premise_attention_mask"]).sum()) for b in batches)
    ids = direct.column("premise_input_ids").to_pylist()  # the same rows in their original order
    unsorted = sum(int((1 - pad_batch({"premise_input_ids": ids[i:i + 12]})["premise_attention_mask"]).sum())
                   for i in range(0, 60, 12))
    assert padding < unsorted, f"length bucketing should cut padding: {padding} vs {unsorted} pad tokens"
