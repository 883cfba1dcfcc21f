"""Tokenizers: a WordPiece vocabulary trained in process on a catalog, and offline-friendly loading.

Tiny backbones (tests, the synthetic demo) have no pretrained tokenizer, so we train a BERT-style
WordPiece on the catalog text (the same normaliser / pre-tokenizer as BERT; paper 001 Sec. 5.3.1 uses
"the BERT tokenizer" for the token-granularity value vocabularies).

Pitfall (transformers 5): `BertTokenizerFast(vocab_file=...)` silently ignores the file and builds a
5-token vocabulary of special tokens; the vocabulary must be passed as `vocab=`. The trained tokenizer is
therefore rebuilt with `vocab=<path to vocab.txt>`, written with `save_pretrained`, and both checked for
the expected size.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterable
from pathlib import Path

from transformers import AutoTokenizer, BertTokenizerFast, PreTrainedTokenizerBase

SPECIAL_TOKENS = ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")
MODEL_MAX_LENGTH = 512


def _vocab_size(path: Path) -> int:
    return sum(1 for line in path.read_text(encoding="utf-8").splitlines() if line)


def _from_vocab(vocab_path: Path, lowercase: bool) -> BertTokenizerFast:
    """`BertTokenizerFast` over a WordPiece vocab.txt (passed as `vocab=`, see the module docstring)."""
    tok = BertTokenizerFast(vocab=str(vocab_path), do_lower_case=lowercase, model_max_length=MODEL_MAX_LENGTH)
    expected = _vocab_size(vocab_path)
    if len(tok) != expected:
        raise ValueError(f"tokenizer built from {vocab_path} has {len(tok)} tokens, the file has {expected}")
    return tok


def train_wordpiece_tokenizer(
    texts: Iterable[str],
    vocab_size: int = 2000,
    lowercase: bool = True,
    out_dir: str | None = None,
    min_frequency: int = 1,
) -> BertTokenizerFast:
    """Train a BERT WordPiece tokenizer on `texts` and return it as a `BertTokenizerFast`.

    `vocab_size` is an upper bound: a small corpus yields fewer pieces. The tokenizer is written to
    `out_dir` (a fresh temporary directory when None) as `vocab.txt` plus the `save_pretrained` files, so
    `load_tokenizer(out_dir)` / `AutoTokenizer.from_pretrained(out_dir)` give it back.
    """
    from tokenizers import BertWordPieceTokenizer

    if vocab_size <= len(SPECIAL_TOKENS):
        raise ValueError(f"vocab_size must exceed the {len(SPECIAL_TOKENS)} special tokens, got {vocab_size}")
    texts = [t for t in texts if t and t.strip()]
    if not texts:
        raise ValueError("train_wordpiece_tokenizer: no non-empty text to train on")
    trainer = BertWordPieceTokenizer(lowercase=lowercase)
    trainer.train_from_iterator(
        texts,
        vocab_size=vocab_size,
        min_frequency=min_frequency,
        special_tokens=list(SPECIAL_TOKENS),
        show_progress=False,
    )
    out = Path(out_dir) if out_dir is not None else Path(tempfile.mkdtemp(prefix="madr_tok_"))
    out.mkdir(parents=True, exist_ok=True)
    trainer.save_model(str(out))
    tok = _from_vocab(out / "vocab.txt", lowercase)
    tok.save_pretrained(str(out))
    return tok


def _offline() -> bool:
    return os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in ("1", "true", "yes", "on")


def load_tokenizer(name_or_path: str | os.PathLike) -> PreTrainedTokenizerBase:
    """A tokenizer from a local path first, then the local HF cache, then (only when not offline) the hub.

    Accepted local forms: a `save_pretrained` directory, a directory holding only `vocab.txt`, or the
    path of a WordPiece `vocab.txt` itself (lowercasing as BERT-uncased).
    """
    path = Path(name_or_path)
    if path.is_file():
        if path.name != "vocab.txt":
            raise ValueError(f"load_tokenizer: {path} is a file but not a WordPiece vocab.txt")
        return _from_vocab(path, lowercase=True)
    if path.is_dir():
        has_config = (path / "tokenizer_config.json").is_file() or (path / "tokenizer.json").is_file()
        if not has_config and (path / "vocab.txt").is_file():
            return _from_vocab(path / "vocab.txt", lowercase=True)
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
