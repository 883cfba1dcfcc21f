"""One schema per source, and one normalised schema per task.

Sources (their public layouts; the first column name listed is the source's own, the others are accepted
aliases):

| source | task | layout |
|---|---|---|
| `clicks` | click | query + document fields (`fields` object, or title / description / body / url columns), clicked / clicks / impressions / position (optional), language; or a binary relevance `label` (Good/Bad, True/False, 1/0) as a click stand-in (XGLUE QADSM / QAM) |
| `snli` | nli | sentence1, sentence2, gold_label ('-' = no consensus: skipped) |
| `mnli` | nli | SNLI's columns + genre |
| `qnli` | nli | question, sentence, label entailment / not_entailment (-> neutral) |
| `xnli` | nli | premise, hypothesis, label 0/1/2 or strings (also sentence1 / sentence2 / gold_label), language |
| `wikimatrix` | parallel | TSV without header: margin score, sentence in language 1, sentence in language 2 |
| `tatoeba` | parallel | lang, text, text_eng (the LASER Tatoeba release) |
| `esci` | aspect | query, product_id, product_title, product_description, product_brand, product_color, category, esci_label E/S/C/I |
| `hetpqa` | evidence | qid, question, candidate, source, label (+ ASIN, qa_pair_id, confidence, ...) |
| `epqa` | evidence | hetPQA's columns with a graded label 0/1/2 (+ title, answer): label = 1 iff grade 2 |
| `semipqa` | evidence | qid, qa_pair_id, question, candidate (a JSON attribute), label: source "attribute" |
| `ubi_events` | click_event | UBI events: action_name, query_id, session_id, user_query, object_id, position, dwell_time (`madr.clicks.events`) |
| `ubi_queries` | click_event | UBI queries: query_id, user_query (each row the `search` event of its search) |
| `impressions` | click_event | one shown document per row: query, doc_id, position, clicked (+ search_id, session_id, dwell_time, purchased) |
| `esci_judgments` | judgment | query, product_id, esci_label E/S/C/I or rating 100/10/1/0 (no product text: qrels) |

Normalised task schemas carry the fields of the record types in `madr.data.records` (`ClickRecord`,
`NLIRecord`, `ParallelRecord`, `EvidenceRecord`); the aspect task follows the catalog layout of
`madr.data.schema` (multi-valued aspects as list<string> columns, ESCI label + 0-4 grade). The judgment
task holds graded query-product pairs without product text (evaluation qrels, joined to a catalog by
product id); it is not tokenised. The click_event task holds click-log events, which
`pipelines.data.click_log` groups by search into impressions (`madr.clicks.collapse`); it is not tokenised.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import PurePosixPath
from typing import Any

import pyarrow as pa

from madr.clicks.events import EVENT_SCHEMA, impression_row, ubi_event, ubi_query
from madr.data.records import (
    EVIDENCE_SOURCES,
    NLI_LABELS,
    ClickRecord,
    EvidenceRecord,
    NLIRecord,
    ParallelRecord,
)
from madr.data.validation import MISSING, BadRow, Fields, SkipRow

FORMATS = ("jsonl", "tsv", "parquet")
ASPECTS = ("brand", "color", "category")
ESCI_RELEVANCE = {"E": 3, "S": 2, "C": 1, "I": 0}  # the lowest grade madr.data.synthetic.catalog gives each label
_STR_MAP = pa.map_(pa.string(), pa.string())

TASK_SCHEMAS: dict[str, pa.Schema] = {
    "nli": pa.schema([("premise", pa.string()), ("hypothesis", pa.string()), ("label", pa.string()),
                      ("language", pa.string())]),
    "click": pa.schema([("query", pa.string()), ("fields", _STR_MAP), ("clicked", pa.bool_()),
                        ("position", pa.int32()), ("impressions", pa.int32()), ("clicks", pa.int32()),
                        ("language", pa.string()), ("query_id", pa.string()), ("doc_id", pa.string()),
                        ("relevance", pa.int32()), ("weight", pa.float64()), ("negatives", _STR_MAP)]),
    "parallel": pa.schema([("source", pa.string()), ("target", pa.string()), ("source_lang", pa.string()),
                           ("target_lang", pa.string()), ("score", pa.float64())]),
    "evidence": pa.schema([("question_id", pa.string()), ("question", pa.string()), ("evidence_id", pa.string()),
                           ("evidence", pa.string()), ("source", pa.string()), ("label", pa.int8()),
                           ("product_id", pa.string()), ("split", pa.string()), ("extra", _STR_MAP)]),
    "aspect": pa.schema([("query_id", pa.string()), ("query", pa.string()), ("product_id", pa.string()),
                         ("title", pa.string()), ("description", pa.string()), ("esci", pa.string()),
                         ("relevance", pa.int8()), ("language", pa.string())]
                        + [(a, pa.list_(pa.string())) for a in ASPECTS]),
    "judgment": pa.schema([("query_id", pa.string()), ("query", pa.string()), ("product_id", pa.string()),
                           ("esci", pa.string()), ("relevance", pa.int8()), ("language", pa.string())]),
    "click_event": EVENT_SCHEMA,
}
TASKS = tuple(TASK_SCHEMAS)
RECORD_TYPES = {"nli": NLIRecord, "click": ClickRecord, "parallel": ParallelRecord, "evidence": EvidenceRecord}


@dataclass(frozen=True)
class SourceOptions:
    """Per-run options of a source.

    language: language of rows that carry none (default: the source's, "en"; XNLI: from the file name).
    max_chars: longest accepted text field (default: the source's `max_chars`).
    min_score: WikiMatrix margin threshold (rows below are skipped; default 1.04, the LASER paper's).
    languages: WikiMatrix (column-2 language, column-3 language); default: from `WikiMatrix.xx-yy.tsv`.
    default_label: ESCI label of rows without a label column (e.g. "E" for an Exact-only sample).
    split: the split written into evidence rows.
    """

    language: str | None = None
    max_chars: int | None = None
    min_score: float | None = None
    languages: tuple[str, str] | None = None
    default_label: str | None = None
    split: str = "train"


Normalize = Callable[[Fields, SourceOptions, str], dict[str, Any]]


@dataclass(frozen=True)
class SourceSpec:
    """How to read one source: its task, formats, TSV layout, text limit, columns and row normaliser."""

    name: str
    task: str
    normalize: Normalize
    columns: Mapping[str, tuple[str, ...]]  # normalised field -> accepted column names (documentation)
    formats: tuple[str, ...] = FORMATS
    tsv_header: bool = True
    tsv_columns: tuple[str, ...] = ()  # column names of a headerless TSV
    max_chars: int = 10_000
    description: str = ""
    label_values: tuple[str, ...] = field(default_factory=tuple)

    @property
    def schema(self) -> pa.Schema:
        return TASK_SCHEMAS[self.task]


# -- NLI ------------------------------------------------------------------------------------------------
_NLI = {name: name for name in NLI_LABELS} | {"0": "entailment", "1": "neutral", "2": "contradiction"}
_NO_CONSENSUS = {"-": "no_consensus", "-1": "no_consensus"}
_QNLI = {"entailment": "entailment", "not_entailment": "neutral", "0": "entailment", "1": "neutral"}
_XNLI_LANGS = ("ar", "bg", "de", "el", "en", "es", "fr", "hi", "ru", "sw", "th", "tr", "ur", "vi", "zh")
_XNLI_FILE_LANG = re.compile(r"(?:^|[._-])(" + "|".join(_XNLI_LANGS) + r")(?=[._-]|$)")


def _nli(premise: tuple[str, ...], hypothesis: tuple[str, ...], labels: Mapping[str, str],
         language_from_file: bool = False, genre: bool = False) -> Normalize:
    def normalize(f: Fields, opts: SourceOptions, file: str) -> dict[str, Any]:
        label = f.choice(("gold_label", "label"), labels, skip=_NO_CONSENSUS if labels is _NLI else None)
        if genre:
            f.text(("genre",), required=False)
        language = f.text(("language", "lang"), required=False) or opts.language
        if language is None and language_from_file:
            found = _XNLI_FILE_LANG.findall(PurePosixPath(file).name.lower())
            if len(found) != 1:
                raise BadRow("missing_field", "language",
                             f"no language column, no --language option, and the file name gives {found or 'none'}")
            language = found[0]
        return {"premise": f.text(premise), "hypothesis": f.text(hypothesis), "label": label,
                "language": language or "en"}

    return normalize


# -- click logs -----------------------------------------------------------------------------------------
DOC_FIELDS = {"title": ("title", "doc_title", "ad_title"),
              "description": ("description", "doc_description", "ad_description", "snippet"),
              "body": ("body", "passage", "doc_body", "text"),
              "url": ("url", "doc_url")}
_BINARY = {"good": 1, "bad": 0, "true": 1, "false": 0, "1": 1, "0": 0}


def _clicks(f: Fields, opts: SourceOptions, file: str) -> dict[str, Any]:
    query = f.text(("query", "q", "query_text", "question"))
    fields = f.string_map(("fields", "document"))
    if fields is None:
        fields = {}
        for name, aliases in DOC_FIELDS.items():
            value = f.text(aliases, required=False)
            if value:
                fields[name] = value
    fields = {k: v for k, v in fields.items() if v.strip()}
    if not fields:
        raise BadRow("empty_text", "fields", "the document has no non-empty field "
                                             "(title/description/body/url or a 'fields' object)")
    impressions = f.integer(("impressions",), minimum=1, default=1)
    clicks = f.integer(("clicks",), minimum=0)
    label = f.choice(("label",), _BINARY, required=False)
    name, raw = f.find(("clicked", "click"))
    clicked = None
    if raw is not MISSING:
        clicked = raw if isinstance(raw, bool) else bool(f.choice((name,), _BINARY))
    if clicked is None:
        clicked = clicks > 0 if clicks is not None else (bool(label) if label is not None else None)
    if clicked is None:
        raise BadRow("missing_field", "clicked", "no clicked, clicks or label field")
    if clicks is None:
        clicks = int(clicked)
    if clicked != (clicks > 0):
        raise BadRow("bad_value", "clicks", f"clicked={clicked} but clicks={clicks}")
    if clicks > impressions:
        raise BadRow("bad_value", "clicks", f"clicks={clicks} > impressions={impressions}")
    relevance = f.integer(("relevance",), minimum=0)
    return {"query": query, "fields": fields, "clicked": clicked,
            "position": f.integer(("position", "rank"), minimum=1), "impressions": impressions, "clicks": clicks,
            "language": f.text(("language", "lang", "market"), required=False) or opts.language or "en",
            "query_id": f.ident(("query_id", "qid")), "doc_id": f.ident(("doc_id", "document_id", "url_id")),
            "relevance": relevance if relevance is not None else label}


# -- parallel -------------------------------------------------------------------------------------------
_WIKIMATRIX_FILE = re.compile(r"wikimatrix\.([a-z]{2,3})-([a-z]{2,3})\b", re.IGNORECASE)
MIN_WIKIMATRIX_SCORE = 1.04


def _wikimatrix(f: Fields, opts: SourceOptions, file: str) -> dict[str, Any]:
    score = f.number(("score",), required=True)
    first, second = f.text(("sentence1",)), f.text(("sentence2",))
    langs = opts.languages
    if langs is None:
        m = _WIKIMATRIX_FILE.search(PurePosixPath(file).name)
        if m is None:
            raise BadRow("missing_field", "languages",
                         f"the file name {PurePosixPath(file).name!r} is not WikiMatrix.xx-yy.tsv; pass languages")
        langs = (m.group(1).lower(), m.group(2).lower())
    threshold = MIN_WIKIMATRIX_SCORE if opts.min_score is None else opts.min_score
    if score < threshold:
        raise SkipRow("below_threshold")
    if langs[0] == "en" and langs[1] != "en":  # keep the English side as the target
        return {"source": second, "target": first, "source_lang": langs[1], "target_lang": "en", "score": score}
    return {"source": first, "target": second, "source_lang": langs[0], "target_lang": langs[1], "score": score}


def _tatoeba(f: Fields, opts: SourceOptions, file: str) -> dict[str, Any]:
    return {"source": f.text(("text", "source")), "target": f.text(("text_eng", "target")),
            "source_lang": f.text(("lang", "source_lang")), "target_lang": "eng",
            "score": f.number(("score",))}


# -- aspect (ESCI-like) ---------------------------------------------------------------------------------
_ESCI = {"e": "E", "exact": "E", "s": "S", "substitute": "S", "c": "C", "complement": "C",
         "i": "I", "irrelevant": "I"}
_LOCALE_LANGUAGE = {"us": "en", "es": "es", "jp": "ja"}


def _esci(f: Fields, opts: SourceOptions, file: str) -> dict[str, Any]:
    query = f.text(("query", "query_text"))
    label = f.choice(("esci_label", "label", "esci"), _ESCI, required=opts.default_label is None)
    if label is None:
        label = _ESCI.get(opts.default_label.strip().lower())
        if label is None:
            raise BadRow("unknown_label", "esci_label", f"default_label {opts.default_label!r} is not E/S/C/I")
    description = f.text(("product_description", "description"), required=False, allow_empty=True) or ""
    bullets = f.text(("product_bullet_point", "bullet_point"), required=False, allow_empty=True) or ""
    locale = f.text(("product_locale", "language", "locale"), required=False)
    return {"query_id": f.ident(("query_id", "qid")), "query": query,
            "product_id": f.ident(("product_id", "asin", "ASIN"), required=True),
            "title": f.text(("product_title", "title")), "description": description or bullets,
            "esci": label, "relevance": ESCI_RELEVANCE[label],
            "language": opts.language or _LOCALE_LANGUAGE.get((locale or "").lower(), locale or "en"),
            "brand": f.values(("product_brand", "brand")),
            "color": f.values(("product_color", "color", "colour")),
            "category": f.values(("category", "product_category", "product_type"))}


# -- product-QA evidence (hetPQA) -----------------------------------------------------------------------
_EVIDENCE_SOURCES = {"osp": "osp", "bullet": "bullet", "bullets": "bullet", "desc": "description",
                     "description": "description", "attribute": "attribute", "attributes": "attribute",
                     "cqa": "cqa", "review": "review", "reviews": "review"}
assert set(_EVIDENCE_SOURCES.values()) == set(EVIDENCE_SOURCES)


def _evidence(f: Fields, opts: SourceOptions, label: Callable[[], int]) -> dict[str, Any]:
    out = {"question_id": f.ident(("qid", "question_id"), required=True), "question": f.text(("question",)),
           "evidence_id": f.ident(("cid", "candidate_id", "evidence_id", "qa_pair_id")),
           "evidence": f.text(("candidate", "evidence")),
           "source": f.choice(("source", "source_type"), _EVIDENCE_SOURCES),
           "label": label(), "product_id": f.ident(("ASIN", "asin", "product_id")), "split": opts.split}
    out["extra"] = {k: str(v) for k, v in f.unused().items()
                    if isinstance(v, str | int | float) and not isinstance(v, bool)}
    return out


def _hetpqa(f: Fields, opts: SourceOptions, file: str) -> dict[str, Any]:
    return _evidence(f, opts, lambda: f.choice(("label",), _BINARY | {"yes": 1, "no": 0}))


def _epqa(f: Fields, opts: SourceOptions, file: str) -> dict[str, Any]:
    """ePQA: hetPQA's layout with a graded label. In the public dev file a grade-2 candidate answers the
    question, a grade-1 one is related but does not answer it: label 1 iff grade 2 (the grade stays in
    `extra["grade"]`, with the title and the reference answer)."""
    seen: dict[str, int] = {}

    def label() -> int:
        seen["grade"] = f.choice(("label",), {"0": 0, "1": 1, "2": 2})
        return int(seen["grade"] == 2)

    out = _evidence(f, opts, label)
    out["extra"]["grade"] = str(seen["grade"])
    return out


def _semipqa(f: Fields, opts: SourceOptions, file: str) -> dict[str, Any]:
    """semiPQA attribute ranking: every candidate is a product attribute (JSON text), no ASIN."""
    return {"question_id": f.ident(("qid", "question_id"), required=True), "question": f.text(("question",)),
            "evidence_id": f.ident(("qa_pair_id", "cid", "candidate_id")), "evidence": f.text(("candidate",)),
            "source": "attribute", "label": f.choice(("label",), _BINARY), "product_id": f.ident(("ASIN", "asin")),
            "split": opts.split, "extra": {}}


_RATING = {"100": "E", "10": "S", "1": "C", "0": "I"}  # the ESCI-S judgments file's rating column


def _esci_judgment(f: Fields, opts: SourceOptions, file: str) -> dict[str, Any]:
    name, _ = f.find(("esci_label", "label", "rating"))
    label = f.choice((name,), _RATING if name == "rating" else _ESCI)
    locale = f.text(("product_locale", "language", "locale"), required=False)
    return {"query_id": f.ident(("query_id", "qid")), "query": f.text(("query", "query_text")),
            "product_id": f.ident(("product_id", "asin", "ASIN"), required=True), "esci": label,
            "relevance": ESCI_RELEVANCE[label],
            "language": opts.language or _LOCALE_LANGUAGE.get((locale or "").lower(), locale or "en")}


SOURCES: dict[str, SourceSpec] = {
    "clicks": SourceSpec("clicks", "click", _clicks,
                         {"query": ("query", "q", "query_text", "question"),
                          "fields": ("fields", "document", *[a for v in DOC_FIELDS.values() for a in v]),
                          "clicked": ("clicked", "click", "clicks", "label"), "position": ("position", "rank"),
                          "impressions": ("impressions",), "language": ("language", "lang", "market")},
                         description="multilingual click log (or a query-document relevance stand-in)"),
    "snli": SourceSpec("snli", "nli", _nli(("sentence1", "premise"), ("sentence2", "hypothesis"), _NLI),
                       {"premise": ("sentence1", "premise"), "hypothesis": ("sentence2", "hypothesis"),
                        "label": ("gold_label", "label")}, max_chars=2_000, label_values=NLI_LABELS,
                       description="SNLI: gold_label '-' (no consensus) rows are skipped"),
    "mnli": SourceSpec("mnli", "nli", _nli(("sentence1", "premise"), ("sentence2", "hypothesis"), _NLI, genre=True),
                       {"premise": ("sentence1", "premise"), "hypothesis": ("sentence2", "hypothesis"),
                        "label": ("gold_label", "label"), "genre": ("genre",)}, max_chars=2_000,
                       label_values=NLI_LABELS, description="MultiNLI: SNLI's layout plus genre"),
    "qnli": SourceSpec("qnli", "nli", _nli(("question",), ("sentence",), _QNLI),
                       {"premise": ("question",), "hypothesis": ("sentence",), "label": ("label",)},
                       max_chars=2_000, label_values=("entailment", "not_entailment"),
                       description="QNLI: not_entailment maps to neutral"),
    "xnli": SourceSpec("xnli", "nli", _nli(("premise", "sentence1"), ("hypothesis", "sentence2"), _NLI,
                                           language_from_file=True),
                       {"premise": ("premise", "sentence1"), "hypothesis": ("hypothesis", "sentence2"),
                        "label": ("label", "gold_label"), "language": ("language", "lang")},
                       max_chars=2_000, label_values=NLI_LABELS,
                       description="XNLI: labels 0/1/2 or strings; language from a column, --language or the file name"),
    "wikimatrix": SourceSpec("wikimatrix", "parallel", _wikimatrix,
                             {"score": ("score",), "source": ("sentence1",), "target": ("sentence2",)},
                             formats=("tsv",), tsv_header=False, tsv_columns=("score", "sentence1", "sentence2"),
                             max_chars=5_000,
                             description="WikiMatrix TSV without header: score, sentence, sentence"),
    "tatoeba": SourceSpec("tatoeba", "parallel", _tatoeba,
                          {"source": ("text", "source"), "target": ("text_eng", "target"),
                           "source_lang": ("lang", "source_lang")}, max_chars=5_000,
                          description="Tatoeba pairs (LASER release): lang, text, text_eng"),
    "esci": SourceSpec("esci", "aspect", _esci,
                       {"query": ("query",), "product_id": ("product_id", "asin"),
                        "title": ("product_title", "title"), "description": ("product_description", "description"),
                        "brand": ("product_brand", "brand"), "color": ("product_color", "color", "colour"),
                        "category": ("category", "product_category"), "esci": ("esci_label", "label")},
                       max_chars=100_000, label_values=("E", "S", "C", "I"),
                       description="ESCI-style aspect-annotated query-product pairs"),
    "hetpqa": SourceSpec("hetpqa", "evidence", _hetpqa,
                         {"question_id": ("qid",), "question": ("question",), "evidence": ("candidate",),
                          "source": ("source",), "label": ("label",), "product_id": ("ASIN",)},
                         max_chars=100_000, label_values=("0", "1"),
                         description="hetPQA evidence ranking: sources OSP/bullet/Desc/attribute/CQA/review"),
    "epqa": SourceSpec("epqa", "evidence", _epqa,
                       {"question_id": ("qid",), "question": ("question",), "evidence": ("candidate",),
                        "source": ("source",), "label": ("label",), "product_id": ("ASIN",)},
                       max_chars=100_000, label_values=("0", "1", "2"),
                       description="ePQA evidence ranking: graded 0/1/2, label = 1 iff grade 2 (answers)"),
    "semipqa": SourceSpec("semipqa", "evidence", _semipqa,
                          {"question_id": ("qid",), "question": ("question",), "evidence": ("candidate",),
                           "label": ("label",)}, max_chars=100_000, label_values=("0", "1"),
                          description="semiPQA attribute ranking: JSON attributes as evidence"),
    "esci_judgments": SourceSpec("esci_judgments", "judgment", _esci_judgment,
                                 {"query": ("query",), "product_id": ("product_id", "asin"),
                                  "esci": ("esci_label", "label", "rating")},
                                 max_chars=10_000, label_values=("E", "S", "C", "I", "100", "10", "1", "0"),
                                 description="ESCI judgments without product text (qrels): label or rating"),
    "ubi_events": SourceSpec("ubi_events", "click_event", ubi_event,
                             {"search_id": ("query_id",), "action": ("action_name",), "doc_id": ("object_id",),
                              "position": ("position",), "query": ("user_query",), "dwell": ("dwell_time",)},
                             formats=("jsonl", "parquet"), description="UBI events (OpenSearch User Behavior Insights)"),
    "ubi_queries": SourceSpec("ubi_queries", "click_event", ubi_query,
                              {"search_id": ("query_id",), "query": ("user_query",)}, formats=("jsonl", "parquet"),
                              description="UBI queries: the query text of each search"),
    "impressions": SourceSpec("impressions", "click_event", impression_row,
                              {"query": ("query",), "doc_id": ("doc_id", "product_id"), "position": ("position",),
                               "clicked": ("clicked", "click", "clicks"), "search_id": ("search_id", "query_id")},
                              formats=("jsonl", "parquet"), description="plain impressions / clicks log"),
}


def get_source(name: str) -> SourceSpec:
    if name not in SOURCES:
        raise ValueError(f"unknown source {name!r}; known sources: {', '.join(SOURCES)}")
    return SOURCES[name]


_DEFAULTED = ("weight", "negatives")


def to_record(row: Mapping[str, Any], task: str) -> Any:
    """A normalised row (a dict as `Dataset.take` gives it) -> its `madr.data.records` dataclass."""
    if task not in RECORD_TYPES:
        raise ValueError(f"task {task!r} has no record type (record tasks: {', '.join(RECORD_TYPES)})")
    values = dict(row)
    for key in ("fields", "extra", "negatives"):
        if values.get(key) is not None and not isinstance(values[key], dict):
            values[key] = dict(values[key])  # Arrow maps come back as (key, value) pairs (a list or an array)
    for key in _DEFAULTED:
        if key in values and values[key] is None:
            del values[key]  # a source without the column: the record's default (weight 1, no negatives)
    names = RECORD_TYPES[task].__dataclass_fields__
    return RECORD_TYPES[task](**{k: v for k, v in values.items() if k in names})
