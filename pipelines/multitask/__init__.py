"""The multilingual multi-task recipe of paper 004 on Ray: `python -m pipelines.multitask --config <yaml>`.

| module | holds |
|---|---|
| `config` | `PipelineConfig`: the recipe YAML + `real_data:`, `scaling:`, `index:` |
| `records` | madr records <-> rows of the normalised task schemas |
| `data` | data stage: sources -> usable rows per task (Parquet) -> Ray Data -> `TaskMixer` |
| `worker` | the Ray Train worker: `MultiTaskTrainer.train_records` on its mixed shard, DDP over ranks |
| `train` | train stage: `TorchTrainer` over the workers, the trained model exported |
| `distil` | optional distil stage: the serving towers (Sec. V-A) in a Ray task |
| `encode` | encode stage: held-out English candidates -> FAISS shards (`pipelines.encode`) |
| `evaluate` | evaluate stage: held-out metrics + cross-lingual top-1 through the index -> `metrics.json` |
| `run` | the stages as functions over `output_dir`; `run_pipeline`: all of them in order, in one process |
| `stage` | `python -m pipelines.multitask.stage NAME`: one stage, the entry point of the runner's multilingual table |
| `cli` | the command line (the whole recipe in one process) |

`python -m pipelines.jobs pipeline --config configs/multilingual.yaml` runs the same stages through the pipeline
runner (`pipelines.jobs.multilingual`): one process per stage, completion markers, `--address` submission.
"""
