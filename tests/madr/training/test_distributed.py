"""In-batch negatives across workers (madr.training.distributed) and the data-parallel engine step: two real gloo
processes must produce the loss and the gradients of one process on the concatenated batch.

Everything here runs in float64. The two sides compute the same mathematics in a different order (each
worker sums over its own rows, gloo sums the workers; GradCache sums over chunks), so in float32 they agree
only to rounding: a gradient entry that is a sum of many terms cancelling to a small value (the
token-type embedding row every token adds to; an entry near zero that Adam's first step, g / (|g| + eps),
turns into a +-lr step) differs by ~1e-7 x the size of its terms, and how large that is depends on the
CPU's GEMM kernels and blocking. That made these tests fail on some machines of the same kind.
In float64 the same reordering costs ~1e-16 relative (measured: <= 6e-14 absolute on gradients up to 8),
eight orders of magnitude below the tolerances below, so the tolerances test the algorithm, not the CPU.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn

from madr.losses import InBatchSoftmaxLoss
from madr.training.distributed import GatheredInBatchSoftmaxLoss, gather_with_grad, world_size
from pipelines.jobs.local_cluster import free_port


@contextlib.contextmanager
def _float64() -> Iterator[None]:
    """Build and run models in float64 (see the module docstring), restoring the default afterwards."""
    previous = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    try:
        yield
    finally:
        torch.set_default_dtype(previous)


def _init(rank: int, world: int, port: int) -> None:
    os.environ["TOKENIZERS_PARALLELISM"] = "false"
    os.environ.update({"LOCAL_RANK": str(rank), "RANK": str(rank), "WORLD_SIZE": str(world),  # as a launcher does
                       "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)})
    torch.set_num_threads(1)
    torch.set_default_dtype(torch.float64)  # a spawned worker process: see the module docstring
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)


class _Towers(nn.Module):
    """Two linear 'towers'; forward returns this worker's loss (DDP wraps it)."""

    def __init__(self) -> None:
        super().__init__()
        self.q, self.d = nn.Linear(6, 4), nn.Linear(6, 4)

    def forward(self, xq, xp, xn, mode: str):
        q, p, n = self.q(xq), self.d(xp), self.d(xn)
        if mode == "correct":
            return GatheredInBatchSoftmaxLoss("cosine", 0.1)(q, p, n)
        # the bug of sentence-transformers PR 3453: other workers' documents gathered without gradient
        parts = [torch.zeros_like(p) for _ in range(world_size())]
        dist.all_gather(parts, p.detach())
        parts[dist.get_rank()] = p
        docs = torch.cat(parts + [gather_with_grad(n)[0]])
        logits = InBatchSoftmaxLoss.scores(q, docs, "cosine") / 0.1
        target = torch.arange(len(q)) + dist.get_rank() * len(q)
        return nn.functional.cross_entropy(logits, target)


def _toy(rank: int, world: int, sizes: list[int], data: dict) -> dict:
    torch.manual_seed(0)
    towers = _Towers()
    lo, hi = sum(sizes[:rank]), sum(sizes[: rank + 1])
    result = {}
    for mode in ("correct", "naive"):
        if mode == "naive" and len(set(sizes)) > 1:
            continue
        ddp = nn.parallel.DistributedDataParallel(towers)
        towers.zero_grad()
        loss = ddp(data["q"][lo:hi], data["p"][lo:hi], data["n"][lo:hi], mode)
        loss.backward()
        losses = [torch.zeros(1) for _ in range(world)]
        dist.all_gather(losses, loss.detach().reshape(1))
        result[mode] = {"loss": float(sum(losses)) / world,
                        "grads": {k: v.grad.clone() for k, v in towers.named_parameters()}}
    return result


def _engine(rank: int, world: int, out: Path) -> dict:
    from madr.modeling.model import BiEncoder
    from madr.training.gradcache import take_rows
    from madr.training.stage_module import StageModule
    from pipelines.train.engine import DDPEngine

    setup = torch.load(out / "setup.pt", weights_only=False)
    result = {}
    for chunk in (0, 3):
        stage = dataclasses.replace(setup["stage"], gradcache_chunk=chunk)
        module = StageModule("finetune", stage, BiEncoder.load(out / "model"), gather=True)
        module.load_state_dict(setup["state"])
        engine = DDPEngine(module, stage, torch.device("cpu"))
        n = len(setup["batch"].queries.input_ids) // world
        parts = engine.accumulate([take_rows(setup["batch"], slice(rank * n, (rank + 1) * n))], step=0)
        result[chunk] = {"parts": parts, "grads": {k: p.grad.clone() for k, p in module.named_parameters()
                                                   if p.grad is not None}}
    result["updated"] = _one_step_each_backend(rank, world, out, setup)
    return result


