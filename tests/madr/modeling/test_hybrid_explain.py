"""Explanations of hybrid scores (paper 002 interpretability): matched terms with query / document weights,
expansion terms absent from the text, by hand and on a tiny model."""

from __future__ import annotations

import pytest
import torch

from madr.config import BackboneConfig, ModelConfig
from madr.modeling.explain import expansion_terms, explain_pair, match_terms, matched_terms
from madr.modeling.model import build_model

TINY = {"hidden_size": 32, "num_hidden_layers": 1, "num_attention_heads": 2, "intermediate_size": 64,
        "max_position_embeddings": 96}


def _ids(tokenizer, *tokens: str) -> list[int]:
    return tokenizer.convert_tokens_to_ids(list(tokens))


def test_match_terms_by_hand(tokenizer):
    words = sorted(t for t in tokenizer.get_vocab() if t.isalpha() and len(t) >= 3)[:5]
    assert len(words) == 5, "the tokenizer has whole-word terms"
    red, blue, shoe, sock, wool = _ids(tokenizer, *words)
    names = dict(zip(("red", "blue", "shoe", "sock", "wool"), words, strict=True))
    v = len(tokenizer)
    q, d = torch.zeros(v), torch.zeros(v)
    q[red], q[shoe], q[wool], q[blue] = 2.0, 1.0, 0.5, 3.0  # query text: "red shoe"; wool, blue: expansions
    d[red], d[shoe], d[wool], d[sock] = 0.5, 4.0, 2.0, 1.0  # doc text: "red sock"; shoe, wool: expansions
    got = match_terms(q, d, q_ids=[red, shoe], d_ids=[red, sock], tokenizer=tokenizer, top=None)
    # contributions: shoe 1*4 = 4, red 2*.5 = 1, wool .5*2 = 1 (tie: lower term id first); blue, sock: one side only
    tie = ["red", "wool"] if red < wool else ["wool", "red"]
    assert [m.term for m in got] == [names[t] for t in ("shoe", *tie)], got
    by = {k: next(m for m in got if m.term == w) for k, w in names.items() if k not in ("blue", "sock")}
    assert (by["shoe"].query_weight, by["shoe"].doc_weight, by["shoe"].contribution) == (1.0, 4.0, 4.0)
    assert by["red"].in_query_text and by["red"].in_doc_text and not by["red"].expansion
    assert by["shoe"].in_query_text and not by["shoe"].in_doc_text and by["shoe"].expansion, "doc-side expansion"
    assert not by["wool"].in_query_text and not by["wool"].in_doc_text and by["wool"].expansion
    assert sum(m.contribution for m in got) == pytest.approx(float(q @ d)), "contributions add up to the sparse score"
    assert [m.term for m in match_terms(q, d, [red, shoe], [red, sock], tokenizer, top=1)] == [names["shoe"]]
    with pytest.raises(ValueError, match="vocab"):
        match_terms(q[None], d, [], [], tokenizer)


@pytest.fixture(scope="module")
def model(tokenizer):
    torch.manual_seed(0)
    cfg = ModelConfig(name="hybrid", backbone=BackboneConfig(tiny=TINY), sparse_top_k=40, max_query_length=16,
                      max_doc_length=32, hybrid_lambda=0.25, similarity="dot")
    return build_model(cfg, tokenizer).eval()


def test_expansion_terms_are_absent_from_the_input(model):
    enc = model.tokenize(["red running shoes"], "query")
    with torch.no_grad():
        out = model.encode(enc["input_ids"], enc["attention_mask"], "query")
    terms = expansion_terms(model, out, enc["input_ids"], top=5)
    assert len(terms) == 5 and [w for _, w in terms] == sorted((w for _, w in terms), reverse=True)
    ids = set(enc["input_ids"][0].tolist())
    for term, weight in terms:
        tid = model.tokenizer.convert_tokens_to_ids(term)
        assert tid not in ids, f"{term} is in the text, not an expansion"
        assert weight == pytest.approx(float(out.sparse[0, tid]))


def test_explain_pair_scores_and_terms_agree(model):
    query, doc = "red running shoes", "blue wool socks for running in the rain"
    result = explain_pair(model, query, doc)
    dense, sparse = result["dense_score"], result["sparse_score"]
    assert result["hybrid_score"] == pytest.approx(0.25 * dense + 0.75 * sparse, rel=1e-5)
    terms = result["matched_terms"]
    assert terms and all(t["contribution"] == pytest.approx(t["query_weight"] * t["doc_weight"]) for t in terms)
    full = matched_terms(model, query, doc, top=None)
    assert sum(m.contribution for m in full) == pytest.approx(sparse, rel=1e-4), "all matches sum to the sparse score"
    assert [t["term"] for t in terms] == [m.term for m in full[:20]]
    assert any(t["expansion"] for t in terms), "an untrained MLM head spreads weight beyond the input tokens"
