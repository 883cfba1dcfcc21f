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
| `run` | `run_pipeline`: the stages in order |
| `cli` | the command line |
"""
