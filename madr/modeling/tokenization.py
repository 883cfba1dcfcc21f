"""Tokenizers: a WordPiece vocabulary trained in process on a catalog, and offline-friendly loading.

Tiny backbones (tests, the synthetic demo) have no pretrained tokenizer, so we train a BERT-style
WordPiece on the catalog text (the same normaliser / pre-tokenizer as BERT; paper 001 Sec. 5.3.1 uses
"the BERT tokenizer" for the token-granularity value vocabularies).

Pitfall (transformers 5): `BertTokenizerFast(vocab_file=...)` silently ignores the file and builds a
5-token vocabulary of special tokens; the vocabulary must be passed as `vocab=`. The trained tokenizer is
therefore rebuilt with `vocab=<path to vocab.txt>`, written with `save_pretrained`, and both checked for
the expected size.

Accents: BERT's normaliser strips combining marks when it lowercases (`strip_accents=None` follows
`lowercase`): é -> e, й -> и, أ -> ا, lossy for Cyrillic and Arabic and for accented Latin. Multilingual
use (paper 004's vocabulary covers Latin, Cyrillic, CJK and Arabic text) should lowercase but keep the
marks: `lowercase=True, strip_accents=False` (`MULTILINGUAL`). The choice is saved with the tokenizer
(`tokenizer_config.json`), so `load_tokenizer(out_dir)` gives the same normaliser back.

Determinism: the `tokenizers` WordPiece trainer creates its continuing-subword pieces ("##x") in hash-map
iteration order, and their ids break ties between equally frequent merges, so the same text can train a
different vocabulary in every process (huggingface/tokenizers#1794, fix proposed in PR #2066). We register
every "##x" of the training text up front, sorted, as trainer tokens: the ids, hence the tie-breaks and the
vocabulary, are then the same on every run (checked in tests/madr/modeling/test_multilingual_tokenizer.py).

Alphabet: the WordPiece trainer keeps at most `limit_alphabet` distinct characters (the `tokenizers`
default 1000) and maps the rest to [UNK]; CJK text easily has more, so pass a larger value or None (no
limit) for such corpora.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterable
from pathlib import Path

from transformers import AutoTokenizer, BertTokenizerFast, PreTrainedTokenizerBase

SPECIAL_TOKENS = ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")
MODEL_MAX_LENGTH = 512
DEFAULT_LIMIT_ALPHABET = 1000  # the `tokenizers` WordPiece trainer's default
_NO_LIMIT = 2**31 - 1
MULTILINGUAL = {"lowercase": True, "strip_accents": False}  # keyword arguments for multilingual text


def _vocab_size(path: Path) -> int:
    return sum(1 for line in path.read_text(encoding="utf-8").splitlines() if line)


def _from_vocab(vocab_path: Path, lowercase: bool, strip_accents: bool | None = None) -> BertTokenizerFast:
    """`BertTokenizerFast` over a WordPiece vocab.txt (passed as `vocab=`, see the module docstring).

    `strip_accents=None` strips exactly when lowercasing (BERT's rule); False keeps accents even lowercased.
    """
    tok = BertTokenizerFast(vocab=str(vocab_path), do_lower_case=lowercase, strip_accents=strip_accents,
                            model_max_length=MODEL_MAX_LENGTH)
    expected = _vocab_size(vocab_path)
    if len(tok) != expected:
        raise ValueError(f"tokenizer built from {vocab_path} has {len(tok)} tokens, the file has {expected}")
    return tok


def _continuing_pieces(trainer: object, texts: list[str]) -> list[str]:
    """Sorted "##x" for every character that continues a word of `texts` (after the trainer's own normaliser
    and pre-tokenizer): given to the trainer up front so that its vocabulary is deterministic (docstring)."""
    backend = trainer._tokenizer  # the `tokenizers.Tokenizer` the trainer wraps
    chars: set[str] = set()
    for text in texts:
        for word, _ in backend.pre_tokenizer.pre_tokenize_str(backend.normalizer.normalize_str(text)):
            chars.update(word[1:])
    return ["##" + c for c in sorted(chars)]


def train_wordpiece_tokenizer(
    texts: Iterable[str],
    vocab_size: int = 2000,
    lowercase: bool = True,
    out_dir: str | None = None,
    min_frequency: int = 1,
    strip_accents: bool | None = None,
    limit_alphabet: int | None = DEFAULT_LIMIT_ALPHABET,
) -> BertTokenizerFast:
    """Train a BERT WordPiece tokenizer on `texts` and return it as a `BertTokenizerFast`.

    `vocab_size` is an upper bound: a small corpus yields fewer pieces. The tokenizer is written to
    `out_dir` as `vocab.txt` plus the `save_pretrained` files, so `load_tokenizer(out_dir)` /
    `AutoTokenizer.from_pretrained(out_dir)` give it back; `out_dir=None`: in memory only, no files left behind
    (`save_pretrained` writes it where it should stay).
    `strip_accents`: None follows `lowercase` (BERT), False keeps accents (multilingual: `**MULTILINGUAL`).
    `limit_alphabet`: at most this many distinct characters enter the vocabulary (None: no limit).
    """
    from tokenizers import BertWordPieceTokenizer

    if vocab_size <= len(SPECIAL_TOKENS):
        raise ValueError(f"vocab_size must exceed the {len(SPECIAL_TOKENS)} special tokens, got {vocab_size}")
    if limit_alphabet is not None and (isinstance(limit_alphabet, bool) or limit_alphabet < 1):
        raise ValueError(f"limit_alphabet must be an int >= 1 or None (no limit), got {limit_alphabet!r}")
    texts = [t for t in texts if t and t.strip()]
    if not texts:
        raise ValueError("train_wordpiece_tokenizer: no non-empty text to train on")
    trainer = BertWordPieceTokenizer(lowercase=lowercase, strip_accents=strip_accents)
    trainer.train_from_iterator(
        texts,
        vocab_size=vocab_size,
        min_frequency=min_frequency,
        limit_alphabet=_NO_LIMIT if limit_alphabet is None else int(limit_alphabet),
        special_tokens=[*SPECIAL_TOKENS, *_continuing_pieces(trainer, texts)],
        show_progress=False,
    )
    if out_dir is None:  # the files are read once into the tokenizer, then removed
        with tempfile.TemporaryDirectory(prefix="madr_tok_") as tmp:
            trainer.save_model(tmp)
            return _from_vocab(Path(tmp) / "vocab.txt", lowercase, strip_accents)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    trainer.save_model(str(out))
    tok = _from_vocab(out / "vocab.txt", lowercase, strip_accents)
    tok.save_pretrained(str(out))
    return tok


def _offline() -> bool:
    return os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in ("1", "true", "yes", "on")


def load_tokenizer(name_or_path: str | os.PathLike, lowercase: bool = True,
                   strip_accents: bool | None = None) -> PreTrainedTokenizerBase:
    """A tokenizer from a local path first, then the local HF cache, then (only when not offline) the hub.

    Accepted local forms: a `save_pretrained` directory, a directory holding only `vocab.txt`, or the
    path of a WordPiece `vocab.txt` itself. `lowercase` / `strip_accents` apply only to a bare vocab.txt
    (default BERT-uncased; `**MULTILINGUAL` keeps accents); saved tokenizers keep their own normaliser.
    """
    path = Path(name_or_path)
    if path.is_file():
        if path.name != "vocab.txt":
            raise ValueError(f"load_tokenizer: {path} is a file but not a WordPiece vocab.txt")
        return _from_vocab(path, lowercase, strip_accents)
    if path.is_dir():
        has_config = (path / "tokenizer_config.json").is_file() or (path / "tokenizer.json").is_file()
        if not has_config and (path / "vocab.txt").is_file():
            return _from_vocab(path / "vocab.txt", lowercase, strip_accents)
        if not has_config:
            raise ValueError(
                f"load_tokenizer: {path} has no tokenizer files (tokenizer_config.json, "
                "tokenizer.json or vocab.txt)"
            )
        return AutoTokenizer.from_pretrained(str(path), local_files_only=True)
    name = str(name_or_path)
    try:
        return AutoTokenizer.from_pretrained(name, local_files_only=True)
    except (OSError, ValueError) as err:
        if _offline():
            raise ValueError(
                f"load_tokenizer: {name!r} is neither a local path nor in the local HF cache, "
                "and HF_HUB_OFFLINE is set"
            ) from err
    return AutoTokenizer.from_pretrained(name)


def corpus_term_ids(tokenizer: PreTrainedTokenizerBase, texts: Iterable[str], batch_size: int = 4096) -> list[int]:
    """The sorted vocabulary ids that occur in `texts` (special tokens not added): the terms a lean sparse head
    keeps (`BiEncoder.restrict_sparse_terms`)."""
    seen: set[int] = set()
    batch: list[str] = []
    for text in texts:
        batch.append(text)
        if len(batch) == batch_size:
            seen.update(i for ids in tokenizer(batch, add_special_tokens=False)["input_ids"] for i in ids)
            batch = []
    if batch:
        seen.update(i for ids in tokenizer(batch, add_special_tokens=False)["input_ids"] for i in ids)
    return sorted(seen)
