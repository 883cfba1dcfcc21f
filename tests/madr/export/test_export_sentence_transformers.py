"""sentence-transformers export: `SentenceTransformer(path)` gives madr's vectors.

Tiny random-init BERTs over the session tokenizer (no download). The reference is `BiEncoder.encode_texts`
(the vectors the encode job indexes and the searcher queries with); the exported directory, loaded by
sentence-transformers alone (no madr code, no `trust_remote_code`), must give the same vectors to 1e-5 for
queries (`encode_query`) and documents (`encode_document`, plain `encode`), with texts longer than the side's
truncation length, separate and shared towers, text prefixes, projections and both similarities.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch

from madr.config import BackboneConfig, ModelConfig
from madr.export.sentence_transformers import UNSUPPORTED, export_sentence_transformers, unsupported_reason
from madr.modeling.model import BiEncoder, build_model
from madr.recipes.multitask.config import EncoderConfig, MultiTaskExperimentConfig
from madr.recipes.multitask.encoders import build_encoder
from madr.training.distill import attach_query_student, make_student

pytest.importorskip("sentence_transformers")
from sentence_transformers import SentenceTransformer  # noqa: E402

TINY = {"hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 2, "intermediate_size": 64,
        "max_position_embeddings": 64}


@pytest.fixture(scope="module")
def texts(catalog) -> list[str]:
    """Queries and product texts: short, long (past max_query_length=10 tokens), one word."""
    return [q.text for q in catalog.queries[:12]] + [catalog.product_text(p) for p in catalog.products[:12]] + ["oak"]


def tiny(tokenizer, vocabularies=None, seed: int = 0, name: str = "bibert", **kw) -> BiEncoder:
    torch.manual_seed(seed)
    cfg = ModelConfig(name=name, backbone=BackboneConfig(tiny=TINY), max_query_length=10, max_doc_length=40, **kw)
    return build_model(cfg, tokenizer, vocabularies).eval()


def assert_same_vectors(model: BiEncoder, path, texts: list[str]) -> SentenceTransformer:
    st = SentenceTransformer(str(path), device="cpu")  # a fresh load from disk, as a user would
    assert len(model.tokenize(texts, "query")["input_ids"][0]) == model.config.max_query_length, \
        "no text reaches the query truncation length: a weak test"
    for side, got in (("query", st.encode_query(texts)), ("doc", st.encode_document(texts)),
                      ("doc", st.encode(texts))):
        want = model.encode_texts(texts, side).numpy()
        np.testing.assert_allclose(got, want, rtol=0, atol=1e-5, err_msg=f"{model.config.name} {side} vectors differ")
    return st


@pytest.mark.parametrize("kw", [
    {"name": "bibert"},  # separate towers, cosine: a Router over two pipelines
    {"name": "bibert", "projection_dim": 16, "similarity": "dot"},  # Dense, no Normalize
    {"name": "bibert", "shared_towers": True, "pooling": "mean", "text_prefixes": {"query": "query: ", "doc": "passage: "}},
    {"name": "mtbert", "projection_dim": 8},  # CLS that also predicts aspects: the vector is the CLS one
], ids=["bibert", "bibert-dot-projected", "bibert-shared-mean-prefixes", "mtbert"])
def test_exported_directory_gives_madrs_vectors(tokenizer, vocabularies, texts, tmp_path, kw):
    model = tiny(tokenizer, vocabularies, **kw)
    if model._doc_tower is not None:  # towers that differ: the query tower's weights are not the document's
        with torch.no_grad():
            model.doc_tower.backbone.embeddings.word_embeddings.weight.mul_(1.5)
    export_sentence_transformers(model, tmp_path / "st")
    st = assert_same_vectors(model, tmp_path / "st", texts)
    assert st.similarity_fn_name == model.config.similarity


def test_multitask_encoder_and_its_distilled_query_tower(tokenizer, texts, tmp_path):
    """The multi-task encoder (shared weights, projection, e5 prefixes) and the served pair after distillation
    (a 1-layer query student beside the 2-layer document tower): asymmetric towers in one directory."""
    enc = EncoderConfig(backbone=BackboneConfig(tiny=TINY), doc_layers=2, projection_dim=8, max_query_length=10,
                        max_doc_length=40, pooling="mean", text_prefixes={"query": "query: ", "doc": "passage: "})
    cfg = dataclasses.replace(MultiTaskExperimentConfig(), model=enc)
    teacher = build_encoder(cfg, tokenizer, seed=0).eval()
    export_sentence_transformers(teacher, tmp_path / "teacher")
    assert_same_vectors(teacher, tmp_path / "teacher", texts)
    served = attach_query_student(teacher, make_student(teacher.query_tower, 1)).eval()
    export_sentence_transformers(served, tmp_path / "served")
    st = assert_same_vectors(served, tmp_path / "served", texts)
    q = st.encode_query(texts[:3])
    assert np.abs(q - teacher.encode_texts(texts[:3], "query").numpy()).max() > 1e-3, \
        "the student's query vectors equal the teacher's: the query route does not use the student"


def test_round_trip_through_a_saved_model(tokenizer, texts, tmp_path):
    """What the CLI does: `BiEncoder.load` a saved model directory, then export."""
    tiny(tokenizer, projection_dim=16).save(tmp_path / "model")
    model = BiEncoder.load(tmp_path / "model").eval()
    export_sentence_transformers(model, tmp_path / "st")
    assert_same_vectors(model, tmp_path / "st", texts)


@pytest.mark.parametrize("name", sorted(UNSUPPORTED))
def test_models_without_a_sentence_transformers_form_are_refused_with_the_reason(name):
    cfg = ModelConfig(name=name, backbone=BackboneConfig(tiny=TINY))
    assert unsupported_reason(cfg) == UNSUPPORTED[name]
    assert name.upper()[:3] in UNSUPPORTED[name].upper(), f"{name}: the reason does not name the model"


def test_refusal_names_the_model_and_writes_nothing(tokenizer, vocabularies, tmp_path):
    model = tiny(tokenizer, vocabularies, name="madral")
    with pytest.raises(ValueError, match="madral.*Aspect Extraction Network"):
        export_sentence_transformers(model, tmp_path / "st")
    assert not (tmp_path / "st").exists()


def test_a_non_empty_directory_is_not_overwritten(tokenizer, tmp_path):
    (tmp_path / "st").mkdir()
    (tmp_path / "st" / "keep.txt").write_text("x")
    with pytest.raises(ValueError, match="not empty"):
        export_sentence_transformers(tiny(tokenizer), tmp_path / "st")
