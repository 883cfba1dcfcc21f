"""A BEIR directory as a madr catalog: `corpus.jsonl`, `queries.jsonl`, `qrels/{train,dev,test}.tsv`.

The layout every BEIR data set ships in (Thakur et al., 2021), local or on any pyarrow filesystem:

- `corpus.jsonl`: one JSON object per line, `_id` (string or integer), `title` (optional, may be empty),
  `text` (may be empty when the title is not); an optional `metadata` object;
- `queries.jsonl`: `_id`, `text`, optional `metadata` (and `language`, default "en");
- `qrels/<split>.tsv`: header `query-id corpus-id score`, one judgment per line. A TREC qrels file
  (`qid 0 docid rel`, `madr.data.trec`) can stand in for any split (`qrels={"test": "qrels.trec"}`).

To the catalog (`madr.data.schema`): a document is a product (`product_id` = `_id`, `title`, `description` =
`text`; a document without a title takes its text as the title, since a catalog product has one); a query
gets the split of the qrels file that judges it; a judgment keeps its integer grade and the ESCI stand-in
of that grade (0 I, 1 C, 2 S, >= 3 E: the inverse of `pipelines.data.sources.ESCI_RELEVANCE`). Aspect values
come from the `metadata` object when it has a key named like an aspect (a string or a list of strings).

Validation, as for every source (`madr.data.validation`): a line that is not a JSON object, a missing or
empty `_id`, a missing `text`, a document with neither title nor text, a repeated id, a judgment naming an
unknown query or document, a grade outside 0-4, a pair judged twice or a query judged in two splits is a
quarantined row (file, line, field, reason, raw line), never dropped silently; queries no read split judges
are counted as skipped (`unjudged`). `write_quarantine` (`madr.data.line_files`) writes them in the
quarantine layout of `pipelines.data`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import pyarrow.fs as pafs

from madr.data import quarantine
from madr.data.line_files import FileResult, summarize, validate_file, write_quarantine
from madr.data.schema import MAX_RELEVANCE, MIN_RELEVANCE, SPLITS, Catalog, Judgment, Product, Query
from madr.data.trec import read_qrels, unknown_id
from madr.data.validation import MISSING, BadRow, Fields

CORPUS_FILE, QUERIES_FILE, QRELS_DIR = "corpus.jsonl", "queries.jsonl", "qrels"
SOURCE = "beir"
DOC_MAX_CHARS, QUERY_MAX_CHARS = 1_000_000, 10_000
_ESCI_OF_GRADE = {0: "I", 1: "C", 2: "S"}


def esci_of_grade(grade: int) -> str:
    """The ESCI stand-in a catalog judgment needs: 0 I, 1 C, 2 S, 3-4 E."""
    return _ESCI_OF_GRADE.get(grade, "E")


@dataclass
class BeirRead:
    """A BEIR directory read: its catalog, and per file what validation kept, skipped and quarantined."""

    catalog: Catalog
    files: list[FileResult]
    where: str

    @property
    def summary(self) -> quarantine.IngestSummary:
        return summarize(self.files, SOURCE)

    def write_quarantine(self, directory: str, filesystem: pafs.FileSystem | None = None) -> quarantine.IngestSummary:
        """The quarantine directory of this read (bad rows, counts, summary.json); raises NoGoodRowsError
        for a file whose every row was quarantined (a wrong layout), after writing it."""
        summary = write_quarantine(directory, self.files, SOURCE, filesystem)
        quarantine.check_files_have_good_rows(summary, directory)
        return summary


def _join(base: str, *parts: str) -> str:
    return "/".join([base.rstrip("/"), *parts])


def _aspects(f: Fields, names: Sequence[str]) -> dict[str, list[str]]:
    _, meta = f.find(("metadata",))
    if meta is MISSING or not names:
        return {a: [] for a in names}
    if not isinstance(meta, dict):
        raise BadRow("wrong_type", "metadata", f"expected a JSON object, got {type(meta).__name__}")
    inner = Fields(meta, f.max_chars)
    try:
        return {a: inner.values((a,)) for a in names}
    except BadRow as err:
        raise BadRow(err.reason, f"metadata.{err.field}", err.detail) from None


def read_corpus(uri: str, aspect_names: Sequence[str] = (), *, filesystem: pafs.FileSystem | None = None,
                max_chars: int = DOC_MAX_CHARS, display: str | None = None) -> FileResult:
    """corpus.jsonl -> good rows {product: Product}."""
    seen: set[str] = set()

    def normalize(f: Fields, _options: Any, _file: str) -> dict[str, Any]:
        doc_id = f.ident(("_id",), required=True)
        title = f.text(("title",), required=False, allow_empty=True) or ""
        text = f.text(("text",), allow_empty=True)
        if not title.strip() and not text.strip():
            raise BadRow("empty_text", "text", "the document has neither a title nor a text")
        aspects = _aspects(f, aspect_names)
        if doc_id in seen:
            raise BadRow("duplicate_id", "_id", f"document {doc_id!r} appears on an earlier line")
        seen.add(doc_id)
        product = Product(doc_id, title, text, aspects) if title.strip() else Product(doc_id, text, "", aspects)
        return {"product": product}

    return validate_file(uri, normalize, fmt="jsonl", max_chars=max_chars, source=SOURCE, filesystem=filesystem,
                         display=display)


def read_queries(uri: str, aspect_names: Sequence[str] = (), *, filesystem: pafs.FileSystem | None = None,
                 max_chars: int = QUERY_MAX_CHARS, display: str | None = None) -> FileResult:
    """queries.jsonl -> good rows {query_id, text, language, aspects} (split still unknown)."""
    seen: set[str] = set()

    def normalize(f: Fields, _options: Any, _file: str) -> dict[str, Any]:
        query_id = f.ident(("_id",), required=True)
        text = f.text(("text",))
        language = f.text(("language",), required=False) or "en"
        aspects = _aspects(f, aspect_names)
        if query_id in seen:
            raise BadRow("duplicate_id", "_id", f"query {query_id!r} appears on an earlier line")
        seen.add(query_id)
        return {"query_id": query_id, "text": text, "language": language, "aspects": aspects}

    return validate_file(uri, normalize, fmt="jsonl", max_chars=max_chars, source=SOURCE, filesystem=filesystem,
                         display=display)


def read_split_qrels(uri: str, split: str, queries: Mapping[str, Any], docs: set[str] | None,
                     split_of: dict[str, str], pairs: set[tuple[str, str]], *,
                     filesystem: pafs.FileSystem | None = None, where: str = "",
                     display: str | None = None) -> FileResult:
    """One split's qrels (BEIR TSV or TREC) checked against the queries and documents read; `split_of`
    (query -> split) and `pairs` are updated with the good judgments. `docs=None` skips the document check."""

    def check(query_id: str, doc_id: str, relevance: int, f: Fields) -> dict[str, Any]:
        qfield, dfield = ("query-id", "corpus-id") if "query-id" in f.row else ("qid", "docid")
        if query_id not in queries:
            raise unknown_id(qfield, "query", query_id, f"{where}{QUERIES_FILE}")
        if docs is not None and doc_id not in docs:
            raise unknown_id(dfield, "document", doc_id, f"{where}{CORPUS_FILE}")
        if not MIN_RELEVANCE <= relevance <= MAX_RELEVANCE:
            raise BadRow("bad_value", "score" if qfield == "query-id" else "rel",
                         f"grade {relevance} outside [{MIN_RELEVANCE}, {MAX_RELEVANCE}] (madr's graded relevance)")
        other = split_of.get(query_id, split)
        if other != split:
            raise BadRow("bad_value", qfield, f"query {query_id!r} is judged in split {other!r} too; "
                                              "a query belongs to one split")
        if (query_id, doc_id) in pairs:
            raise BadRow("duplicate_id", dfield, f"pair ({query_id!r}, {doc_id!r}) is judged on an earlier line")
        split_of[query_id] = split
        pairs.add((query_id, doc_id))
        return {"query_id": query_id, "doc_id": doc_id, "relevance": relevance, "split": split}

    return read_qrels(uri, check, filesystem=filesystem, source=SOURCE, display=display)


def qrels_files(directory: str, qrels: Mapping[str, str] | None = None, splits: Sequence[str] = SPLITS,
                filesystem: pafs.FileSystem | None = None) -> dict[str, tuple[str, pafs.FileSystem, str]]:
    """split -> (name, filesystem, path) of its qrels file: `qrels[split]` where given (a path or URI, in
    `filesystem` when one is given), else `<directory>/qrels/<split>.tsv` for each split of `splits` that
    exists. No file at all is an error naming the directory."""
    unknown = sorted(set(qrels or {}) - set(SPLITS))
    if unknown:
        raise ValueError(f"qrels: unknown split(s) {unknown}; splits are {list(SPLITS)}")
    if qrels:
        return {s: (qrels[s], *quarantine.resolve(qrels[s], filesystem)) for s in splits if s in qrels}
    fs, base = quarantine.resolve(directory, filesystem)
    found = {}
    for split in splits:
        path = _join(base, QRELS_DIR, f"{split}.tsv")
        if fs.get_file_info(path).type == pafs.FileType.File:
            found[split] = (_join(directory, QRELS_DIR, f"{split}.tsv"), fs, path)
    if not found:
        raise ValueError(f"{_join(directory, QRELS_DIR)}: no qrels file of split(s) {list(splits)} "
                         f"(expected {QRELS_DIR}/<split>.tsv)")
    return found


def read_beir(directory: str, *, qrels: Mapping[str, str] | None = None, splits: Sequence[str] = SPLITS,
              aspect_names: Sequence[str] = (), filesystem: pafs.FileSystem | None = None,
              check_docs: bool = True) -> BeirRead:
    """Read and validate a BEIR directory (module docstring) into a catalog of the judged queries of
    `splits`. `qrels` replaces `<directory>/qrels/<split>.tsv` per split (BEIR TSV or TREC files, paths
    or URIs). `filesystem` is the pyarrow filesystem of `directory` (and of `qrels`); by default it is
    inferred from the URI (`file://`, `s3://`, ...) or the local one."""
    fs, base = quarantine.resolve(directory, filesystem)
    if fs.get_file_info(base).type != pafs.FileType.Directory:
        raise ValueError(f"{directory}: BEIR directory not found")
    names = list(aspect_names)
    corpus = read_corpus(_join(base, CORPUS_FILE), names, filesystem=fs, display=_join(directory, CORPUS_FILE))
    queries = read_queries(_join(base, QUERIES_FILE), names, filesystem=fs, display=_join(directory, QUERIES_FILE))
    products = [g["product"] for g in corpus.good]
    by_query = {g["query_id"]: g for g in queries.good}
    split_of: dict[str, str] = {}
    pairs: set[tuple[str, str]] = set()
    docs = {p.product_id for p in products} if check_docs else None
    judged = []
    for split, (name, qrels_fs, path) in qrels_files(directory, qrels, splits, filesystem).items():
        judged.append(read_split_qrels(path, split, by_query, docs, split_of, pairs, filesystem=qrels_fs,
                                       where=directory.rstrip("/") + "/", display=name))
    queries.skip_good(lambda g: g["query_id"] in split_of, "unjudged")
    catalog = Catalog(
        products,
        [Query(g["query_id"], g["text"], g["aspects"], split_of[g["query_id"]], g["language"]) for g in queries.good],
        [Judgment(r["query_id"], r["doc_id"], r["relevance"], esci_of_grade(r["relevance"]))
         for result in judged for r in result.good],
        names)
    catalog.validate({"products": corpus.file, "queries": queries.file, "judgments": "qrels"})
    return BeirRead(catalog, [corpus, queries, *judged], directory)
