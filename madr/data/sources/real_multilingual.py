"""Real public sources of the multilingual multi-task encoder (paper 004 Sec. III-A) as madr records.

The paper trains one encoder on clicks, NLI (SNLI / MNLI / XNLI) and WikiMatrix translation pairs. The real
stand-ins in `../shared/data/` (README there) and what each becomes:

* clicks -> `ClickRecord`: XGLUE QADSM German query-ad relevance (`query`, `ad_title`, `ad_description`,
  label Good / Bad; Good = "clicked", fields title + description) or XGLUE QAM German question-passage
  matching (`question`, `passage`, label 1 / 0, True / False; field passage). `relevance` keeps the label
  (1 / 0) for evaluation only; `query_id` is the lower-cased query, `doc_id` a hash of the document text,
  so identical ads share an id and are never each other's in-batch negatives.
* NLI -> `NLIRecord`: XGLUE XNLI German (`premise`, `hypothesis`, `label` entailment / neutral /
  contradiction, or HF's 0 / 1 / 2) and the SNLI dev subset (`sentence1`, `sentence2`, `gold_label`; "-" =
  no annotator consensus: skipped and counted).
* translation -> `ParallelRecord`: Tatoeba as published with LASER (`lang` ISO 639-3, `text`, `text_eng`),
  target = the English side.

Held-out sets never share their key with training (`load_real_multilingual`): click training rows whose
query occurs in the evaluation file are dropped (XGLUE's QADSM train and dev share 722 of the dev's 813
queries); XNLI training rows whose premise occurs in the dev file are dropped; SNLI (one file) is split by
premise; Tatoeba is split by English sentence, so a held-out English sentence was never trained on in any
language. Every bad row raises ValueError naming the file, the row and the field.
"""

from __future__ import annotations

import hashlib
import random
from collections.abc import Sequence
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq

from madr.data.records import NLI_LABELS, ClickRecord, MultilingualData, NLIRecord, ParallelRecord
from madr.data.sources.parquet_rows import read_rows, text_field

CLICK_LAYOUTS = {"qadsm": ("query", "ad_title", "ad_description", "label"),
                 "qam": ("question", "passage", "label")}
CLICK_LABELS = {"good": True, "bad": False, "1": True, "0": False, "true": True, "false": False}
XNLI_COLUMNS = ("premise", "hypothesis", "label")
SNLI_COLUMNS = ("sentence1", "sentence2", "gold_label")
SNLI_NO_CONSENSUS = "-"
HF_NLI_LABELS = {"0": "entailment", "1": "neutral", "2": "contradiction"}
TATOEBA_COLUMNS = ("lang", "text", "text_eng")


# ------------------------------------------------------------------------------------------------ readers


