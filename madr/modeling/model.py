"""The bi-encoder: a query tower and a document tower (shared or separate weights) + shared aspect tables.

A tower = backbone (any HF encoder, optionally truncated) + a head selected by the model name + an
optional projection to d dimensions (paper 000 Sec. 8.2 projects "the aspect, query and document
embeddings" to 128): MADR / MADRAL project their aspect embeddings inside the head (so fusion, presence and
aspect prediction see the projected ones), every other head's vector is projected by the tower. A DSSM tower
starts its embedding table from the configured pretrained backbone's word embeddings (paper 000 Sec. 8.2:
"initialize the embedding table from BiBERT"). The aspect value tables
(paper 000 Sec. 5: "shared between the query and document encoders") live on the bi-encoder, which
fills `TowerOutput.aspect_logits` from the tower's aspect representations.

A saved model is a directory: the config that built it (`config.json`), the tokenizer, each backbone in
HF form (safetensors), every other weight in `heads.safetensors`, the aspect vocabularies as JSON, and
the aspect confidences' temperatures when fitted (`aspect_calibration.json`, `madr.modeling.calibration`).
Loading reads only those formats: nothing is unpickled.

Multi-field documents (paper 004 Sec. IV): a bi-encoder built with `field_attention="additive" | "bilinear"`
also holds a `FieldAttention` (Eq. 8-9) and embeds a document given as field texts with the query
(`encode_field_documents`); its scorer is saved in `field_attention.json`, its weights with the heads.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file
from torch import nn
from transformers import AutoTokenizer, PreTrainedTokenizerBase

from madr.config import ModelConfig, from_dict
from madr.modeling.aspect_tables import AspectClassifier, ValueEmbeddings, value_token_matrix
from madr.modeling.aspect_vocabulary import AspectVocabularies
from madr.modeling.backbone import (
    MLMHead,
    build_backbone,
    hidden_size,
    load_pretrained_backbone,
    max_positions,
)
from madr.modeling.calibration import CALIBRATION_FILE, AspectCalibration
from madr.modeling.heads import (
    AspectAttentionHead,
    AspectTokensHead,
    ClsHead,
    DSSMEncoder,
    HybridHead,
    MultiPoolHead,
)
from madr.modeling.heads.field_attention import FieldAttention, FieldAttentionOutput
from madr.modeling.heads.hybrid import SparseTerms
from madr.modeling.outputs import TowerOutput

CONFIG_FILE = "config.json"
HEADS_FILE = "heads.safetensors"
VOCAB_FILE = "aspect_vocabularies.json"
FIELD_ATTENTION_FILE = "field_attention.json"


class Tower(nn.Module):
    """One side of the bi-encoder. DSSM towers have no backbone (the head is the whole encoder); their
    embedding table starts from `dssm_embeddings` [vocab, E] when given (E wide), else random and
    `dssm_hidden[0]` wide."""

    def __init__(self, cfg: ModelConfig, backbone: nn.Module | None, vocab_size: int, pad_id: int,
                 special_ids: list[int] | None = None, dssm_embeddings: torch.Tensor | None = None) -> None:
        super().__init__()
        self.backbone = backbone
        if backbone is None:
            self.head: nn.Module = _build_dssm(cfg, vocab_size, pad_id, dssm_embeddings)
            out_dim = self.head.output_dim
            self.mlm_head = None
        else:
            h = hidden_size(backbone)
            self.head = _build_head(cfg, h, special_ids or [])
            self.mlm_head = MLMHead(h, backbone.get_input_embeddings().weight.shape[0],
                                    getattr(backbone.config, "layer_norm_eps", 1e-12))
            out_dim = h
        self._sparse_terms = None if isinstance(self.head, SparseTerms) or not cfg.sparse_head else SparseTerms(
            cfg.sparse_top_k, cfg.sparse_pooling, special_ids or [], cfg.sparse_top_k_in_training)
        # the lean head's vocabulary ids (`BiEncoder.restrict_sparse_terms`; filled by `load` from the heads file)
        self.register_buffer("sparse_ids", None if cfg.sparse_vocab_size is None
                             else torch.zeros(cfg.sparse_vocab_size, dtype=torch.long))
        projected = isinstance(self.head, AspectAttentionHead) and self.head.projection is not None
        self.projection = nn.Linear(out_dim, cfg.projection_dim) if cfg.projection_dim and not projected else None

    @property
    def word_embeddings(self) -> torch.Tensor | None:
        return None if self.backbone is None else self.backbone.get_input_embeddings().weight

    @property
    def sparse_terms(self) -> SparseTerms | None:
        """Pooling, cut and excluded ids of the sparse vector (paper 002 Eq. 2): the hybrid model's head, or the
        `model.sparse_head` of another model; None for dense-only models."""
        return self.head if isinstance(self.head, SparseTerms) else self._sparse_terms

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> TowerOutput:
        if self.backbone is None:
            out = self.head(input_ids, attention_mask)
        else:
            out = self.head(self.backbone, input_ids, attention_mask)
            if self.sparse_terms is not None:
                out.sparse = self.sparse_vector(out, attention_mask)
        if self.projection is not None:
            out.embedding = self.projection(out.embedding)
        return out

    def sparse_vector(self, out: TowerOutput, attention_mask: torch.Tensor) -> torch.Tensor:
        """[B, V] sparse term weights over the whole vocabulary (paper 002 Eq. 2, Sec. 4.2 cut). A lean head
        (`sparse_ids`) computes the logits of its terms only, [B, L, T], and scatters the weights into V."""
        terms = self.sparse_terms
        if self.sparse_ids is None:
            return terms.sparsify(self.mlm_logits(out), attention_mask)
        logits = self.mlm_head(out.sequence_output, self.word_embeddings, self.sparse_ids)
        weights = terms.sparsify(logits, attention_mask, excluded=False)  # special ids are never kept
        full = weights.new_zeros(weights.shape[0], self.word_embeddings.shape[0])
        return full.scatter(1, self.sparse_ids.expand(weights.shape[0], -1), weights)

    def mlm_logits(self, out: TowerOutput, positions: torch.Tensor | None = None) -> torch.Tensor:
        """MLM scores [B, L, vocab] over the content positions of `out` (paper 001 Eq. 8), or [N, vocab] at
        the N positions where the bool mask `positions` [B, L] is set: the MLM loss needs only the masked
        ~15%, and the vocabulary projection is most of a small model's compute."""
        if self.mlm_head is None or out.sequence_output is None:
            raise ValueError("this tower has no MLM head (DSSM has no backbone)")
        hidden = out.sequence_output if positions is None else out.sequence_output[positions]
        return self.mlm_head(hidden, self.word_embeddings)


