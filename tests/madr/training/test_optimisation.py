"""The one optimiser step of every training path (`madr.training.loop.Optimisation`, `run_steps`) reproduces the
hand-written AdamW + warm-up schedule + clip-at-1 loop that train_stage, the pqa recipe, distillation, the
multi-task trainer and the Ray engine each used to carry, bit for bit."""

from __future__ import annotations

import pytest
import torch
from transformers import get_cosine_schedule_with_warmup, get_linear_schedule_with_warmup

from madr.config import StageConfig
from madr.training.loop import Optimisation, build_scheduler, run_steps
from madr.training.objectives import LossParts


def _problem():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1))
    x, y = torch.randn(32, 6) * 3, torch.randn(32, 1) * 5  # large enough that clipping bites
    return model, x, y


def _loss(model, x, y, step):
    rows = slice((step * 4) % 32, (step * 4) % 32 + 4)
    return ((model(x[rows]) - y[rows]) ** 2).mean()


def _reference(stage: StageConfig, max_grad_norm: float | None = 1.0) -> list[float]:
    """The loop as it was written in each caller before `Optimisation`."""
    model, x, y = _problem()
    params = list(model.parameters())
    optimizer = torch.optim.AdamW(params, lr=stage.learning_rate, weight_decay=stage.weight_decay)
    scheduler = get_linear_schedule_with_warmup(optimizer, int(stage.warmup_ratio * stage.steps), stage.steps)
    losses = []
    for step in range(stage.steps):
        loss = _loss(model, x, y, step)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        if max_grad_norm:
            torch.nn.utils.clip_grad_norm_(params, max_grad_norm)
        optimizer.step()
        scheduler.step()
        losses.append(float(loss.detach()))
    return losses + [float(p.detach().sum()) for p in params]


def test_run_steps_is_the_hand_written_loop():
    stage = StageConfig(steps=12, learning_rate=0.05, weight_decay=0.01, warmup_ratio=0.25)
    model, x, y = _problem()
    optimisation = Optimisation.for_stage(model.parameters(), stage)
    seen = []
    history = run_steps(optimisation, stage.steps, lambda s: LossParts(v := _loss(model, x, y, s), {"loss": float(v.detach())}),
                        on_step=lambda step, record: seen.append(step))
    ours = [h["loss"] for h in history] + [float(p.detach().sum()) for p in model.parameters()]
    assert ours == _reference(stage), "Optimisation + run_steps must reproduce the old loop exactly"
    assert [h["step"] for h in history] == seen == list(range(1, 13))
    assert optimisation.lr == pytest.approx(0.0), "linear decay ends at 0"


def test_no_schedule_and_no_clipping():
    model, x, y = _problem()
    opt = Optimisation(model.parameters(), 0.05, max_grad_norm=None)
    for step in range(3):
        opt.step(_loss(model, x, y, step))
    ref_model, _, _ = _problem()
    ref = torch.optim.AdamW(ref_model.parameters(), lr=0.05, weight_decay=0.0)
    for step in range(3):
        ref.zero_grad()
        _loss(ref_model, x, y, step).backward()
        ref.step()
    assert all(torch.equal(a, b) for a, b in zip(model.parameters(), ref_model.parameters(), strict=True))
    assert opt.lr == 0.05 and opt.state_dict()["scheduler"] is None


@pytest.mark.parametrize("schedule", ["linear", "cosine", "constant"])
def test_build_scheduler_follows_the_stage(schedule):
    stage = StageConfig(steps=10, learning_rate=1.0, warmup_ratio=0.2, lr_schedule=schedule)
    ours = torch.optim.AdamW([torch.nn.Parameter(torch.zeros(1))], lr=1.0)
    ref = torch.optim.AdamW([torch.nn.Parameter(torch.zeros(1))], lr=1.0)
    sched = build_scheduler(ours, stage)
    expected = {"linear": get_linear_schedule_with_warmup(ref, 2, 10), "cosine": get_cosine_schedule_with_warmup(ref, 2, 10),
                "constant": torch.optim.lr_scheduler.LambdaLR(ref, lambda s: min(1.0, s / 2))}[schedule]
    for _ in range(10):
        assert sched.get_last_lr() == expected.get_last_lr()
        ours.step(), ref.step(), sched.step(), expected.step()
