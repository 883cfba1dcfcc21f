"""Training that every recipe and `pipelines/train` share: the combined objectives, the stage module that
holds a model and its stage's losses (`stage_module.StageModule`: what the in-process loop steps and what DDP /
DeepSpeed wrap on Ray Train), GradCache, in-batch negatives gathered across workers, the in-process loop and
query-tower distillation."""