def _build_dssm(cfg: ModelConfig, vocab_size: int, pad_id: int, table: torch.Tensor | None) -> DSSMEncoder:
    """DSSM over `vocab_size` word pieces; with `table` its embeddings start as a copy of it (paper 000 Sec. 8.2)."""
    if table is None:
        return DSSMEncoder(vocab_size, cfg.dssm_hidden[0], cfg.dssm_hidden, pad_id)
    head = DSSMEncoder(vocab_size, table.shape[1], cfg.dssm_hidden, pad_id)
    head.init_embeddings(table)
    return head


def _build_head(cfg: ModelConfig, hidden: int, special_ids: list[int]) -> nn.Module:
    k = len(cfg.aspects) + int(cfg.use_other)
    if cfg.name in ("bibert", "mtbert"):
        return ClsHead(cfg.aspects, predict_aspects=cfg.learns_aspects, pooling=cfg.pooling)
    if cfg.name == "mpbert":
        return MultiPoolHead(k, hidden, cfg.fusion)
    if cfg.name in ("madr", "madral"):
        head = AspectAttentionHead(cfg.aspects, cfg.use_other, hidden, cfg.fusion, cfg.learns_aspects,
                                   cfg.projection_dim, cfg.aspect_extraction, cfg.other_from)
        if cfg.aspect_init == "pooled":
            head.aen.start_as_mean_pooling()
        return head
    if cfg.name in ("mur", "mural"):
        return AspectTokensHead(cfg.aspects, cfg.granularities, cfg.grouping, hidden, cfg.learns_aspects)
    if cfg.name == "hybrid":
        return HybridHead(cfg.sparse_top_k, cfg.sparse_pooling, special_ids, cfg.sparse_top_k_in_training)
    raise ValueError(f"model {cfg.name!r} has no backbone head")


