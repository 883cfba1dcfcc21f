"""A bi-encoder as a sentence-transformers directory, built from sentence-transformers' own modules only.

`SentenceTransformer(path)` loads it without madr and without `trust_remote_code`, and gives madr's vectors
(`BiEncoder.encode_texts`): `encode_query(texts)` the query side's, `encode_document(texts)` (and plain
`encode`, whose default prompt is the document one) the document side's. A tower becomes

    Transformer (the backbone + madr's tokenizer) -> Pooling (cls | mean) -> [Dense (projection, no activation)]
    -> [Normalize (cosine models)]

Shared towers are one such pipeline, whose `Transformer` truncates queries at `max_query_length` and documents
at `max_doc_length` (`query_length` / `document_length`); separate towers (BiBERT's default, a distilled
query student) are two, behind a `Router` that sends `encode_query` to the query tower and everything else to
the document tower. `text_prefixes` become the prompts "query" / "document", which `encode_query` /
`encode_document` put before every text as madr does (inside the truncation length, as madr does).

Exportable: the models whose vector is the backbone's CLS state or its masked mean, optionally projected:
BiBERT, MtBERT, the multi-task encoder (a BiBERT) and its distilled serving pair. The others are refused with
the reason `unsupported_reason` gives (`UNSUPPORTED`): no built-in sentence-transformers module computes their
vector, and a module of our own would load only with `trust_remote_code=True`.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

from torch import nn

from madr.config import ModelConfig
from madr.modeling.heads import ClsHead
from madr.modeling.model import BiEncoder, Tower

# Why each model that is not exported cannot be expressed with sentence-transformers modules. Their fusion
# needs a module of our own, which `SentenceTransformer` loads only with `trust_remote_code=True` (since
# sentence-transformers 6.0 for local directories too): not what "usable outside madr" should mean.
UNSUPPORTED = {
    "mpbert": "MpBERT fuses the encodings of the first K tokens with learned, per-text weights (paper 000 Sec. 8.2: "
              "weighted sum / presence weighting / CLS-gating, renormalised over the tokens a short text has); "
              "sentence-transformers' Pooling offers cls / mean / max / mean_sqrt_len / weightedmean (fixed "
              "position weights) / lasttoken, none of which selects the first K tokens or learns their weights",
    "madr": "MADR's vector is the fusion of aspect embeddings that an Aspect Extraction Network attends out of the "
            "token states with learned aspect queries (paper 000 Eq. 1-2, then Eq. 4-5 or CLS-gating); no "
            "sentence-transformers module attends with learned queries or fuses with per-text weights",
    "mur": "MUR's vector is sum_k softmax(U h_CLS + b)_k h(o_k) over K learned aspect tokens inserted after CLS "
           "(paper 001 Eq. 6-7); the inserted tokens could be new vocabulary rows placed by the tokenizer's "
           "template, but the CLS-gated weighting of those K positions is no sentence-transformers Pooling mode",
    "dssm": "DSSM has no transformer backbone: a mean bag of wordpieces that includes [CLS] / [SEP] and stops at "
            "max_length, into an MLP; sentence-transformers' StaticEmbedding bags the tokens without special "
            "tokens or truncation, so the vectors would differ",
    "hybrid": "the hybrid model's output is two vectors, a dense CLS vector and SPLADE term weights scored together "
              "(paper 002 Eq. 1); one sentence-transformers vector would drop the sparse half. Export its query "
              "tower to ONNX (python -m pipelines.export --onnx), which carries both",
}
UNSUPPORTED["madral"] = UNSUPPORTED["madr"].replace("MADR's", "MADRAL's")
UNSUPPORTED["mural"] = UNSUPPORTED["mur"].replace("MUR's", "MURAL's")


def unsupported_reason(cfg: ModelConfig) -> str | None:
    """Why model `cfg.name` has no sentence-transformers form (None: it has one)."""
    return UNSUPPORTED.get(cfg.name)


def export_sentence_transformers(model: BiEncoder, out_dir: str | Path):
    """Write `model` as a sentence-transformers directory at `out_dir`; returns the `SentenceTransformer`.

    Raises ValueError naming the model and the reason when its vector is not expressible with
    sentence-transformers modules (`unsupported_reason`).
    """
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.sentence_transformer.modules import Router

    cfg = model.config
    reason = unsupported_reason(cfg)
    if reason is not None:
        raise ValueError(f"model {cfg.name!r} cannot be written as a sentence-transformers directory: {reason}")
    for side in ("query", "doc"):
        if not isinstance(model.tower(side).head, ClsHead):
            raise ValueError(f"model {cfg.name!r}: the {side} tower's head is "
                             f"{type(model.tower(side).head).__name__}, not the CLS / mean head")
    out_dir = Path(out_dir)
    if out_dir.exists() and any(out_dir.iterdir()):
        raise ValueError(f"{out_dir}: exists and is not empty (a sentence-transformers directory is written fresh)")
    model.eval()
    with tempfile.TemporaryDirectory(prefix="madr-st-") as tmp:
        if model._doc_tower is None:
            modules = _tower_modules(model, model.query_tower, Path(tmp) / "shared",
                                     cfg.max_doc_length, cfg.max_query_length, cfg.max_doc_length)
        else:
            query = _tower_modules(model, model.query_tower, Path(tmp) / "query", cfg.max_query_length)
            doc = _tower_modules(model, model.doc_tower, Path(tmp) / "doc", cfg.max_doc_length)
            modules = [Router.for_query_document(query, doc, default_route="document")]
        prompts = {"query": cfg.text_prefixes.get("query", ""), "document": cfg.text_prefixes.get("doc", "")}
        st = SentenceTransformer(modules=modules, prompts=prompts, device="cpu",
                                 default_prompt_name="document" if prompts["document"] else None,
                                 similarity_fn_name="cosine" if cfg.similarity == "cosine" else "dot")
        st.save(str(out_dir), create_model_card=False)
    return st


def _tower_modules(model: BiEncoder, tower: Tower, work: Path, max_length: int,
                   query_length: int | None = None, document_length: int | None = None) -> list[nn.Module]:
    """The sentence-transformers modules computing `tower`'s vector; the backbone is written under `work`."""
    from sentence_transformers.sentence_transformer.modules import Dense, Normalize, Pooling, Transformer

    tower.backbone.save_pretrained(str(work), safe_serialization=True)
    model.tokenizer.save_pretrained(str(work))
    transformer = Transformer(str(work), query_length=query_length, document_length=document_length,
                              processor_kwargs={"model_max_length": max_length})
    transformer.max_seq_length = max_length
    width = transformer.get_embedding_dimension()
    modules: list[nn.Module] = [transformer, Pooling(width, tower.head.pooling)]
    if tower.projection is not None:
        p = tower.projection
        modules.append(Dense(p.in_features, p.out_features, bias=p.bias is not None, activation_function=None,
                             init_weight=p.weight.detach().clone(),
                             init_bias=None if p.bias is None else p.bias.detach().clone()))
    if model.config.similarity == "cosine":
        modules.append(Normalize())
    return modules
