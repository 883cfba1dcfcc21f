"""GradCache (madr.training.gradcache) gives the gradients of plain backprop through the stage objective."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from madr.config import ModelConfig, StageConfig
from madr.modeling.model import build_model
from madr.training.gradcache import RandContext, chunk_slices, gradcache_step, take_rows
from madr.training.loop import CatalogSampler, finetune_batches
from madr.training.stage_module import FinetuneBatch, StageModule
from pipelines.train.engine import DDPEngine

TINY = {"hidden_size": 32, "num_hidden_layers": 1, "num_attention_heads": 2, "intermediate_size": 64,
        "max_position_embeddings": 64}
NO_DROPOUT = {**TINY, "hidden_dropout_prob": 0, "attention_probs_dropout_prob": 0}


def _model(catalog, tokenizer, vocabularies, name: str = "madral", tiny: dict = NO_DROPOUT):
    """`name` "madral+sparse": MADRAL with a lean sparse head (`model.sparse_head`)."""
    base, _, sparse = name.partition("+")
    cfg = ModelConfig(name=base, aspects=catalog.aspect_names, projection_dim=None if base == "hybrid" else 16,
                      max_query_length=16, max_doc_length=32, sparse_top_k=64, sparse_head=bool(sparse))
    cfg.backbone.tiny = dict(tiny)
    torch.manual_seed(0)
    return build_model(cfg, tokenizer, vocabularies)


def _batch(model, catalog, n: int = 10) -> FinetuneBatch:
    qb, pb, nb, rel = finetune_batches(model, CatalogSampler(catalog, seed=5).finetune_batch(n))
    return FinetuneBatch(qb, pb, nb, rel)


def test_chunk_slices_cover_rows_once():
    assert chunk_slices(10, 4) == [slice(0, 4), slice(4, 8), slice(8, 10)]
    assert chunk_slices(3, 0) == [slice(0, 3)] and chunk_slices(3, 8) == [slice(0, 3)]


@pytest.mark.parametrize("name", ["madral", "hybrid", "madral+sparse"])
def test_gradcache_gradients_equal_plain_backprop(catalog, tokenizer, vocabularies, name):
    """Chunks of 3 rows of a 10-row batch (uneven last chunk): L_SCE + pointwise L_CE + aspect losses
    (MADRAL) or dense + sparse + FLOPS (hybrid, paper 002) give the plain-backprop gradients."""
    model = _model(catalog, tokenizer, vocabularies, name)
    stage = StageConfig(batch_size=10, aspect_weight=0.5, pointwise_weight=1.0, flops_query_weight=0.01,
                        flops_doc_weight=0.01)
    batch = _batch(model, catalog)
    grads = {}
    for chunk in (0, 3):
        torch.manual_seed(0)
        module = StageModule("finetune", dataclasses.replace(stage, gradcache_chunk=chunk),
                             _model(catalog, tokenizer, vocabularies, name))
        engine = DDPEngine(module, module.stage, torch.device("cpu"))
        parts = engine.accumulate([batch], step=0)
        grads[chunk] = ({k: p.grad.clone() for k, p in module.named_parameters() if p.grad is not None}, parts)
    plain, gc = grads[0], grads[3]
    assert set(plain[0]) == set(gc[0]) and plain[0], "GradCache touched different parameters"
    for k, g in plain[0].items():
        torch.testing.assert_close(gc[0][k], g, rtol=1e-4, atol=max(1e-6, 5e-4 * float(g.abs().max())),  # float32 sum order
                                   msg=f"{name}: {k} differs under GradCache")
    assert gc[1]["loss"] == pytest.approx(plain[1]["loss"], rel=1e-4), "GradCache reports a different loss"


def test_gradcache_replays_dropout(catalog, tokenizer, vocabularies):
    """With dropout on, two encodings of a chunk differ unless its RNG state is replayed (RandContext), and
    GradCache's pass 3 sees exactly pass 1's representations (check=True raises otherwise)."""
    model = _model(catalog, tokenizer, vocabularies, tiny={**TINY, "hidden_dropout_prob": 0.3})
    module = StageModule("finetune", StageConfig(aspect_weight=0.0), model).train()
    batch = _batch(model, catalog, 6)
    with torch.no_grad():
        first, second = module("reps", batch)["q"], module("reps", batch)["q"]
        state = RandContext()
        with state:
            a = module("reps", batch)["q"]
        with state:
            b = module("reps", batch)["q"]
    assert not torch.allclose(first, second), "dropout should make two encodings differ"
    torch.testing.assert_close(a, b, msg="RandContext did not replay the dropout masks")
    chunks = [take_rows(batch, s) for s in chunk_slices(6, 2)]
    loss, grads = gradcache_step(
        chunks, lambda c: module.finetune_reps(module.encode_finetune(c)),
        lambda reps: module.rep_loss(reps, batch, 0)[0],
        lambda i, c, g: module.surrogate(c, g, 1 / 3), check=True)
    assert torch.isfinite(loss) and grads["q"].shape == (6, 16)
    assert any(p.grad is not None and p.grad.abs().sum() > 0 for p in model.parameters())