def objective_keys(cfg: ModelConfig) -> list[tuple[str, str, str]]:
    """(key, aspect, granularity) of every aspect-learning objective of this model (empty without)."""
    if not cfg.learns_aspects:
        return []
    if cfg.uses_granularities:
        return [(f"{a}/{g}", a, g) for a in cfg.aspects for g in cfg.granularities]
    return [(a, a, "phrase") for a in cfg.aspects]


class BiEncoder(nn.Module):
    """Query tower + document tower + the aspect tables both share.

    `backbone_paths` (used by `load`) overrides where each tower's backbone is read from.
    `field_attention`: the scorer of paper 004's query-dependent field attention (Eq. 8-9; None: none),
    used by `encode_field_documents` and trained by the multi-task click task.
    `dssm_embeddings` (DSSM only; `load` passes the saved table): the table DSSM's embeddings start from; by
    default the word embeddings of `cfg.backbone` when it names a pretrained encoder (paper 000 Sec. 8.2: DSSM's
    embedding table is initialised from the pretrained BiBERT, e.g. `<bibert model dir>/query_backbone`).
    """

    def __init__(self, cfg: ModelConfig, tokenizer: PreTrainedTokenizerBase,
                 vocabularies: AspectVocabularies | None = None,
                 backbone_paths: dict[str, str] | None = None,
                 dssm_embeddings: torch.Tensor | None = None, field_attention: str | None = None) -> None:
        super().__init__()
        self.config = cfg
        self.tokenizer = tokenizer
        self.vocabularies = vocabularies
        self.calibration: AspectCalibration | None = None  # temperatures of the aspect confidences (`explain`)
        if not cfg.has_backbone and dssm_embeddings is None and cfg.backbone.name_or_path and backbone_paths is None:
            dssm_embeddings = build_backbone(cfg.backbone).get_input_embeddings().weight.detach()
        self.query_tower = self._tower("query", backbone_paths, dssm_embeddings)
        self._doc_tower = None if cfg.shared_towers else self._tower("doc", backbone_paths, dssm_embeddings)
        self._check_lengths()
        self.aspect_predictor = self._aspect_predictor()
        self.field_attention = None if field_attention is None else FieldAttention(self.embedding_dim, field_attention)
        if cfg.has_backbone and backbone_paths is None:
            for tower in self.towers():
                loaded = bool(cfg.backbone.name_or_path) and tower.mlm_head.load_from_checkpoint(
                    cfg.backbone.name_or_path)
                if cfg.sparse_head and not loaded:  # e.g. e5, which ships no MLM head
                    tower.mlm_head.start_as_identity()

    @property
    def predicts_aspect_values(self) -> bool:
        """Whether the model scores aspect values (an aspect-learning objective and its vocabularies)."""
        return self.vocabularies is not None and bool(objective_keys(self.config))

    def restrict_sparse_terms(self, term_ids: list[int] | torch.Tensor) -> int:
        """The lean MLM head (`model.sparse_vocab_size`): every tower's sparse vector holds only `term_ids` (e.g.
        `corpus_term_ids` of the catalog's texts), special tokens dropped, and its decoder computes those rows
        only. Returns how many terms are kept."""
        if not self.config.has_sparse:
            raise ValueError(f"model {self.config.name} has no sparse head to restrict (model.sparse_head)")
        vocab = int(self.query_tower.word_embeddings.shape[0])
        ids = sorted({int(i) for i in term_ids} - set(self.tokenizer.all_special_ids))
        if not ids or ids[0] < 0 or ids[-1] >= vocab:
            raise ValueError(f"sparse terms must be a non-empty set of ids in [0, {vocab}), got {len(ids)} ids "
                             f"from {ids[0] if ids else None} to {ids[-1] if ids else None}")
        kept = torch.tensor(ids, dtype=torch.long, device=self.query_tower.word_embeddings.device)
        for tower in self.towers():
            tower.sparse_ids = kept.clone()
        self.config.sparse_vocab_size = len(ids)
        return len(ids)

    # -- construction -------------------------------------------------------------------------
    def _tower(self, side: str, backbone_paths: dict[str, str] | None, dssm_embeddings: torch.Tensor | None) -> Tower:
        cfg = self.config
        backbone = None
        if cfg.has_backbone:
            if backbone_paths:
                backbone = load_pretrained_backbone(backbone_paths[side])
            else:
                backbone = build_backbone(cfg.backbone, vocab_size=len(self.tokenizer))
        return Tower(cfg, backbone, len(self.tokenizer), self.tokenizer.pad_token_id or 0,
                     self.tokenizer.all_special_ids, dssm_embeddings)

    def _check_lengths(self) -> None:
        head = self.query_tower.head
        if self.query_tower.backbone is None:
            return
        extra = head.num_tokens if isinstance(head, AspectTokensHead) else 0
        limit = max_positions(self.query_tower.backbone)
        for name in ("max_query_length", "max_doc_length"):
            if getattr(self.config, name) + extra > limit:
                raise ValueError(f"model.{name}={getattr(self.config, name)} + {extra} aspect tokens exceeds the "
                                 f"backbone's max_position_embeddings={limit}")

    def _aspect_predictor(self) -> nn.Module | None:
        keys = objective_keys(self.config)
        if not keys:
            return None
        if self.vocabularies is None:
            raise ValueError(f"model {self.config.name} learns aspects and needs aspect vocabularies")
        if self.config.uses_granularities:
            tok = self.tokenizer
            ids = {k: value_token_matrix(self.vocabularies.get(a, g).values,
                                         lambda s: tok(s, add_special_tokens=False)["input_ids"])
                   for k, a, g in keys}
            return ValueEmbeddings(ids, self.query_tower.word_embeddings.detach(), self.config.value_embeddings)
        head = self.query_tower.head  # U_a is as wide as the E_a it scores: projected for MADRAL (Sec. 8.2)
        dim = head.aspect_dim if isinstance(head, AspectAttentionHead) else hidden_size(self.query_tower.backbone)
        return AspectClassifier({k: len(self.vocabularies.get(a, g)) for k, a, g in keys}, dim)

    # -- forward ------------------------------------------------------------------------------
    @property
    def doc_tower(self) -> Tower:
        return self.query_tower if self._doc_tower is None else self._doc_tower

    def towers(self) -> list[Tower]:
        return [self.query_tower] if self._doc_tower is None else [self.query_tower, self._doc_tower]

    def tower(self, side: str) -> Tower:
        if side not in ("query", "doc"):
            raise ValueError(f"side must be 'query' or 'doc', got {side!r}")
        return self.query_tower if side == "query" else self.doc_tower

    def encode(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, side: str) -> TowerOutput:
        """Run one tower and add the aspect scores from the shared tables."""
        tower = self.tower(side)
        out = tower(input_ids, attention_mask)
        if self.aspect_predictor is not None and out.aspect_repr:
            out.aspect_logits = self.aspect_predictor(out.aspect_repr, tower.word_embeddings)
        return out

    def similarity(self, q: torch.Tensor, d: torch.Tensor) -> torch.Tensor:
        """Raw similarity matrix [Bq, Bd]: cosine or dot product (paper 000 uses cosine, 001 dot)."""
        if self.config.similarity == "cosine":
            q, d = nn.functional.normalize(q, dim=-1), nn.functional.normalize(d, dim=-1)
        return q @ d.T

    def hybrid_scores(self, q: TowerOutput, d: TowerOutput, lam: float | None = None) -> torch.Tensor:
        """Paper 002 Eq. 1: lambda * <dense_q, dense_d> + (1 - lambda) * <sparse_q, sparse_d>, [Bq, Bd]."""
        if q.sparse is None or d.sparse is None:
            raise ValueError(f"model {self.config.name} has no sparse vectors (model.name=hybrid or model.sparse_head)")
        lam = self.config.hybrid_lambda if lam is None else lam
        if not 0.0 <= lam <= 1.0:
            raise ValueError(f"lambda must be in [0, 1], got {lam}")
        qd, dd = q.embedding, d.embedding
        if self.config.unit_dense:
            qd, dd = nn.functional.normalize(qd, dim=-1), nn.functional.normalize(dd, dim=-1)
        return lam * (qd @ dd.T) + (1.0 - lam) * (q.sparse @ d.sparse.T)

    def tokenize(self, texts: list[str], side: str) -> dict[str, torch.Tensor]:
        max_len = self.config.max_query_length if side == "query" else self.config.max_doc_length
        enc = self.tokenizer(self.config.prefixed(list(texts), side), padding=True, truncation=True,
                             max_length=max_len, return_tensors="pt")
        return {"input_ids": enc["input_ids"], "attention_mask": enc["attention_mask"]}

    @torch.no_grad()
    def encode_texts(self, texts: list[str], side: str, batch_size: int = 128) -> torch.Tensor:
        """Embeddings [N, d] of `texts` for search (eval mode, no grad), on the CPU whatever the model's device;
        cosine models are L2-normalised."""
        was_training = self.training
        self.eval()
        device = next(self.parameters()).device
        chunks = []
        for i in range(0, len(texts), batch_size):
            enc = self.tokenize(texts[i:i + batch_size], side)
            emb = self.encode(enc["input_ids"].to(device), enc["attention_mask"].to(device), side).embedding
            if self.config.similarity == "cosine":
                emb = nn.functional.normalize(emb, dim=-1)
            chunks.append(emb.float().cpu())
        self.train(was_training)
        dim = self.config.projection_dim or self.embedding_dim
        return torch.cat(chunks) if chunks else torch.empty(0, dim)

    @torch.no_grad()
    def encode_field_documents(self, queries: list[str], documents: list[list[str]],
                               batch_size: int = 128) -> FieldAttentionOutput:
        """Query-dependent document vectors (paper 004 Eq. 8-9): document i's fields attended by query i.

        `documents[i]` holds document i's field texts, the same fields in the same order for every document;
        an empty or blank text is a missing field (weight 0). Every field goes through the doc tower on its own,
        the query through the query tower. As in the click task's training (`ClickTask.loss`), a cosine model
        L2-normalises the query and the attended sum but not the fields. Returns the document vectors `[N, d]`
        and the field weights alpha `[N, F]`.
        """
        if self.field_attention is None:
            raise ValueError("this model has no field attention (build it with field_attention='additive')")
        if len(queries) != len(documents) or len({len(d) for d in documents}) > 1:
            raise ValueError(f"need one query per document and the same number of fields in each: "
                             f"{len(queries)} queries, field counts {sorted({len(d) for d in documents})}")
        was_training = self.training
        self.eval()
        cosine, chunks, weights = self.config.similarity == "cosine", [], []
        for i in range(0, len(queries), batch_size):
            cells = [[(t or "").strip() for t in doc] for doc in documents[i:i + batch_size]]
            mask = torch.tensor([[bool(t) for t in row] for row in cells])
            q_enc = self.tokenize(queries[i:i + batch_size], "query")
            q = self.encode(q_enc["input_ids"], q_enc["attention_mask"], "query").embedding
            f_enc = self.tokenize([t for row in cells for t in row], "doc")
            fields = self.encode(f_enc["input_ids"], f_enc["attention_mask"], "doc").embedding
            q = nn.functional.normalize(q, dim=-1) if cosine else q
            att = self.field_attention(q, fields.view(*mask.shape, -1), mask.to(q.device))
            chunks.append(nn.functional.normalize(att.embedding, dim=-1) if cosine else att.embedding)
            weights.append(att.weights)
        self.train(was_training)
        if not chunks:
            return FieldAttentionOutput(torch.empty(0, self.embedding_dim), torch.empty(0, 0))
        return FieldAttentionOutput(torch.cat(chunks), torch.cat(weights))

    @property
    def embedding_dim(self) -> int:
        if self.config.projection_dim:
            return self.config.projection_dim
        if self.query_tower.backbone is None:
            return self.query_tower.head.output_dim
        return hidden_size(self.query_tower.backbone)

    # -- save / load --------------------------------------------------------------------------
    def head_state_dict(self) -> dict[str, torch.Tensor]:
        """Every weight that is not inside a backbone (heads, projections, aspect tables, MLM heads)."""
        return {k: v.detach().contiguous() for k, v in self.state_dict().items() if ".backbone." not in k}

    def save(self, path: str | Path) -> Path:
        path = Path(path)
        path.mkdir(parents=True, exist_ok=True)
        (path / CONFIG_FILE).write_text(json.dumps(dataclasses.asdict(self.config), indent=2))
        self.tokenizer.save_pretrained(str(path / "tokenizer"))
        for side, tower in zip(("query", "doc"), self.towers(), strict=False):
            if tower.backbone is not None:
                tower.backbone.save_pretrained(str(path / f"{side}_backbone"), safe_serialization=True)
        save_file(self.head_state_dict(), str(path / HEADS_FILE))
        if self.vocabularies is not None:
            self.vocabularies.save(path / VOCAB_FILE)
        if self.field_attention is not None:
            (path / FIELD_ATTENTION_FILE).write_text(json.dumps({"scorer": self.field_attention.scorer}))
        else:
            (path / FIELD_ATTENTION_FILE).unlink(missing_ok=True)
        if self.calibration is not None:
            self.calibration.save(path)
        else:
            (path / CALIBRATION_FILE).unlink(missing_ok=True)
        return path

    @classmethod
    def load(cls, path: str | Path) -> BiEncoder:
        saved = SavedModel.read(path)
        cfg, state = saved.config, saved.heads
        table = state.get("query_tower.head.embeddings.weight") if not cfg.has_backbone else None
        model = cls(cfg, saved.tokenizer, saved.vocabularies, backbone_paths=saved.backbone_paths,
                    field_attention=saved.field_attention, dssm_embeddings=table)
        missing, unexpected = model.load_state_dict(state, strict=False)
        missing = [k for k in missing if ".backbone." not in k]
        if missing or unexpected:
            raise ValueError(f"{path / HEADS_FILE}: missing {missing[:5]}, unexpected {unexpected[:5]}")
        model.calibration = AspectCalibration.load(path)
        return model


