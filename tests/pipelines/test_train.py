"""Ray Train jobs on a local Ray with 2 CPU workers (pipelines.train): fits chained through one output
directory (pretrain -> fine-tune from its export -> a distillation), and a heads-only pretraining of its own,
each checking several things at once because a fit costs 15-25 s here.

1. pretrain, DDP/gloo, gradient accumulation 2: completes, validation loss falls, keep-last-2 checkpoints,
   TensorBoard events + history + PNG, exported model loads and encodes.
2. fine-tune, DDP/gloo, GradCache chunks, a worker SIGKILLed after step 12: the group is replaced, training
   resumes from the step-8 checkpoint, re-runs steps 9-12 on the same rows (same row-id CRC and data
   position per worker, same loss) and ends at step 24 with better validation retrieval metrics.
3. heads-only pretraining on memoised backbone states: the backbone stays, the heads train, the export is whole.
4. distil, DeepSpeed ZeRO-2 on CPU/gloo: the engine reports ZeRO stage 2; a 1-layer student gets closer to
   a 2-layer teacher; the exported model serves queries with the student, documents with the teacher.
"""

from __future__ import annotations

import json
import shutil
import struct
from pathlib import Path

import pytest
import torch

from madr.config import load_config
from madr.modeling.model import BiEncoder

pytestmark = [pytest.mark.ray, pytest.mark.slow]

CONFIG = Path(__file__).resolve().parents[2] / "configs" / "train_tiny.yaml"
TINY = {"hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 2, "intermediate_size": 64,
        "max_position_embeddings": 64}


@pytest.fixture(scope="module", autouse=True)
def fast_failure_detection(fast_train_health_check):
    """Every fit here polls its workers every 0.2 s (conftest), so the killed worker is noticed fast."""


