"""Explanations of a query-document score: what `/explain` serves.

Hybrid models (paper 002 "interpretability"): the terms both sparse vectors share, with their query and
document weights and contribution, marking expansion terms (weighted by the model but absent from the
text). Aspect models (paper 000 Table 8): per aspect the top predicted value with its confidence, the
presence probability and the fusion weight.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import torch

from madr.model import BiEncoder
from madr.outputs import TowerOutput


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
        return not (self.in_query_text and self.in_doc_text)


def matched_terms(model: BiEncoder, query: str, doc: str, top: int = 20) -> list[TermMatch]:
    """Terms with weight in both sparse vectors, by contribution q_j * d_j, largest first."""
    q_enc, d_enc = model.tokenize([query], "query"), model.tokenize([doc], "doc")
    with torch.no_grad():
        q = model.encode(q_enc["input_ids"], q_enc["attention_mask"], "query")
        d = model.encode(d_enc["input_ids"], d_enc["attention_mask"], "doc")
    if q.sparse is None:
        raise ValueError(f"model {model.config.name} has no sparse vectors to explain")
    contrib = q.sparse[0] * d.sparse[0]
    ids = torch.nonzero(contrib > 0).flatten()
    ids = ids[torch.argsort(contrib[ids], descending=True)][:top]
    q_text, d_text = set(q_enc["input_ids"][0].tolist()), set(d_enc["input_ids"][0].tolist())
    vocab = model.tokenizer.convert_ids_to_tokens(ids.tolist())
    return [TermMatch(t, float(q.sparse[0, i]), float(d.sparse[0, i]), float(contrib[i]),
                      int(i) in q_text, int(i) in d_text) for t, i in zip(vocab, ids.tolist(), strict=True)]


def expansion_terms(model: BiEncoder, out: TowerOutput, input_ids: torch.Tensor, top: int = 10) -> list[tuple[str, float]]:
    """The heaviest terms of the first text's sparse vector that are not among its input tokens."""
    if out.sparse is None:
        return []
    w = out.sparse[0].clone()
    w[input_ids[0]] = 0.0
    vals, ids = torch.topk(w, min(top, int((w > 0).sum())))
    return list(zip(model.tokenizer.convert_ids_to_tokens(ids.tolist()), vals.tolist(), strict=True))


def aspect_summary(model: BiEncoder, out: TowerOutput, row: int = 0) -> list[dict]:
    """Paper 000 Table 8 for one text: per component its top value, confidence, presence and weight."""
    rows = []
    presence = out.presence
    for k, name in enumerate(out.component_names):
        entry: dict = {"component": name}
        if out.fusion_weights is not None:
            entry["weight"] = float(out.fusion_weights[row, k])
        if presence is not None:
            entry["presence"] = float(presence[row, k])
        logits = out.aspect_logits.get(name) if name in out.aspect_logits else out.aspect_logits.get(f"{name}/phrase")
        if logits is not None and model.vocabularies is not None:
            aspect = name.split("/")[0]
            probs = torch.softmax(logits[row], -1)
            conf, idx = probs.max(-1)
            entry["prediction"] = model.vocabularies.get(aspect, "phrase").decode([int(idx)])[0]
            entry["confidence"] = float(conf)
        rows.append(entry)
    return rows


def explain_pair(model: BiEncoder, query: str, doc: str) -> dict:
    """Everything explainable about one (query, document) pair, as plain JSON-ready data."""
    model.eval()
    result: dict = {"model": model.config.name}
    encs = {"query": model.tokenize([query], "query"), "doc": model.tokenize([doc], "doc")}
    outs = {}
    with torch.no_grad():
        for side, enc in encs.items():
            outs[side] = model.encode(enc["input_ids"], enc["attention_mask"], side)
            result[side] = {"aspects": aspect_summary(model, outs[side]),
                            "expansion_terms": expansion_terms(model, outs[side], enc["input_ids"])}
        result["score"] = float(model.similarity(outs["query"].embedding, outs["doc"].embedding)[0, 0])
        if outs["query"].sparse is not None:
            result["hybrid_score"] = float(model.hybrid_scores(outs["query"], outs["doc"])[0, 0])
            result["matched_terms"] = [asdict(m) | {"expansion": m.expansion} for m in matched_terms(model, query, doc)]
    return result
