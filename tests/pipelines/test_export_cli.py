"""`python -m pipelines.export` / `madr export`: a saved model directory out as a
sentence-transformers directory and an ONNX query tower, or a refusal that names the reason."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from madr.config import BackboneConfig, ModelConfig
from madr.modeling.model import BiEncoder, build_model
from pipelines.cli import main as madr_main
from pipelines.export import main

pytest.importorskip("sentence_transformers")
pytest.importorskip("onnxruntime")

TINY = {"hidden_size": 32, "num_hidden_layers": 1, "num_attention_heads": 2, "intermediate_size": 64,
        "max_position_embeddings": 64}


def saved(tokenizer, tmp_path, name: str, vocabularies=None):
    torch.manual_seed(0)
    cfg = ModelConfig(name=name, backbone=BackboneConfig(tiny=TINY), max_query_length=16, max_doc_length=32)
    return build_model(cfg, tokenizer, vocabularies).save(tmp_path / name)


def test_cli_writes_both_forms_that_give_madrs_vectors(tokenizer, catalog, tmp_path, capsys):
    from sentence_transformers import SentenceTransformer

    from madr.export.onnx import onnx_session

    model_dir = saved(tokenizer, tmp_path, "bibert")
    assert main([str(model_dir), "--sentence-transformers", str(tmp_path / "st"), "--onnx",
                 str(tmp_path / "q.onnx")]) == 0
    assert "sentence-transformers directory" in capsys.readouterr().out
    model = BiEncoder.load(model_dir).eval()
    texts = [q.text for q in catalog.queries[:6]]
    want = model.encode_texts(texts, "query").numpy()
    got = SentenceTransformer(str(tmp_path / "st"), device="cpu").encode_query(texts)
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-5)
    enc = model.tokenize(texts, "query")
    (dense,) = onnx_session(tmp_path / "q.onnx").run(None, {k: v.numpy() for k, v in enc.items()})
    np.testing.assert_allclose(dense, want, rtol=0, atol=1e-5)


def test_cli_refuses_an_aspect_model_with_the_reason(tokenizer, vocabularies, tmp_path):
    model_dir = saved(tokenizer, tmp_path, "mural", vocabularies)
    with pytest.raises(SystemExit, match="mural.*CLS-gated weighting"):
        madr_main(["export", str(model_dir), "--sentence-transformers", str(tmp_path / "st")])
    with pytest.raises(SystemExit, match="does not exist"):
        main([str(tmp_path / "missing"), "--onnx", str(tmp_path / "q.onnx")])
    with pytest.raises(SystemExit, match="nothing to export"):
        main([str(model_dir)])
