"""Distributed training on Ray Train: pretrain, fine-tune and distil stages that survive worker failures.

| module | holds |
|---|---|
| `config` | `DistributedConfig`: the experiment's `distributed:` section (workers, backend, storage, runtime env) |
| `engine` | `DDPEngine` / `DeepSpeedEngine` over `madr.training.stage_module.StageModule`: accumulation, GradCache, clipping, warm-up + decay, save/load |
| `examples` | a stage's training rows from a catalog, as Parquet; batch decoding in the worker |
| `data` | deterministic streaming split + `RowStream` (resumable data position) |
| `loop` | `train_loop_per_worker`: resume, stream, step, validate, checkpoint, report, failure drill |
| `metrics` | controller-side history + TensorBoard callback, curves PNG |
| `job` | driver: prepare, `TorchTrainer.fit`, export, plot; `ray job submit` command |

Entry point: `python -m pipelines.train --config configs/train_tiny.yaml --stage pretrain`.
"""