@pytest.fixture(scope="module")
def out_dir(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("train_job")


def _config(out: Path, **overrides):
    base = {"name": "t", "output_dir": str(out), "data.synthetic_products": 400, "data.synthetic_queries": 200,
            "model.backbone.tiny": TINY, "model.projection_dim": 16, "model.max_query_length": 16,
            "model.max_doc_length": 48, "distributed.cpus_per_worker": 0.5, "distributed.num_workers": 2,
            "distributed.keep_last": 2, "distributed.shuffle_buffer": 64}
    return load_config(CONFIG, {**base, **overrides})


def _history(log_dir: str, all: bool = False) -> list[dict]:
    from pipelines.train.metrics import read_history

    return read_history(log_dir, all=all)


def _tensorboard_scalars(log_dir: str) -> dict[str, list[tuple[int, float]]]:
    """Scalars of the TFRecord event files, parsed with the TensorBoard protobuf (what TensorBoard reads)."""
    from tensorboardX.proto import event_pb2

    out: dict[str, list[tuple[int, float]]] = {}
    for path in Path(log_dir).glob("events.out.tfevents.*"):
        data, i = path.read_bytes(), 0
        while i < len(data):
            (n,) = struct.unpack("<Q", data[i: i + 8])
            event = event_pb2.Event.FromString(data[i + 12: i + 12 + n])
            i += 12 + n + 4
            for v in event.summary.value:
                out.setdefault(v.tag, []).append((event.step, v.simple_value))
    return out


def _checkpoints(cfg, kind: str) -> list[Path]:
    from pipelines.train.job import default_run_name

    root = Path(cfg.output_dir) / "ray_results" / default_run_name(cfg, kind)
    return sorted(p for p in root.iterdir() if p.is_dir() and p.name.startswith("checkpoint_"))


def test_pretrain_job(ray_local, out_dir):
    from pipelines.train.job import run_stage

    cfg = _config(out_dir, **{"train.pretrain.steps": 10, "train.pretrain.batch_size": 16,
                              "train.pretrain.grad_accum": 2, "train.pretrain.log_every": 2,
                              "train.pretrain.validate_every": 0, "train.pretrain.checkpoint_every": 4,
                              "train.pretrain.freeze_params": ["aen.w_v"]})
    result = run_stage(cfg, "pretrain")

    rows = _history(result.log_dir)
    assert [r["step"] for r in rows] == [0, 2, 4, 6, 8, 10]
    first, last = rows[0], rows[-1]
    assert (last["backend"], last["world_size"], last["zero_stage"]) == ("ddp", 2, 0)
    assert last["val_loss"] < first["val_loss"], f"validation loss did not fall: {first['val_loss']} -> {last['val_loss']}"
    # 10 steps x 2 micro-batches x 8 rows per worker, same data position on both workers
    assert last["rows/rank0"] == last["rows/rank1"] == 160
    assert last["data_crc/rank0"] != last["data_crc/rank1"], "both workers read the same rows"
    assert last["lr"] == pytest.approx(0.0, abs=1e-9) and max(r.get("lr", 0) for r in rows) > 0  # warm-up, decay

    assert len(_checkpoints(cfg, "pretrain")) == 2, "CheckpointConfig(num_to_keep=2) not applied"
    scalars = _tensorboard_scalars(result.log_dir)
    assert {"loss", "val_loss", "lr", "pairs_per_s"} <= set(scalars)
    assert [s for s, _ in scalars["loss"]] == [2, 4, 6, 8, 10]
    png = Path(result.plot).read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 10_000

    model = BiEncoder.load(result.model_dir)
    start = BiEncoder.load(Path(cfg.output_dir) / "pretrain" / "init_model").state_dict()
    kept = {k for k in start if "aen.w_v" in k}
    assert kept and all(torch.equal(model.state_dict()[k], start[k]) for k in kept), \
        "freeze_params [aen.w_v] did not hold in Ray Train"
    assert any(not torch.equal(model.state_dict()[k], start[k]) for k in start if "aen.w_q" in k)
    emb = model.encode_texts(["red running shoes", "walnut desk"], "query")
    assert emb.shape == (2, 16) and torch.isfinite(emb).all()

    # the stage's output deleted but not its Ray Train run: a rerun restores the finished run and exports its model
    # again without training (one report of its last step, with validation), the curves plotted from that report
    trained = model.state_dict()
    shutil.rmtree(Path(cfg.output_dir) / "pretrain")
    again = run_stage(cfg, "pretrain")
    assert [(r["step"], r["resumed"]) for r in _history(again.log_dir, all=True)] == [(10, True)]
    assert "val_loss" in _history(again.log_dir)[0] and Path(again.plot).is_file()
    restored = BiEncoder.load(again.model_dir).state_dict()
    assert all(torch.equal(restored[k], trained[k]) for k in trained)


def test_a_heads_only_pretraining_runs_on_memoised_states(ray_local, tmp_path):
    """`freeze_backbone` + `memoise_backbone` on Ray Train (DDP, 2 workers): each worker's frozen backbone runs
    once per distinct text (the reports count the visits read from memory), the heads train, the backbone stays,
    and the export has the model's own weights and keys."""
    from pipelines.train.job import run_stage

    cfg = _config(tmp_path, **{"train.pretrain.steps": 30, "train.pretrain.batch_size": 16,
                               "train.pretrain.log_every": 10, "train.pretrain.validate_every": 0,
                               "train.pretrain.mlm_weight": 0.0, "train.pretrain.freeze_backbone": True,
                               "train.pretrain.memoise_backbone": True, "data.synthetic_queries": 60,
                               "data.synthetic_products": 120})
    result = run_stage(cfg, "pretrain")
    last = _history(result.log_dir)[-1]
    assert last["step"] == 30 and last["memo_misses"] > 0 and last["memo_hits"] > 0 and last["memo_gib"] > 0
    start = BiEncoder.load(Path(cfg.output_dir) / "pretrain" / "init_model").state_dict()
    trained = BiEncoder.load(result.model_dir).state_dict()
    assert list(trained) == list(start)
    backbone = [k for k in start if ".backbone." in k]
    assert backbone and all(torch.equal(trained[k], start[k]) for k in backbone)
    assert any(not torch.equal(trained[k], start[k]) for k in start if "aen." in k), "no head trained"


def test_finetune_job_survives_a_killed_worker(ray_local, out_dir):
    from pipelines.train.job import run_stage

    cfg = _config(out_dir, **{"train.finetune.steps": 24, "train.finetune.batch_size": 16,
                              "train.finetune.learning_rate": 1e-3, "train.finetune.gradcache_chunk": 4,
                              "train.finetune.log_every": 4, "train.finetune.validate_every": 0,
                              "train.finetune.checkpoint_every": 8, "distributed.fail_at_step": 12,
                              "distributed.fail_rank": 1, "distributed.max_failures": 1,
                              "train.finetune.freeze_word_embeddings": True, "train.finetune.freeze_layers": 1})
    result = run_stage(cfg, "finetune")
    drill = json.loads((Path(cfg.output_dir) / "finetune" / "failure_drill.done").read_text())
    assert (drill["step"], drill["rank"]) == (12, 1)

    every = _history(result.log_dir, all=True)
    assert [r["step"] for r in every] == [0, 4, 8, 12, 12, 16, 20, 24], "expected a restart from step 8 after 12"
    before, after = every[3], every[4]
    assert after["resumed"] and after["resumes/rank0"] == after["resumes/rank1"] == 1
    for rank in (0, 1):
        assert after[f"pid/rank{rank}"] != before[f"pid/rank{rank}"], f"worker {rank} was not replaced"
        for key in ("data_crc", "epoch", "batch", "rows"):
            assert after[f"{key}/rank{rank}"] == before[f"{key}/rank{rank}"], \
                f"rank {rank} {key} after the resume differs: the data position was not restored"
    assert after["loss"] == pytest.approx(before["loss"], rel=1e-4), "steps 9-12 did not replay exactly"
    final, start = every[-1], every[0]
    assert final["step"] == 24 and final["rows/rank0"] == 24 * 8
    assert final["val_recall@10"] > start["val_recall@10"] and final["val_rerank_auc"] > start["val_rerank_auc"], \
        f"fine-tuning did not improve validation: {start} -> {final}"
    assert result.metrics["step"] == 24
    pretrained = Path(cfg.output_dir) / "pretrain" / "model"  # the stage starts from it when the pretrain test ran
    start_dir = pretrained if (pretrained / "config.json").is_file() else Path(cfg.output_dir) / "finetune" / "init_model"
    start_model = BiEncoder.load(start_dir).state_dict()
    trained = BiEncoder.load(result.model_dir).state_dict()
    frozen = [k for k in trained if ".backbone.embeddings." in k or ".backbone.encoder.layer.0." in k]
    moved = [k for k in trained if ".backbone.encoder.layer.1." in k]
    assert frozen and moved
    assert all(torch.equal(trained[k], start_model[k]) for k in frozen), "freeze_layers: 1 did not hold in Ray Train"
    assert any(not torch.equal(trained[k], start_model[k]) for k in moved), "the unfrozen layer did not train"


def _teacher(out_dir: Path) -> Path:
    """A 2-layer teacher whose upper layer matters (its feed-forward weights redrawn with a large scale), so
    a student made of the lower layer starts far from it; a barely trained tiny model would not do that."""
    from madr.data.synthetic.catalog import generate_catalog
    from madr.modeling.model import build_model
    from madr.recipes.aspects.experiment import prepare_tokenizer, prepare_vocabularies

    cfg = _config(out_dir)
    catalog = generate_catalog(400, 200, seed=0)
    tok = prepare_tokenizer(cfg, catalog)
    torch.manual_seed(0)
    model = build_model(cfg.model, tok, prepare_vocabularies(cfg, catalog, tok))
    layer = model.query_tower.backbone.encoder.layer[1]
    with torch.no_grad():
        for linear in (layer.intermediate.dense, layer.output.dense):
            linear.weight.normal_(0, 0.5)
    return model.save(Path(out_dir) / "teacher")


def test_distill_job_with_deepspeed_zero2(ray_local, out_dir):
    from pipelines.train.job import run_stage

    cfg = _config(out_dir, **{"train.distill.steps": 10, "train.distill.batch_size": 16,
                              "train.distill.learning_rate": 1e-3, "train.distill.student_layers": 1,
                              "train.distill.teacher": str(_teacher(out_dir)),
                              "train.distill.log_every": 5, "train.distill.checkpoint_every": 5,
                              "distributed.backend": "deepspeed", "distributed.zero_stage": 2})
    result = run_stage(cfg, "distill")
    rows = _history(result.log_dir)
    first, last = rows[0], rows[-1]
    assert (last["backend"], last["zero_stage"], last["step"]) == ("deepspeed", 2, 10)
    assert last["val_distance"] < 0.7 * first["val_distance"], \
        f"the student did not get closer to the teacher: {first['val_distance']} -> {last['val_distance']}"
    served = BiEncoder.load(result.model_dir)
    assert served.query_tower.backbone.config.num_hidden_layers == 1
    assert served.doc_tower.backbone.config.num_hidden_layers == 2
    assert served.encode_texts(["oak table"], "query").shape == (1, 16)


def test_run_name_follows_the_stage_config():
    """A changed training config must not resume a finished run of the old one; a rerun of the same does."""
    from madr.config import load_config
    from pipelines.train.job import default_run_name

    cfg = load_config("configs/train_tiny.yaml")
    name = default_run_name(cfg, "finetune")
    assert name.startswith("train_tiny-finetune-") and default_run_name(cfg, "finetune") == name
    cfg.distributed["num_workers"] = 1  # scaling knobs are not part of what was trained
    assert default_run_name(cfg, "finetune") == name
    cfg.train.finetune.learning_rate *= 2
    assert default_run_name(cfg, "finetune") != name


def test_distributed_section_is_checked_by_the_train_job():
    """`distributed:` is Ray-only: madr.config carries it as a mapping, checked against
    `madr.distributed_config.DistributedConfig` when the experiment loads, and the train job reads it with
    `distributed_config`: defaults for missing keys, unknown keys and bad values are errors naming their dotted path."""
    from madr.config import load_config
    from madr.distributed_config import DistributedConfig
    from pipelines.train.config import distributed_config

    assert distributed_config(load_config(None)) == DistributedConfig()
    d = distributed_config(load_config("configs/train_tiny.yaml", {"distributed.backend": "deepspeed"}))
    assert d.backend == d.resolved_backend == "deepspeed" and isinstance(d, DistributedConfig)
    with pytest.raises(ValueError, match=r"distributed\.num_workerz"):
        distributed_config(load_config(None, {"distributed.num_workerz": 2}))
    with pytest.raises(ValueError, match="distributed.backend"):
        distributed_config(load_config(None, {"distributed.backend": "horovod"}))
    with pytest.raises(ValueError, match=r"distributed\.placement_strategy: 'SPRED'"):
        distributed_config(load_config(None, {"distributed.placement_strategy": "SPRED"}))
    with pytest.raises(ValueError, match="distributed.fail_rank"):
        distributed_config(load_config(None, {"distributed.num_workers": 1, "distributed.fail_rank": 1,
                                              "distributed.fail_at_step": 2}))
    # no failure drill: one worker is a valid run whatever fail_rank's default (it used to be refused)
    assert distributed_config(load_config(None, {"distributed.num_workers": 1})).num_workers == 1


def test_finetune_rows_follow_a_new_mining_round(tmp_path):
    """With `negatives: index` the fine-tuning rows' fingerprint holds the mine stage's file content: a new mining
    round writes new rows; the other sources keep their old fingerprint (no re-write of existing runs)."""
    from madr.config import ExperimentConfig
    from madr.layout import RunLayout
    from pipelines.train.job import _negatives_key

    cfg = ExperimentConfig(output_dir=str(tmp_path))
    assert _negatives_key(cfg) == ["judged", 30]
    cfg.train.finetune.negatives = "index"
    path = RunLayout.of(cfg).negatives
    path.parent.mkdir(parents=True)
    path.write_bytes(b"round 1")
    first = _negatives_key(cfg)
    path.write_bytes(b"round 2")
    assert first != _negatives_key(cfg) and first[:2] == ["index", 30]


def test_finetune_validation_searches_a_capped_corpus_with_every_judged_product():
    """`distributed.val_corpus`: the dev queries' judged products plus a seeded sample, that many in all."""
    from madr.data.synthetic.catalog import generate_catalog
    from pipelines.train.loop import validation_catalog

    catalog = generate_catalog(400, 200, seed=0)
    small = validation_catalog(catalog, "dev", 330, seed=0)
    judged = {pid for docs in catalog.qrels("dev").values() for pid in docs}
    kept = {p.product_id for p in small.products}
    assert len(kept) == 330 and judged <= kept and len(judged) < 330
    assert small.qrels("dev") == catalog.qrels("dev") and small.queries == catalog.queries
    assert kept == {p.product_id for p in validation_catalog(catalog, "dev", 330, seed=0).products}
    assert validation_catalog(catalog, "dev", 0, seed=0) is catalog


def test_finetune_validation_samples_dev_queries_when_their_judged_products_exceed_the_corpus():
    """Judged products over `distributed.val_corpus`: a seeded sample of dev queries with every judged product of
    theirs, half the corpus, and distractors for the rest; the other splits' queries are untouched."""
    from madr.data.synthetic.catalog import generate_catalog
    from pipelines.train.loop import validation_catalog

    catalog = generate_catalog(400, 200, seed=0)
    judged = {pid for docs in catalog.qrels("dev").values() for pid in docs}
    size = len(judged) // 2
    small = validation_catalog(catalog, "dev", size, seed=0)
    kept = {p.product_id for p in small.products}
    dev = small.qrels("dev")
    assert len(kept) == size and 0 < len(dev) < len(catalog.qrels("dev"))
    assert all(docs == catalog.qrels("dev")[qid] for qid, docs in dev.items())
    sampled = {pid for docs in dev.values() for pid in docs}
    assert len(sampled) <= size // 2 and sampled <= kept and len(kept - sampled) >= size - size // 2
    assert small.queries_in("train") == catalog.queries_in("train")
    again = validation_catalog(catalog, "dev", size, seed=0)
    assert again.qrels("dev") == dev and validation_catalog(catalog, "dev", size, seed=1).qrels("dev") != dev