def _one_step_each_backend(rank: int, world: int, out: Path, setup: dict) -> dict:
    """One optimiser step: DDP plain backprop vs DeepSpeed ZeRO-2 with GradCache chunks of 3 rows."""
    from madr.distributed_config import DistributedConfig
    from madr.modeling.model import BiEncoder
    from madr.training.gradcache import take_rows
    from madr.training.stage_module import StageModule
    from pipelines.train.engine import DDPEngine, DeepSpeedEngine

    n = len(setup["batch"].queries.input_ids) // world
    mine = take_rows(setup["batch"], slice(rank * n, (rank + 1) * n))
    params, zero = {}, {}
    for backend, chunk in (("ddp", 0), ("deepspeed", 3)):
        stage = dataclasses.replace(setup["stage"], gradcache_chunk=chunk, warmup_ratio=0.0, learning_rate=1e-2)
        module = StageModule("finetune", stage, BiEncoder.load(out / "model"), gather=True)
        module.load_state_dict(setup["state"])
        if backend == "ddp":
            engine = DDPEngine(module, stage, torch.device("cpu"))
        else:
            engine = DeepSpeedEngine(module, stage, torch.device("cpu"), DistributedConfig(zero_stage=2), n)
        engine.train_step([mine], step=0)
        zero[backend] = engine.zero_stage
        params[backend] = {k: p.detach().clone() for k, p in module.named_parameters()}
    return {"params": params, "zero_stage": zero}


def _worker(rank: int, world: int, port: int, out: str) -> None:
    _init(rank, world, port)
    out = Path(out)
    data = torch.load(out / "data.pt")
    result = {"toy": {tuple(sizes): _toy(rank, world, sizes, data) for sizes in ([3, 3], [4, 2])},
              "engine": _engine(rank, world, out)}
    if rank == 0:
        torch.save(result, out / "result.pt")
    dist.destroy_process_group()


TINY = {"hidden_size": 32, "num_hidden_layers": 1, "num_attention_heads": 2, "intermediate_size": 64,
        "max_position_embeddings": 64, "hidden_dropout_prob": 0, "attention_probs_dropout_prob": 0}


@pytest.fixture(scope="module")
def two_workers(tmp_path_factory, catalog, tokenizer, vocabularies):
    """One spawn of two gloo processes computing everything the tests below compare (process start-up
    dominates: ~10 s on 2 busy cores), plus the single-process references."""
    out = tmp_path_factory.mktemp("dist")
    with _float64():
        return _two_workers(out, catalog, tokenizer, vocabularies)


def _two_workers(out: Path, catalog, tokenizer, vocabularies) -> dict:
    from madr.config import ModelConfig, StageConfig
    from madr.modeling.model import build_model
    from madr.training.loop import CatalogSampler, finetune_batches
    from madr.training.stage_module import FinetuneBatch, StageModule

    torch.manual_seed(1)
    data = {k: torch.randn(6, 6) for k in ("q", "p", "n")}
    torch.save(data, out / "data.pt")
    cfg = ModelConfig(name="madral", aspects=catalog.aspect_names, projection_dim=16, max_query_length=16,
                      max_doc_length=32)
    cfg.backbone.tiny = TINY
    torch.manual_seed(0)
    model = build_model(cfg, tokenizer, vocabularies)
    model.save(out / "model")
    # aspect_weight=0: the aspect losses are masked means per worker (like any DDP mean), not global ones
    stage = StageConfig(batch_size=8, aspect_weight=0.0, pointwise_weight=1.0)
    qb, pb, nb, rel = finetune_batches(model, CatalogSampler(catalog, seed=3).finetune_batch(8))
    batch = FinetuneBatch(qb, pb, nb, rel)
    reference = StageModule("finetune", stage, model)
    torch.save({"stage": stage, "state": reference.state_dict(), "batch": batch}, out / "setup.pt")
    reference.train()
    loss, parts = reference("loss", batch, 0)
    loss.backward()
    mp.spawn(_worker, args=(2, free_port(), str(out)), nprocs=2)
    return {"result": torch.load(out / "result.pt", weights_only=False), "data": data, "reference": reference,
            "parts": parts}


