"""The tasks of paper 004's multi-task training (Sec. III): a record type, how to batch it, and its loss.

Eq. 1 minimises `sum_i L_i(theta, D_i)` over T tasks; a task is "a training dataset along with its loss
function" (Sec. III-B). Each task here turns a list of records into a `TaskBatch` of tensors (`make_batch`,
tokenising only: it needs no model, so data workers can run it) and computes its loss on a `BiEncoder`
(`loss`). Tasks are `nn.Module`s so that a task with weights of its own (the field attention of Eq. 8-9)
hands them to the optimiser through `parameters()` and to checkpoints through `state_dict()`.

| task | records | loss | towers |
|---|---|---|---|
| `ClickTask` | `ClickRecord` (clicked only) | `TripletLoss`, in-batch negatives, L1 (Eq. 3-7), per-record weights | query -> query, document -> doc |
| `NLITask` | `NLIRecord` (no contradictions) | `NLICosineLoss` (Eq. 2) | hypothesis -> query, premise -> doc |
| `TranslationTask` | `ParallelRecord` | `TranslationLoss`, in-batch softmax (bridge task) | both -> doc |

Which tower a sentence goes through: paper 004 trains one encoder for everything ("we assume the same
encoding function is applied to both query and documents", Sec. II) and only later gives queries their own
smaller encoder by distillation (Sec. V-A); that is `ModelConfig.shared_towers=True`, where the side only
picks the maximum length (`max_query_length` / `max_doc_length`). With separate towers the defaults read
Eq. 2's `y^_j = f(q_j)^T f(d_j)` as a dual-encoder score: NLI hypotheses (short) take the query side and
premises the doc side, so the query-document similarity used at search time is the one trained. Parallel
sentences (WikiMatrix, document length) take the doc side on both ends so that neither is truncated to the
query length; pass `source_side="query"` to align queries across languages instead. Every side is a
constructor argument.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

import torch
import torch.nn.functional as F
from torch import nn
from transformers import PreTrainedTokenizerBase

from madr.data.records import ClickRecord, NLIRecord, ParallelRecord
from madr.losses import NLICosineLoss, TranslationLoss, TripletLoss, nli_targets, pairwise_distance
from madr.losses.triplet import weighted_mean
from madr.modeling.heads.field_attention import DEFAULT_SEP, FieldAttention, concat_fields
from madr.modeling.model import BiEncoder

SIDES = ("query", "doc")
Encoded = dict[str, torch.Tensor]  # {"input_ids": [N, L], "attention_mask": [N, L]}


class SideTokenizer:
    """Tokenises texts for one tower side with that side's maximum length (as `BiEncoder.tokenize`).

    Holds only the tokenizer, the two lengths and the sides' text prefixes (no model), so tasks can batch
    records in data workers.
    """

    def __init__(self, tokenizer: PreTrainedTokenizerBase, max_query_length: int, max_doc_length: int,
                 prefixes: dict[str, str] | None = None) -> None:
        self.tokenizer = tokenizer
        self.max_length = {"query": int(max_query_length), "doc": int(max_doc_length)}
        self.prefixes = dict(prefixes or {})

    @classmethod
    def from_model(cls, model: BiEncoder) -> SideTokenizer:
        return cls(model.tokenizer, model.config.max_query_length, model.config.max_doc_length,
                   model.config.text_prefixes)

    def __call__(self, texts: Sequence[str], side: str) -> Encoded:
        _check_side("side", side)
        prefix = self.prefixes.get(side, "")
        enc = self.tokenizer([prefix + t for t in texts], padding=True, truncation=True,
                             max_length=self.max_length[side], return_tensors="pt")
        return {"input_ids": enc["input_ids"], "attention_mask": enc["attention_mask"]}


@dataclass
class TaskBatch:
    """One batch of one task: tokenised texts by role (e.g. "query", "doc") and other tensors by name.

    `size` is the number of records the batch holds after the task dropped what it cannot use.
    """

    texts: dict[str, Encoded]
    tensors: dict[str, torch.Tensor] = field(default_factory=dict)
    size: int = 0

    def to(self, device: torch.device | str) -> TaskBatch:
        texts = {role: {k: v.to(device) for k, v in enc.items()} for role, enc in self.texts.items()}
        return TaskBatch(texts, {k: v.to(device) for k, v in self.tensors.items()}, self.size)


@runtime_checkable
class Task(Protocol):
    """What the multi-task trainer needs from a task (Eq. 1: one dataset D_i and its loss L_i)."""

    name: str
    record_type: type

    def accepts(self, record: Any) -> bool:
        """Whether the loss can use `record` (e.g. clicked pairs only, no contradictions)."""

    def make_batch(self, records: Sequence[Any]) -> TaskBatch:
        """Tokenise the usable records; ValueError if none is usable or a record has the wrong type."""

    def loss(self, model: BiEncoder, batch: TaskBatch) -> tuple[torch.Tensor, dict[str, float]]:
        """The scalar loss L_i on `batch` and named values to log."""

    def parameters(self) -> Any:
        """Trainable weights of the task itself (beyond the model's), e.g. field attention."""


class BaseTask(nn.Module):
    """Shared checks and encoding of the tasks below."""

    record_type: type = object

    def __init__(self, tokenizer: SideTokenizer, name: str) -> None:
        super().__init__()
        if not isinstance(tokenizer, SideTokenizer):
            raise ValueError(f"task {name!r}: tokenizer must be a SideTokenizer (SideTokenizer.from_model(model)), "
                             f"got {type(tokenizer).__name__}")
        self.name = name
        self.tokenize = tokenizer

    def accepts(self, record: Any) -> bool:
        return isinstance(record, self.record_type)

    def _usable(self, records: Sequence[Any]) -> list[Any]:
        """The usable records, after checking every record's type (ValueError names the first bad row)."""
        for i, record in enumerate(records):
            if not isinstance(record, self.record_type):
                raise ValueError(f"task {self.name!r}: record {i} is a {type(record).__name__}, expected "
                                 f"{self.record_type.__name__}")
        kept = [r for r in records if self.accepts(r)]
        if not kept:
            raise ValueError(f"task {self.name!r}: none of the {len(records)} records of this batch is usable")
        return kept

    @staticmethod
    def _embed(model: BiEncoder, enc: Encoded, side: str) -> torch.Tensor:
        return model.encode(enc["input_ids"], enc["attention_mask"], side).embedding


def _check_side(what: str, side: str) -> None:
    if side not in SIDES:
        raise ValueError(f"{what} must be one of {', '.join(SIDES)}, got {side!r}")


def group_ids(keys: Sequence[Any]) -> torch.Tensor:
    """`[N]` ints, equal exactly where the keys are equal (first occurrence order)."""
    seen: dict[Any, int] = {}
    return torch.tensor([seen.setdefault(k, len(seen)) for k in keys], dtype=torch.long)


# ---------------------------------------------------------------------------------------------- clicks


class ClickTask(BaseTask):
    """Clicked (query, document) pairs with the triplet loss and in-batch negatives (paper 004 Eq. 3-7).

    Args:
        tokenizer: `SideTokenizer.from_model(model)`.
        name: task name in the schedule.
        loss: the `TripletLoss` (default: L1 distance, the paper's best; semi-hard negatives; margin 1).
        field_order: document fields in the order they are used (default: each record's own order).
        sep: separator of the concatenated fields.
        field_attention: when given, documents are embedded by Eq. 8-9 instead of concatenation: every field
            through the doc tower, attended with the query; in-batch negatives are the other documents
            attended by the same query (`FieldAttention.grid`).
        normalize: L2-normalise the embeddings before the distances (default: when the model's similarity
            is cosine, i.e. the geometry `BiEncoder.encode_texts` searches in).

    Only clicked records are used (`accepts`); rows showing the same document (`doc_id`, else its text) are
    never each other's negatives. A record's `weight` weighs its hinge (`TripletLoss(weights=...)`: the
    clipped inverse propensity of a logged click, 1 by default) and its `negatives` (documents skipped above
    a click for its query) join the batch's in-batch negatives for that query alone; those need
    concatenated documents (no `field_attention`).
    """

    record_type = ClickRecord

    def __init__(self, tokenizer: SideTokenizer, name: str = "click", loss: TripletLoss | None = None,
                 field_order: Sequence[str] | None = None, sep: str = DEFAULT_SEP,
                 field_attention: FieldAttention | None = None, normalize: bool | None = None) -> None:
        super().__init__(tokenizer, name)
        self.triplet = loss if loss is not None else TripletLoss(distance="l1")
        self.field_order = None if field_order is None else list(field_order)
        self.sep = sep
        self.field_attention = field_attention
        self.normalize = normalize

    def accepts(self, record: Any) -> bool:
        return isinstance(record, ClickRecord) and bool(record.clicked)

    def _doc_key(self, record: ClickRecord) -> str:
        return record.doc_id or concat_fields(record.fields, self.field_order, self.sep)

    def make_batch(self, records: Sequence[Any]) -> TaskBatch:
        kept = self._usable(records)
        for i, r in enumerate(kept):
            if not r.query.strip():
                raise ValueError(f"task {self.name!r}: clicked record {i} (doc {r.doc_id!r}) has an empty query")
        texts = {"query": self.tokenize([r.query for r in kept], "query")}
        tensors = {"doc_ids": group_ids([self._doc_key(r) for r in kept]),
                   "weights": torch.tensor([float(r.weight) for r in kept], dtype=torch.float32)}
        if self.field_attention is None:
            texts["doc"] = self.tokenize([concat_fields(r.fields, self.field_order, self.sep) for r in kept], "doc")
            width = max(len(r.negatives) for r in kept)
            if width:
                rows = [list(r.negatives.values()) for r in kept]
                texts["negatives"] = self.tokenize([t for row in rows for t in row + [""] * (width - len(row))],
                                                   "doc")
                tensors["negative_mask"] = torch.tensor([[j < len(row) for j in range(width)] for row in rows])
        elif any(r.negatives for r in kept):
            raise ValueError(f"task {self.name!r}: skip negatives need concatenated documents, not field attention")
        else:
            names = self.field_order or list(dict.fromkeys(k for r in kept for k in r.fields))
            cells = [[(r.fields.get(n) or "").strip() for n in names] for r in kept]
            for i, row in enumerate(cells):
                if not any(row):
                    raise ValueError(f"task {self.name!r}: clicked record {i} has no non-empty field among {names}")
            texts["fields"] = self.tokenize([c for row in cells for c in row], "doc")
            tensors["field_mask"] = torch.tensor([[bool(c) for c in row] for row in cells])
        return TaskBatch(texts, tensors, len(kept))

    def _normalise(self, model: BiEncoder, x: torch.Tensor) -> torch.Tensor:
        on = model.config.similarity == "cosine" if self.normalize is None else self.normalize
        return F.normalize(x, dim=-1) if on else x

    def loss(self, model: BiEncoder, batch: TaskBatch) -> tuple[torch.Tensor, dict[str, float]]:
        q = self._normalise(model, self._embed(model, batch.texts["query"], "query"))
        doc_ids = batch.tensors["doc_ids"]
        if self.field_attention is None:
            d = self._normalise(model, self._embed(model, batch.texts["doc"], "doc"))
            negatives, mask = None, batch.tensors.get("negative_mask")
            if mask is not None:
                flat = self._normalise(model, self._embed(model, batch.texts["negatives"], "doc"))
                negatives = flat.view(mask.shape[0], mask.shape[1], -1)
            loss = self.triplet(q, d, negatives, positive_ids=doc_ids, negative_mask=mask,
                                weights=batch.tensors.get("weights"))
            positive = pairwise_distance(q, d, self.triplet.distance)
            return loss, {"triplet": float(loss.detach()), "positive_distance": float(positive.detach().mean())}
        mask = batch.tensors["field_mask"]
        fields = self._embed(model, batch.texts["fields"], "doc").view(mask.shape[0], mask.shape[1], -1)
        att = self.field_attention.grid(q, fields, mask)
        docs = self._normalise(model, att.embedding)
        valid = doc_ids[:, None] != doc_ids[None, :]
        loss, positive = grid_triplet_loss(self.triplet, q, docs, valid, batch.tensors.get("weights"))
        return loss, {"triplet": float(loss.detach()), "positive_distance": float(positive.detach().mean())}


def grid_triplet_loss(loss: TripletLoss, q: torch.Tensor, docs: torch.Tensor, valid: torch.Tensor,
                      weights: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Eq. 3-7 when each query sees its own version of every document (field attention, Eq. 8-9).

    `q [B, d]`; `docs [B, B, d]`, row i = the batch's documents as attended by query i, the positive of query
    i at column i; `valid [B, B]`: which columns may be query i's negatives. Same negative selection
    (`TripletLoss.select_negatives`) and (weighted) averaging as `loss` itself; returns (loss, positive distances
    [B]).
    """
    batch = q.shape[0]
    if docs.shape[:2] != (batch, batch) or valid.shape != (batch, batch):
        raise ValueError(f"docs {tuple(docs.shape)} must be [{batch}, {batch}, d] and valid [{batch}, {batch}]")
    rows = torch.arange(batch, device=q.device)
    dist = pairwise_distance(q[:, None, :], docs, loss.distance)  # [B, B]
    dist_ap = dist[rows, rows]
    valid = valid & ~torch.eye(batch, dtype=torch.bool, device=q.device)
    mask = TripletLoss.select_negatives(dist_ap, dist, loss.negatives, loss.margin, valid, loss.generator,
                                        loss.semi_hard_fallback)
    count = mask.sum(dim=1)
    if loss.negatives == "batch_all" and loss.batch_all_average == "embedding":
        normaliser = count + 1 if loss.batch_all_normaliser == "paper" else count
        centroid = torch.einsum("bn,bnd->bd", mask.to(docs.dtype), docs) / normaliser.clamp_min(1)[:, None]
        hinge = F.relu(dist_ap - pairwise_distance(q, centroid, loss.distance) + loss.margin)
    else:
        hinge = (F.relu(dist_ap[:, None] - dist + loss.margin) * mask).sum(dim=1) / count.clamp_min(1)
    return weighted_mean(hinge * (count > 0), weights), dist_ap


# ---------------------------------------------------------------------------------------------- NLI


class NLITask(BaseTask):
    """NLI pairs with Eq. 2's cross entropy on the clipped cosine; contradictions are dropped (Sec. III).

    Args:
        tokenizer: `SideTokenizer.from_model(model)`.
        name: task name in the schedule.
        loss: the `NLICosineLoss` (default: the paper's `max(0, cos)` mapping).
        dataset: how labels are read by `nli_targets` ("snli", "mnli", "xnli": three-way; "qnli":
            entailment / not_entailment). `NLIRecord` labels are three-way strings, hence "snli".
        premise_side, hypothesis_side: towers of the two sentences (see the module docstring).
    """

    record_type = NLIRecord

    def __init__(self, tokenizer: SideTokenizer, name: str = "nli", loss: NLICosineLoss | None = None,
                 dataset: str = "snli", premise_side: str = "doc", hypothesis_side: str = "query") -> None:
        super().__init__(tokenizer, name)
        _check_side("premise_side", premise_side)
        _check_side("hypothesis_side", hypothesis_side)
        nli_targets([], dataset)  # validates the dataset name
        self.nli = loss if loss is not None else NLICosineLoss()
        self.dataset = dataset
        self.premise_side, self.hypothesis_side = premise_side, hypothesis_side

    def accepts(self, record: Any) -> bool:
        return isinstance(record, NLIRecord) and bool(nli_targets([record.label], self.dataset).keep)

    def make_batch(self, records: Sequence[Any]) -> TaskBatch:
        for i, r in enumerate(records):
            if not isinstance(r, NLIRecord):
                raise ValueError(f"task {self.name!r}: record {i} is a {type(r).__name__}, expected NLIRecord")
        try:
            targets = nli_targets([r.label for r in records], self.dataset)
        except ValueError as err:
            raise ValueError(f"task {self.name!r}: {err}") from err
        if not targets.keep:
            raise ValueError(f"task {self.name!r}: all {len(records)} records of this batch are contradictions "
                             "or unlabelled")
        kept = [records[i] for i in targets.keep]
        texts = {"premise": self.tokenize([r.premise for r in kept], self.premise_side),
                 "hypothesis": self.tokenize([r.hypothesis for r in kept], self.hypothesis_side)}
        return TaskBatch(texts, {"targets": torch.tensor(targets.targets, dtype=torch.float32)}, len(kept))

    def loss(self, model: BiEncoder, batch: TaskBatch) -> tuple[torch.Tensor, dict[str, float]]:
        u = self._embed(model, batch.texts["premise"], self.premise_side)
        v = self._embed(model, batch.texts["hypothesis"], self.hypothesis_side)
        targets = batch.tensors["targets"].to(u.dtype)
        loss = self.nli(u, v, targets)
        with torch.no_grad():
            accuracy = ((self.nli.probability(u, v) > 0.5).to(u.dtype) == targets).to(u.dtype).mean()
        return loss, {"nli": float(loss.detach()), "accuracy": float(accuracy)}


# ---------------------------------------------------------------------------------------------- translation


class TranslationTask(BaseTask):
    """Parallel sentences, the bridge task aligning languages (paper 004 Sec. III; `TranslationLoss`).

    Which objective: in-batch softmax (the default), not MSE to the English side. Paper 004 trains one
    encoder from the start on every task, so there is no frozen English teacher to regress onto; with one
    trainable encoder on both sides, MSE only pulls pairs together and is minimised by collapsing every
    sentence to one point, whereas the softmax also pushes each sentence away from the batch's other
    translations (the translation-ranking bridge task of the paper's reference [13]) and keeps the shared
    space discriminative for retrieval. `TranslationLoss(objective="mse")` remains available for the
    setting where the English side comes from a frozen encoder (Reimers & Gurevych 2020).

    Args:
        tokenizer: `SideTokenizer.from_model(model)`.
        name: task name in the schedule.
        loss: the `TranslationLoss` (default: symmetric in-batch softmax over cosines, temperature 0.05).
        source_side, target_side: towers of the non-English and the English side (default both "doc",
            see the module docstring).

    Rows with the same English sentence are not each other's negatives (`target_ids`).
    """

    record_type = ParallelRecord

    def __init__(self, tokenizer: SideTokenizer, name: str = "translation", loss: TranslationLoss | None = None,
                 source_side: str = "doc", target_side: str = "doc") -> None:
        super().__init__(tokenizer, name)
        _check_side("source_side", source_side)
        _check_side("target_side", target_side)
        self.translation = loss if loss is not None else TranslationLoss()
        self.source_side, self.target_side = source_side, target_side

    def accepts(self, record: Any) -> bool:
        return isinstance(record, ParallelRecord) and bool(record.source.strip()) and bool(record.target.strip())

    def make_batch(self, records: Sequence[Any]) -> TaskBatch:
        kept = self._usable(records)
        texts = {"source": self.tokenize([r.source for r in kept], self.source_side),
                 "target": self.tokenize([r.target for r in kept], self.target_side)}
        return TaskBatch(texts, {"target_ids": group_ids([r.target.strip() for r in kept])}, len(kept))

    def loss(self, model: BiEncoder, batch: TaskBatch) -> tuple[torch.Tensor, dict[str, float]]:
        src = self._embed(model, batch.texts["source"], self.source_side)
        tgt = self._embed(model, batch.texts["target"], self.target_side)
        ids = batch.tensors["target_ids"]
        loss = self.translation(src, tgt, target_ids=ids)
        parts = {"translation": float(loss.detach())}
        if self.translation.objective == "softmax":
            with torch.no_grad():
                best = self.translation.logits(src, tgt).argmax(dim=1)
                parts["accuracy"] = float((ids[best] == ids).float().mean())
        return loss, parts
