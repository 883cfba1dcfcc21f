"""The Ray Train worker function of a stage: stream rows, step the engine, validate, checkpoint, report.

Every worker runs `train_loop_per_worker(spec)`. On (re)start it restores the engine (model, optimiser,
schedule) and its data `Position` from `ray.train.get_checkpoint()` when there is one: after a worker is
killed, Ray Train replaces the worker group (`FailureConfig(max_failures)`) and this function resumes at the
last checkpoint's step and data position, with the same per-step seeds (dropout, MLM masking), so the
steps after the checkpoint are recomputed exactly. Reports happen every `log_every` steps, at validation
and at checkpoints, and always on every worker (Ray Train's report is a barrier), each with its process id
and Ray node id (where a multi-node run placed every rank); rank 0 validates (all
ranks under ZeRO-3, whose forward needs every rank). A checkpoint holds the engine state (DDP: rank 0's
`stage_module.safetensors` + optimiser; DeepSpeed: every rank's ZeRO partition, merged by Ray Train), the
data position, and the model in `BiEncoder.save` form under `model/` (what the driver exports).
"""

from __future__ import annotations

import contextlib
import copy
import json
import os
import random
import shutil
import signal
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import ray.train
import torch
from ray.train import Checkpoint

from madr.config import EvalConfig, ExperimentConfig, StageConfig, from_dict
from madr.data.schema import Catalog
from madr.modeling.model import BiEncoder
from madr.recipes.aspects.evaluation import aspect_accuracy, evaluate_model
from madr.training.distill import attach_query_student, make_student, student_teacher_distance
from madr.training.distributed import mean_over_ranks
from madr.training.freezing import freeze_stage
from madr.training.memoised_backbone import memo_stats, memoise_backbones
from madr.training.objectives import pretrain_loss
from madr.training.stage_module import StageModule, step_seed
from pipelines.train.config import distributed_config
from pipelines.train.data import Position, RowStream
from pipelines.train.engine import Engine, make_engine
from pipelines.train.examples import decode_batch, holdout_products

PROGRESS_FILE = "progress.json"
MODEL_DIR = "model"


@dataclass
class JobSpec:
    """What the driver sends every worker (plain data: it travels as `train_loop_config`)."""

    experiment: dict[str, Any]
    kind: str
    catalog_dir: str
    init_model: str | None = None
    teacher: str | None = None
    drill_flag: str = ""
    val_cap: int = 128

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def validation_split(catalog: Catalog) -> str:
    return "dev" if catalog.queries_in("dev") else "test"


