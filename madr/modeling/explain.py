"""Explanations of a query-document score: what `/explain` serves.

Hybrid models (paper 002 "interpretability"): the terms both sparse vectors share, with their query and
document weights and contribution, marking expansion terms (weighted by the model but absent from the
text). Aspect models (paper 000 Table 8): per aspect the top predicted value with its confidence, the
presence probability and the fusion weight. The confidence is the softmax of the value logits divided by
the model's fitted temperature for that side and aspect (`madr.modeling.calibration`; 1 when it has none).
Aspect models also get the pair's aspect-match score (`madr.search.aspect_match`: per aspect the inner
product of the two calibrated value distributions, weighted by the query's presence, paper 000 Sec. 5 and
Sec. 6.2), with both sides' top values and probabilities and each aspect's contribution.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import torch
from transformers import PreTrainedTokenizerBase

from madr.modeling.batching import model_device
from madr.modeling.calibration import top_confidence
from madr.modeling.model import BiEncoder
from madr.modeling.outputs import TowerOutput


@dataclass
class TermMatch:
    term: str
    query_weight: float
    doc_weight: float
    contribution: float
    in_query_text: bool
    in_doc_text: bool

    @property
    def expansion(self) -> bool:
        """True when the term is missing from the query's or the document's text (an expansion term)."""
        return not (self.in_query_text and self.in_doc_text)


def match_terms(q_sparse: torch.Tensor, d_sparse: torch.Tensor, q_ids: list[int], d_ids: list[int],
                tokenizer: PreTrainedTokenizerBase, top: int | None = 20) -> list[TermMatch]:
    """Terms with weight in both sparse vectors [V], by contribution q_j * d_j, largest first (ties: lower
    term id). Their contributions sum to the sparse score <sparse_q, sparse_d> (paper 002 Eq. 1) when
    `top` is None or covers them all. `q_ids` / `d_ids` are the texts' token ids: a term absent from a
    text's tokens is an expansion on that side (paper 002 Table 5, "Expansion")."""
    if q_sparse.dim() != 1 or q_sparse.shape != d_sparse.shape:
        raise ValueError(f"match_terms: need two [vocab] vectors, got {tuple(q_sparse.shape)} and "
                         f"{tuple(d_sparse.shape)}")
    contrib = q_sparse * d_sparse
    ids = torch.nonzero(contrib > 0).flatten()  # ascending term ids; the stable sort keeps ties in that order
    ids = ids[torch.sort(contrib[ids], descending=True, stable=True).indices][:top]
    q_text, d_text = set(q_ids), set(d_ids)
    names = tokenizer.convert_ids_to_tokens(ids.tolist())
    return [TermMatch(t, float(q_sparse[i]), float(d_sparse[i]), float(contrib[i]), i in q_text, i in d_text)
            for t, i in zip(names, ids.tolist(), strict=True)]


def _tokenized(model: BiEncoder, text: str, side: str) -> dict[str, torch.Tensor]:
    """`text` tokenised for `side`'s tower, on the device of the model's weights (a model served on a GPU)."""
    device = model_device(model)
    return {k: v.to(device) for k, v in model.tokenize([text], side).items()}


def matched_terms(model: BiEncoder, query: str, doc: str, top: int | None = 20) -> list[TermMatch]:
    """`match_terms` of a (query, document) pair encoded by a hybrid `model` (eval mode, no grad)."""
    q_enc, d_enc = _tokenized(model, query, "query"), _tokenized(model, doc, "doc")
    was_training = model.training
    model.eval()  # the top-k cut of the sparse vectors applies in eval mode (madr.modeling.heads.hybrid)
    with torch.no_grad():
        q = model.encode(q_enc["input_ids"], q_enc["attention_mask"], "query")
        d = model.encode(d_enc["input_ids"], d_enc["attention_mask"], "doc")
    model.train(was_training)
    if q.sparse is None or d.sparse is None:
        raise ValueError(f"model {model.config.name} has no sparse vectors to explain")
    return match_terms(q.sparse[0], d.sparse[0], q_enc["input_ids"][0].tolist(), d_enc["input_ids"][0].tolist(),
                       model.tokenizer, top)


def expansion_terms(model: BiEncoder, out: TowerOutput, input_ids: torch.Tensor, top: int = 10) -> list[tuple[str, float]]:
    """The heaviest terms of the first text's sparse vector that are not among its input tokens
    (weight descending)."""
    if out.sparse is None:
        return []
    w = out.sparse[0].clone()
    w[input_ids[0]] = 0.0
    vals, ids = torch.topk(w, min(top, int((w > 0).sum())))
    return list(zip(model.tokenizer.convert_ids_to_tokens(ids.tolist()), vals.tolist(), strict=True))