def click_layout(path: str | Path) -> str:
    """"qadsm" or "qam", from the file's columns (ValueError naming the file when neither fits)."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"{path}: not found")
    names = set(pq.read_schema(path).names)
    for layout, columns in CLICK_LAYOUTS.items():
        if set(columns) <= names:
            return layout
    raise ValueError(f"{path}: neither the QADSM columns {list(CLICK_LAYOUTS['qadsm'])} nor the QAM columns "
                     f"{list(CLICK_LAYOUTS['qam'])}; has {sorted(names)}")


def _doc_id(fields: dict[str, str]) -> str:
    text = "\t".join(f"{k}={v.lower()}" for k, v in fields.items())
    return "doc:" + hashlib.sha1(text.encode("utf-8")).hexdigest()[:16]


def read_click_pairs(path: str | Path, language: str = "de") -> list[ClickRecord]:
    """QADSM or QAM rows (layout from the columns, see the module docstring) as judged `ClickRecord`s."""
    path = Path(path)
    layout = click_layout(path)
    out = []
    for i, row in enumerate(read_rows(path, CLICK_LAYOUTS[layout])):
        label = CLICK_LABELS.get(str(row["label"]).strip().lower())
        if label is None:
            raise ValueError(f"{path}: row {i}: field 'label' is {row['label']!r}, expected one of "
                             f"{sorted(CLICK_LABELS)} (case-insensitive)")
        if layout == "qadsm":
            query = text_field(path, i, row, "query")
            fields = {"title": text_field(path, i, row, "ad_title"),
                      "description": text_field(path, i, row, "ad_description", required=False)}
        else:
            query, fields = text_field(path, i, row, "question"), {"passage": text_field(path, i, row, "passage")}
        out.append(ClickRecord(query=query, fields=fields, clicked=label, clicks=int(label), language=language,
                               query_id="q:" + query.lower(), doc_id=_doc_id(fields), relevance=int(label)))
    return out


def _nli_label(path: Path, i: int, value: Any, name: str) -> str:
    key = str(value).strip().lower()
    label = HF_NLI_LABELS.get(key, key)
    if label not in NLI_LABELS:
        raise ValueError(f"{path}: row {i}: field {name!r} is {value!r}, expected one of {list(NLI_LABELS)} "
                         f"or 0 / 1 / 2")
    return label


def read_xnli(path: str | Path, language: str = "de") -> list[NLIRecord]:
    """XNLI-layout rows (premise, hypothesis, label) as `NLIRecord`s in `language`."""
    path = Path(path)
    return [NLIRecord(text_field(path, i, row, "premise"), text_field(path, i, row, "hypothesis"),
                      _nli_label(path, i, row["label"], "label"), language)
            for i, row in enumerate(read_rows(path, XNLI_COLUMNS))]


def read_snli(path: str | Path) -> tuple[list[NLIRecord], int]:
    """SNLI-layout rows (sentence1, sentence2, gold_label) as English `NLIRecord`s, and how many rows had
    no consensus label ("-") and were skipped."""
    path = Path(path)
    out, skipped = [], 0
    for i, row in enumerate(read_rows(path, SNLI_COLUMNS)):
        if str(row["gold_label"]).strip() == SNLI_NO_CONSENSUS:
            skipped += 1
            continue
        out.append(NLIRecord(text_field(path, i, row, "sentence1"), text_field(path, i, row, "sentence2"),
                             _nli_label(path, i, row["gold_label"], "gold_label"), "en"))
    return out, skipped


def read_tatoeba(path: str | Path, languages: Sequence[str] | None = None) -> list[ParallelRecord]:
    """Tatoeba rows (lang, text, text_eng) as `ParallelRecord`s X -> English, only `languages` when given."""
    path = Path(path)
    wanted = None if languages is None else set(languages)
    out = []
    for i, row in enumerate(read_rows(path, TATOEBA_COLUMNS)):
        lang = text_field(path, i, row, "lang")
        if wanted is None or lang in wanted:
            out.append(ParallelRecord(text_field(path, i, row, "text"), text_field(path, i, row, "text_eng"), lang, "eng"))
    if wanted is not None:
        absent = sorted(wanted - {r.source_lang for r in out})
        if absent:
            raise ValueError(f"{path}: no rows for language(s) {absent}")
    return out


# ------------------------------------------------------------------------------------------------ splits


def split_keys(keys: Sequence[str], eval_fraction: float, seed: int) -> set[str]:
    """The held-out share of the distinct `keys` (sorted, shuffled with `seed`, first `eval_fraction`)."""
    if not 0.0 < eval_fraction < 1.0:
        raise ValueError(f"eval_fraction must be in (0, 1), got {eval_fraction}")
    distinct = sorted(set(keys))
    random.Random(seed).shuffle(distinct)
    return set(distinct[:round(eval_fraction * len(distinct))])


def _per_language(records: Sequence[ParallelRecord], cap: int | None, seed: int) -> list[ParallelRecord]:
    """At most `cap` records per source language (a seeded sample, original order kept)."""
    if cap is None:
        return list(records)
    rng, keep = random.Random(seed), set()
    for lang in sorted({r.source_lang for r in records}):
        rows = [i for i, r in enumerate(records) if r.source_lang == lang]
        keep.update(rows if len(rows) <= cap else rng.sample(rows, cap))
    return [r for i, r in enumerate(records) if i in keep]


@dataclass
class RealMultilingualConfig:
    """Which real files feed the three tasks and how they are held out (configs/real/multitask.yaml,
    `real_data:`). Paths are relative to `data_dir`; see the module docstring for the splits."""

    data_dir: str = "../shared/data"
    click_train: str | list[str] = "query_relevance/xglue_qadsm_de_train.parquet"
    click_eval: str | list[str] = "query_relevance/xglue_qadsm_de_dev.parquet"
    click_language: str = "de"
    xnli_train: str = "nli/xglue_xnli_de_train.parquet"
    xnli_eval: str = "nli/xglue_xnli_de_dev.parquet"
    xnli_language: str = "de"
    snli: str | None = "nli/snli_dev_subset.parquet"
    snli_eval_fraction: float = 0.5
    parallel: str = "parallel/tatoeba_parallel_dev.parquet"
    parallel_languages: list[str] | None = field(default_factory=lambda: ["deu", "fra", "spa", "ita", "nld", "rus"])
    parallel_eval_fraction: float = 0.3
    parallel_train_per_language: int | None = None
    parallel_eval_per_language: int | None = None
    split_seed: int = 0

    def __post_init__(self) -> None:
        for name in ("snli_eval_fraction", "parallel_eval_fraction"):
            value = getattr(self, name)
            if not 0.0 < value < 1.0:
                raise ValueError(f"real_data.{name} must be in (0, 1), got {value}")
        for name in ("parallel_train_per_language", "parallel_eval_per_language"):
            value = getattr(self, name)
            if value is not None and value < 1:
                raise ValueError(f"real_data.{name} must be >= 1 or null, got {value}")
        if self.parallel_languages is not None and not self.parallel_languages:
            raise ValueError("real_data.parallel_languages must not be empty (null: every language of the file)")
        for name in ("click_train", "click_eval"):
            if not click_files(getattr(self, name)):
                raise ValueError(f"real_data.{name} must name at least one file")


@dataclass
class RealMultilingualSplits(MultilingualData):
    """The real sets as `MultilingualData` (training records per task, held-out sets), plus what was read and
    dropped (`summary`)."""

    summary: dict[str, Any] = field(default_factory=dict)


def click_files(value: str | Sequence[str]) -> list[str]:
    """`real_data.click_train` / `click_eval` as a list: one path or several (QADSM and QAM together)."""
    return [value] if isinstance(value, str) else list(value)


def _read_clicks(root: Path, value: str | Sequence[str], language: str) -> list[ClickRecord]:
    return [r for name in click_files(value) for r in read_click_pairs(root / name, language)]


def _clicks(cfg: RealMultilingualConfig, root: Path, summary: dict[str, Any]) -> tuple[list[ClickRecord], ...]:
    train = _read_clicks(root, cfg.click_train, cfg.click_language)
    held = _read_clicks(root, cfg.click_eval, cfg.click_language)
    eval_queries = {r.query_id for r in held}
    kept = [r for r in train if r.query_id not in eval_queries]
    summary.update(click_train_rows=len(train), click_train_dropped_eval_query=len(train) - len(kept),
                   click_train_clicked=sum(r.clicked for r in kept), click_eval_rows=len(held),
                   click_eval_queries=len(eval_queries),
                   click_eval_queries_both_labels=_queries_with_both_labels(held))
    return kept, held


def _queries_with_both_labels(records: Sequence[ClickRecord]) -> int:
    labels: dict[str, set[int]] = {}
    for r in records:
        labels.setdefault(r.query_id, set()).add(int(r.relevance or 0))
    return sum(len(v) == 2 for v in labels.values())


def _nli(cfg: RealMultilingualConfig, root: Path, summary: dict[str, Any]) -> tuple[list[NLIRecord], ...]:
    xtrain = read_xnli(root / cfg.xnli_train, cfg.xnli_language)
    xeval = read_xnli(root / cfg.xnli_eval, cfg.xnli_language)
    premises = {r.premise for r in xeval}
    train = [r for r in xtrain if r.premise not in premises]
    held = list(xeval)
    summary.update(xnli_train_rows=len(xtrain), xnli_train_dropped_eval_premise=len(xtrain) - len(train),
                   xnli_eval_rows=len(xeval))
    if cfg.snli:
        snli, skipped = read_snli(root / cfg.snli)
        held_premises = split_keys([r.premise for r in snli], cfg.snli_eval_fraction, cfg.split_seed)
        snli_train = [r for r in snli if r.premise not in held_premises]
        train += snli_train
        held += [r for r in snli if r.premise in held_premises]
        summary.update(snli_rows=len(snli), snli_skipped_no_consensus=skipped, snli_train_rows=len(snli_train),
                       snli_eval_rows=len(snli) - len(snli_train))
    summary["nli_train_usable"] = sum(r.label != "contradiction" for r in train)
    return train, held


def _parallel(cfg: RealMultilingualConfig, root: Path, summary: dict[str, Any]) -> tuple[list[ParallelRecord], ...]:
    pairs = read_tatoeba(root / cfg.parallel, cfg.parallel_languages)
    held_english = split_keys([r.target for r in pairs], cfg.parallel_eval_fraction, cfg.split_seed)
    train = _per_language([r for r in pairs if r.target not in held_english], cfg.parallel_train_per_language,
                          cfg.split_seed)
    held = _per_language([r for r in pairs if r.target in held_english], cfg.parallel_eval_per_language,
                         cfg.split_seed + 1)
    summary.update(parallel_rows=len(pairs), parallel_train=len(train), parallel_eval=len(held),
                   parallel_eval_english_candidates=len({r.target for r in held}))
    return train, held


def load_real_multilingual(cfg: RealMultilingualConfig | None = None) -> RealMultilingualSplits:
    """Read every configured file and build the train / held-out sets (see the module docstring)."""
    cfg = cfg or RealMultilingualConfig()
    root = Path(cfg.data_dir)
    summary: dict[str, Any] = {"data_dir": str(root)}
    clicks_train, clicks_eval = _clicks(cfg, root, summary)
    nli_train, nli_eval = _nli(cfg, root, summary)
    parallel_train, parallel_eval = _parallel(cfg, root, summary)
    splits = RealMultilingualSplits(clicks_train, clicks_eval, nli_train, nli_eval, parallel_train, parallel_eval,
                                    summary)
    empty = [f.name for f in fields(MultilingualData) if not getattr(splits, f.name)]
    if empty:
        raise ValueError(f"real multilingual data under {root}: empty set(s) {empty}")
    return splits