def validation_catalog(catalog: Catalog, split: str, size: int, seed: int) -> Catalog:
    """`catalog` with its products cut to `size`: the `split` queries' judged products plus a seeded sample of the
    others (0, or a catalog that small already: unchanged). When the judged products alone exceed `size`, a seeded
    sample of the `split` queries is kept whose judged products fill half of it, the other half sampled from the
    rest, so that the search is over a corpus with distractors and costs the same on any catalog."""
    if size <= 0 or len(catalog.products) <= size:
        return catalog
    rng = random.Random(seed)
    qrels = catalog.qrels(split)
    queries = catalog.queries
    judged = {pid for docs in qrels.values() for pid in docs}
    if len(judged) > size:
        kept_ids, judged = _queries_filling(qrels, size // 2, rng)
        queries = [q for q in catalog.queries if q.split != split or q.query_id in kept_ids]
    others = [p.product_id for p in catalog.products if p.product_id not in judged]
    keep = judged | set(rng.sample(others, max(0, min(len(others), size - len(judged)))))
    ids = {q.query_id for q in queries}
    return Catalog([p for p in catalog.products if p.product_id in keep], queries,
                   [j for j in catalog.judgments if j.product_id in keep and j.query_id in ids], catalog.aspect_names)


def _queries_filling(qrels: dict[str, dict[str, int]], budget: int, rng: random.Random) -> tuple[set[str], set[str]]:
    """(query ids, their judged products): queries taken in a seeded order while their judged products fit in
    `budget` (the first query always)."""
    order = sorted(qrels)
    rng.shuffle(order)
    kept: set[str] = set()
    judged: set[str] = set()
    for qid in order:
        union = judged | set(qrels[qid])
        if kept and len(union) > budget:
            continue
        kept.add(qid)
        judged = union
    return kept, judged


class Validator:
    """Validation metrics of a stage (prefixed `val_`), on held-out data of the catalog.

    pretrain: Eq. 7 / Eq. 9 loss (lower is better) on dev queries and held-out products, fixed masking,
    + aspect Accuracy@1; finetune: retrieval / ranking metrics on the dev split (`madr.recipes.aspects.evaluation`);
    distill: mean L2 distance between the student's and the teacher's dev query embeddings.
    """

    def __init__(self, kind: str, cfg: ExperimentConfig, stage: StageConfig, catalog_dir: str,
                 model: BiEncoder, cap: int = 128) -> None:
        self.kind, self.cfg, self.stage, self.model = kind, cfg, stage, model
        self.catalog = Catalog.read(catalog_dir, aspect_names=cfg.model.aspects)
        self.split = validation_split(self.catalog)
        self.queries = self.catalog.queries_in(self.split)[:cap]
        held = holdout_products(self.catalog, cfg.train.seed)
        self.products = [p for p in self.catalog.products if p.product_id in held][:cap]
        if kind == "finetune":
            self.catalog = validation_catalog(self.catalog, self.split, distributed_config(cfg).val_corpus,
                                              cfg.train.seed)

    @torch.no_grad()
    def __call__(self, module: StageModule) -> dict[str, float]:
        was = module.training
        module.eval()
        try:
            if self.kind == "pretrain":
                out = self._pretrain(module.model)
            elif self.kind == "finetune":
                ev = EvalConfig(**{**asdict(self.cfg.eval), "split": self.split})
                out = evaluate_model(module.model, self.catalog, ev)
            else:
                texts = [q.text for q in self.queries]
                out = {"distance": student_teacher_distance(module.teacher, module.student, texts,
                                                            lambda t: self.model.tokenize(t, "query"))}
        finally:
            module.train(was)
        return {f"val_{k}": float(v) for k, v in out.items()}

    def _pretrain(self, model: BiEncoder) -> dict[str, float]:
        from madr.modeling.batching import make_batch

        qb = make_batch(model, [q.text for q in self.queries], "query", [q.aspects for q in self.queries])
        texts = [self.catalog.product_text(p) for p in self.products]
        db = make_batch(model, texts, "doc", [p.aspects for p in self.products])
        loss = pretrain_loss(model, qb, db, self.stage, torch.Generator().manual_seed(self.cfg.train.seed))
        out = {k: v for k, v in loss.parts.items()}
        out.update(aspect_accuracy(model, self.catalog, texts, [p.aspects for p in self.products], "doc"))
        out.update(aspect_accuracy(model, self.catalog, [q.text for q in self.queries],
                                   [q.aspects for q in self.queries], "query"))
        return out


def build_module(spec: JobSpec, cfg: ExperimentConfig, stage: StageConfig) -> tuple[StageModule, BiEncoder,
                                                                                      BiEncoder | None]:
    """(stage module, the bi-encoder that tokenises batches, the distillation teacher or None)."""
    gather = distributed_config(cfg).gather_negatives
    if spec.kind == "distill":
        teacher = BiEncoder.load(spec.teacher)
        student = make_student(teacher, num_layers=cfg.train.distill.student_layers)
        return StageModule("distill", stage, student=student, teacher=teacher.query_tower), teacher, teacher
    model = BiEncoder.load(spec.init_model)
    freeze_stage(model, stage)  # before DDP / DeepSpeed see it
    if stage.memoise_backbone:  # the worker's model serves this stage only: its frozen backbone memoised for good
        memoise_backbones(model)
    return StageModule(spec.kind, stage, model, gather=gather), model, None


def export_model(module: StageModule, kind: str, teacher: BiEncoder | None, path: Path, rank: int,
                 zero_stage: int) -> None:
    """Rank 0 writes the stage's model with `BiEncoder.save` (fp32, CPU; ZeRO-3 parameters gathered first).
    A distilled model serves queries with the student and documents with the teacher's document tower."""
    gathered: Any = contextlib.nullcontext()
    if zero_stage == 3:
        import deepspeed

        gathered = deepspeed.zero.GatheredParameters(list(module.parameters()), modifier_rank=None)
    with gathered:
        if rank != 0:
            return
        model = module.model if kind != "distill" else attach_query_student(teacher, module.student)
        if any(p.dtype != torch.float32 or p.device.type != "cpu" for p in model.parameters()):
            model = copy.deepcopy(model).float().cpu()
        model.save(path)


def save_checkpoint(engine: Engine, spec: JobSpec, teacher: BiEncoder | None, pos: Position,
                    rank: int) -> tuple[Checkpoint | None, Path]:
    tmp = Path(tempfile.mkdtemp(prefix="madr-ckpt-"))
    engine.save(tmp, rank)
    export_model(engine.module, spec.kind, teacher, tmp / MODEL_DIR, rank, engine.zero_stage)
    if rank == 0:
        (tmp / PROGRESS_FILE).write_text(json.dumps(pos.to_dict()))
    return (Checkpoint.from_directory(str(tmp)) if any(tmp.iterdir()) else None), tmp


def restore(engine: Engine) -> Position | None:
    """Engine state and data position from Ray Train's latest checkpoint (None on a fresh start)."""
    ckpt = ray.train.get_checkpoint()
    if ckpt is None:
        return None
    with ckpt.as_directory() as d:
        engine.load(Path(d))
        pos = Position(**json.loads((Path(d) / PROGRESS_FILE).read_text()))
    pos.resumes += 1
    return pos


def _report_end(engine: Engine, module: StageModule, spec: JobSpec, teacher: BiEncoder | None, pos: Position,
                rank: int, base: dict[str, Any], validator: Validator | None) -> None:
    """Report a restored finished run's last step again, with its validation and a checkpoint of its model, so
    that the driver exports the model and writes the stage's history from this report: a rerun after the stage's
    output was deleted (but not its Ray Train run) gives the model back without training again."""
    metrics = {**base, **pos.to_dict(), **(validator(module) if validator else {})}
    checkpoint, tmp = save_checkpoint(engine, spec, teacher, pos, rank)
    ray.train.report(metrics, checkpoint=checkpoint)
    shutil.rmtree(tmp, ignore_errors=True)


def maybe_fail(spec: JobSpec, cfg: ExperimentConfig, rank: int, step: int) -> None:
    """Failure drill: `distributed.fail_rank` SIGKILLs itself once, after reporting `fail_at_step`."""
    d = distributed_config(cfg)
    if d.fail_at_step != step or rank != d.fail_rank or not spec.drill_flag:
        return
    flag = Path(spec.drill_flag)
    if flag.exists():
        return
    flag.parent.mkdir(parents=True, exist_ok=True)
    flag.write_text(json.dumps({"step": step, "rank": rank, "pid": os.getpid(), "time": time.time()}))
    # let the controller collect this step's report from every worker first (it polls every interval)
    time.sleep(3 * float(os.environ.get("RAY_TRAIN_HEALTH_CHECK_INTERVAL_S", 2.0)) + 1.0)
    os.kill(os.getpid(), signal.SIGKILL)


def _due(step: int, every: int) -> bool:
    return every > 0 and step % every == 0


def train_loop_per_worker(config: dict[str, Any]) -> None:
    """Ray Train entry point (see the module docstring)."""
    spec = JobSpec(**config)
    cfg: ExperimentConfig = from_dict(ExperimentConfig, spec.experiment)
    stage: StageConfig = getattr(cfg.train, spec.kind)
    d = distributed_config(cfg)
    ctx = ray.train.get_context()
    rank, world = ctx.get_world_rank(), ctx.get_world_size()
    torch.set_num_threads(d.torch_threads or max(1, int(d.cpus_per_worker)))
    if stage.batch_size % world:
        raise ValueError(f"train.{spec.kind}.batch_size={stage.batch_size} is not divisible by the "
                         f"{world} workers (distributed.num_workers)")
    local = stage.batch_size // world
    device = ray.train.torch.get_device() if d.use_gpu else torch.device("cpu")
    torch.manual_seed(cfg.train.seed)
    module, tok_model, teacher = build_module(spec, cfg, stage)
    engine = make_engine(d, module, stage, device, local)
    pos = restore(engine)
    resumed = pos is not None
    pos = pos or Position()
    validator = (Validator(spec.kind, cfg, stage, spec.catalog_dir, tok_model, spec.val_cap)
                 if rank == 0 or engine.zero_stage == 3 else None)
    stream = RowStream(ray.train.get_dataset_shard("train"), local, pos, d.shuffle_buffer, cfg.train.seed)
    base = {"kind": spec.kind, "backend": engine.backend, "zero_stage": engine.zero_stage, "world_size": world,
            "rank": rank, "pid": os.getpid(), "node": ray.get_runtime_context().get_node_id()}
    if pos.step == 0:
        ray.train.report({**base, **pos.to_dict(), **(validator(module) if validator else {})})
    elif pos.step >= stage.steps:  # a finished run restored (its stage directory deleted since): report its end again
        _report_end(engine, module, spec, teacher, pos, rank, {**base, "resumed": True}, validator)
    clock, rows = time.perf_counter(), 0
    while pos.step < stage.steps:
        step = pos.step
        micro = [stream.next() for _ in range(stage.grad_accum)]
        batches = [decode_batch(spec.kind, r, tok_model, seed=step_seed(cfg.train.seed, rank, step, m))
                   for m, r in enumerate(micro)]
        parts = engine.train_step(batches, step, seed_fn=lambda m, s=step: step_seed(cfg.train.seed, rank, s, m))
        pos.step = step + 1
        rows += sum(len(r["row_id"]) for r in micro)
        last = pos.step == stage.steps
        do_val = last or _due(pos.step, stage.validate_every)
        do_ckpt = last or _due(pos.step, stage.checkpoint_every)
        if not (do_val or do_ckpt or _due(pos.step, max(stage.log_every, 1))):
            continue
        seconds = time.perf_counter() - clock
        metrics = {**base, **mean_over_ranks(parts), **pos.to_dict(), "data_crc": stream.take_crc(),
                   "pairs_per_s": rows * world / max(seconds, 1e-9), "resumed": resumed, **memo_stats(tok_model)}
        if do_val and validator is not None:
            metrics.update(validator(module))
        checkpoint, tmp = save_checkpoint(engine, spec, teacher, pos, rank) if do_ckpt else (None, None)
        ray.train.report(metrics, checkpoint=checkpoint)
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)
        maybe_fail(spec, cfg, rank, pos.step)
        resumed, clock, rows = False, time.perf_counter(), 0
