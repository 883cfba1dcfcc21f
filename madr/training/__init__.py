"""Training that every recipe and `pipelines/train` share: the combined objectives, GradCache,
in-batch negatives gathered across workers, the in-process loop and query-tower distillation."""