def aspect_summary(model: BiEncoder, out: TowerOutput, row: int = 0, side: str = "query") -> list[dict]:
    """Paper 000 Table 8 for one text of `side`: per component its top value, confidence (calibrated when the
    model has a calibration, `calibrated` says which), presence and weight."""
    rows = []
    presence = out.presence
    for k, name in enumerate(out.component_names):
        entry: dict = {"component": name}
        if out.fusion_weights is not None:
            entry["weight"] = float(out.fusion_weights[row, k])
        if presence is not None:
            entry["presence"] = float(presence[row, k])
        key = name if name in out.aspect_logits else f"{name}/phrase"
        logits = out.aspect_logits.get(key)
        if logits is not None and model.vocabularies is not None:
            aspect = name.split("/")[0]
            t = model.calibration.temperature(side, key) if model.calibration is not None else 1.0
            conf, idx = top_confidence(logits[row:row + 1], t)
            entry["prediction"] = model.vocabularies.get(aspect, "phrase").decode([int(idx[0])])[0]
            entry["confidence"] = float(conf[0])
            entry["calibrated"] = model.calibration is not None
        rows.append(entry)
    return rows


def aspect_match_summary(model: BiEncoder, q: TowerOutput, d: TowerOutput, k: int = 5) -> dict:
    """The aspect-match score of one encoded (query, document) pair (``madr.search.aspect_match.aspect_match``
    over both sides' calibrated top-``k``): the total and, per aspect, the query's presence, its share of the
    weight, the match, its contribution (share * match) and both sides' top values with their probabilities."""
    from madr.modeling.aspect_distributions import calibrated_topk
    from madr.search.aspect_match import aspect_match

    qt, dt = calibrated_topk(model, q, "query", k), calibrated_topk(model, d, "doc", k)
    m = aspect_match(qt, 0, dt)
    rows = []
    for a in qt:
        names = model.vocabularies.get(a, "phrase")
        rows.append({"aspect": a, "query_presence": m.presence[a], "weight": m.weight[a],
                     "match": float(m.scores[a][0]), "contribution": float(m.weight[a] * m.scores[a][0]),
                     "query_values": _top_values(names, qt[a].values[0], qt[a].probs[0]),
                     "doc_values": _top_values(names, dt[a].values[0], dt[a].probs[0]),
                     "doc_presence": float(dt[a].presence[0])})
    return {"score": float(m.total[0]), "calibrated": model.calibration is not None, "aspects": rows}


def _top_values(vocabulary, values, probs) -> list[dict]:
    ids = [int(v) for v in values if int(v) >= 0]
    return [{"value": s, "probability": float(p)} for s, p in zip(vocabulary.decode(ids), probs, strict=False)]


def explain_pair(model: BiEncoder, query: str, doc: str) -> dict:
    """Everything explainable about one (query, document) pair, as plain JSON-ready data.

    Hybrid models add the dense and sparse parts of Eq. 1, the interpolated score (the model's
    `hybrid_lambda`) and the top matched terms (`match_terms`)."""
    model.eval()
    result: dict = {"model": model.config.name}
    encs = {"query": _tokenized(model, query, "query"), "doc": _tokenized(model, doc, "doc")}
    outs = {}
    with torch.no_grad():
        for side, enc in encs.items():
            outs[side] = model.encode(enc["input_ids"], enc["attention_mask"], side)
            result[side] = {"aspects": aspect_summary(model, outs[side], side=side),
                            "expansion_terms": expansion_terms(model, outs[side], enc["input_ids"])}
        result["score"] = float(model.similarity(outs["query"].embedding, outs["doc"].embedding)[0, 0])
        if model.predicts_aspect_values:
            result["aspect_match"] = aspect_match_summary(model, outs["query"], outs["doc"])
        if outs["query"].sparse is not None:
            q, d = outs["query"], outs["doc"]
            result["dense_score"] = float(model.hybrid_scores(q, d, 1.0)[0, 0])
            result["sparse_score"] = float(model.hybrid_scores(q, d, 0.0)[0, 0])
            result["hybrid_score"] = float(model.hybrid_scores(q, d)[0, 0])
            matches = match_terms(q.sparse[0], d.sparse[0], encs["query"]["input_ids"][0].tolist(),
                                  encs["doc"]["input_ids"][0].tolist(), model.tokenizer)
            result["matched_terms"] = [asdict(m) | {"expansion": m.expansion} for m in matches]
    return result