@dataclasses.dataclass
class SavedModel:
    """What a saved model directory (`BiEncoder.save`) holds, read without building the model: its config,
    tokenizer, aspect vocabularies, where its backbones are, its field-attention scorer and its head weights."""

    path: Path
    config: ModelConfig
    tokenizer: PreTrainedTokenizerBase
    vocabularies: AspectVocabularies | None
    backbone_paths: dict[str, str] | None
    field_attention: str | None
    heads: dict[str, torch.Tensor]

    @classmethod
    def read(cls, path: str | Path) -> SavedModel:
        path = Path(path)
        if not (path / CONFIG_FILE).is_file():
            raise ValueError(f"{path}: not a madr model directory (no {CONFIG_FILE})")
        cfg = from_dict(ModelConfig, json.loads((path / CONFIG_FILE).read_text()))
        attention = path / FIELD_ATTENTION_FILE
        return cls(path=path, config=cfg, tokenizer=AutoTokenizer.from_pretrained(str(path / "tokenizer")),
                   vocabularies=AspectVocabularies.load(path / VOCAB_FILE) if (path / VOCAB_FILE).is_file() else None,
                   backbone_paths=saved_backbone_paths(path, cfg) if cfg.has_backbone else None,
                   field_attention=json.loads(attention.read_text())["scorer"] if attention.is_file() else None,
                   heads=load_file(str(path / HEADS_FILE)))


def saved_backbone_paths(path: Path, cfg: ModelConfig) -> dict[str, str]:
    """Where a saved model's towers keep their backbones (`BiEncoder.save`): one directory when shared."""
    query = str(path / "query_backbone")
    return {"query": query, "doc": query if cfg.shared_towers else str(path / "doc_backbone")}


def build_model(cfg: ModelConfig, tokenizer: PreTrainedTokenizerBase,
                vocabularies: AspectVocabularies | None = None) -> BiEncoder:
    """Build the bi-encoder named by `cfg.name` (see `ModelConfig`)."""
    return BiEncoder(cfg, tokenizer, vocabularies)
