"""benchmarks.speed.distil_step: seconds per distillation step, live teacher vs cached targets (tiny model)."""

import math

import torch

from benchmarks.speed.distil_step import seconds_per_step
from madr.config import BackboneConfig, ModelConfig
from madr.modeling.model import BiEncoder
from madr.modeling.tokenization import train_wordpiece_tokenizer
from madr.training.teacher_targets import cache_teacher_targets

TINY = {
    "hidden_size": 32,
    "num_hidden_layers": 12,
    "num_attention_heads": 2,
    "intermediate_size": 64,
    "max_position_embeddings": 32,
}
TEXTS = [
    f"{c} {i} {n}" for c in ("red", "blue", "green", "dark") for i in ("shoes", "lamp", "chair") for n in "ab"
]


def test_both_variants_run_and_time():
    tok = train_wordpiece_tokenizer(TEXTS, vocab_size=80)
    torch.manual_seed(0)
    cfg = ModelConfig(
        name="bibert",
        backbone=BackboneConfig(tiny=TINY),
        max_query_length=8,
        max_doc_length=8,
        pooling="mean",
    )
    teacher = BiEncoder(cfg, tok).eval()
    live = seconds_per_step(teacher, TEXTS, steps=2, warmup=1, batch=8)
    targets = cache_teacher_targets(teacher.query_tower, TEXTS, lambda b: teacher.tokenize(b, "query"))
    cached = seconds_per_step(teacher, TEXTS, steps=2, warmup=1, batch=8, targets=targets)
    # a difference of two timed runs: finite, its sign is left to the machine's noise at this tiny size
    assert math.isfinite(live) and math.isfinite(cached), (live, cached)