@pytest.mark.parametrize("sizes", [(3, 3), (4, 2)])
def test_gathered_loss_and_grads_equal_single_process(two_workers, sizes):
    data = two_workers["data"]
    torch.manual_seed(0)
    with _float64():
        ref = _Towers()
    loss = InBatchSoftmaxLoss("cosine", 0.1)(ref.q(data["q"]), ref.d(data["p"]), ref.d(data["n"]))
    loss.backward()
    result = two_workers["result"]["toy"][sizes]
    got = result["correct"]
    assert got["loss"] == pytest.approx(float(loss.detach()), rel=1e-5), "mean of worker losses != one process"
    for name, param in ref.named_parameters():
        torch.testing.assert_close(got["grads"][name], param.grad, rtol=1e-5, atol=1e-6,
                                   msg=f"{name}: 2-worker DDP gradient differs from the single-process one")
    if "naive" in result:  # the test tells the PR 3453 bug apart: same loss, wrong document gradients
        assert result["naive"]["loss"] == pytest.approx(float(loss.detach()), rel=1e-5)
        assert not torch.allclose(result["naive"]["grads"]["d.weight"], ref.d.weight.grad, atol=1e-4), \
            "gathering without gradient should give different document-tower gradients"


@pytest.mark.parametrize("chunk", [0, 3])
def test_engine_step_two_workers_equals_single_process(two_workers, chunk):
    """The DDP engine on the real fine-tuning objective (L_SCE gathered + pointwise L_CE), plain and with
    GradCache chunks of 3 rows, gives the gradients of one process on the whole batch of 8."""
    reference = two_workers["reference"]
    got = two_workers["result"]["engine"][chunk]
    expected = {k for k, p in reference.named_parameters() if p.grad is not None}
    assert set(got["grads"]) == expected
    for name, param in reference.named_parameters():
        if param.grad is not None:
            torch.testing.assert_close(got["grads"][name], param.grad, rtol=1e-4, atol=1e-6,
                                       msg=f"gradcache_chunk={chunk}: {name} differs from one process")
    assert got["parts"]["sce"] > two_workers["parts"]["sce"] * 0.5  # local view of the same loss, not zero


def test_deepspeed_zero2_with_gradcache_steps_like_ddp(two_workers):
    """DeepSpeed ZeRO-2 on CPU/gloo (really used: the engine reports stage 2), with GradCache chunks and
    negatives gathered across the 2 workers, takes the same AdamW step as DDP with plain backprop.

    DeepSpeed keeps float32 master weights and all-reduces gradients in float32 whatever the model's dtype
    (its `communication_data_type` defaults to float32 without fp16/bf16), so here the float64 model is
    compared at float32 precision: |w_ds - w_ddp| <= ulp32(w) / 2 + lr x 1e-7 (the update's relative error
    is at most the gradient's, one float32 rounding), measured <= 1.4e-7, well inside rtol 1e-4 / atol 1e-5."""
    updated = two_workers["result"]["engine"]["updated"]
    assert updated["zero_stage"] == {"ddp": 0, "deepspeed": 2}
    ddp, ds = updated["params"]["ddp"], updated["params"]["deepspeed"]
    initial = dict(two_workers["reference"].named_parameters())
    moved = [k for k in ddp if not torch.allclose(ddp[k], initial[k].detach())]
    assert moved, "the DDP step changed nothing"
    for k, param in initial.items():
        # Adam's first step is ~lr * sign(g): compare where the gradient is well above Adam's eps
        grad = param.grad if param.grad is not None else torch.zeros_like(param)
        keep = grad.abs() > 1e-6
        torch.testing.assert_close(ds[k][keep], ddp[k][keep], rtol=1e-4, atol=1e-5,
                                   msg=f"{k}: DeepSpeed step differs from DDP")
        torch.testing.assert_close(ds[k][~keep], ddp[k][~keep], rtol=0, atol=2e-2 * 1.01)  # |update| <= lr


def test_gather_without_process_group_is_identity():
    x = torch.randn(3, 2, requires_grad=True)
    out, offset = gather_with_grad(x)
    assert out is x and offset == 0
    q, p = torch.randn(4, 3), torch.randn(4, 3)
    assert torch.allclose(GatheredInBatchSoftmaxLoss("dot")(q, p), InBatchSoftmaxLoss("dot")(q, p))
