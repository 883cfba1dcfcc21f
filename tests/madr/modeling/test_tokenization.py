"""In-process WordPiece tokenizer: real vocabulary size, sensible pieces, save / load round trip."""

from __future__ import annotations

import pytest
from transformers import AutoTokenizer

from madr.modeling.tokenization import load_tokenizer, train_wordpiece_tokenizer

TEXTS = [
    "North Peak waterproof hiking boots in black",
    "Handmade ceramic mugs from Clayworks",
    "Running shoes for women, lightweight and breathable",
    "Scented candles, handmade products",
    "Wireless keyboards and wireless mice for gaming laptops",
] * 20


@pytest.fixture(scope="module")
def tok_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("tok")


@pytest.fixture(scope="module")
def tok(tok_dir):
    return train_wordpiece_tokenizer(TEXTS, vocab_size=300, out_dir=str(tok_dir))


def test_vocab_size(tok, tok_dir):
    lines = (tok_dir / "vocab.txt").read_text(encoding="utf-8").splitlines()
    assert len(tok) == len(lines), "the tokenizer must use the trained vocab.txt (not 5 special tokens)"
    assert 60 < len(tok) <= 300, f"vocabulary of the trained size, got {len(tok)}"
    assert lines[:5] == ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    assert tok.pad_token_id == 0 and tok.mask_token == "[MASK]"


def test_tokenises_latin_text(tok):
    assert tok.tokenize("Hiking BOOTS, black") == ["hiking", "boots", ",", "black"], "lowercase + punctuation"
    pieces = tok.tokenize("handmakes")
    assert pieces[0] != "[UNK]" and all(p.startswith("##") for p in pieces[1:]), f"wordpieces, got {pieces}"
    enc = tok("black boots")
    assert enc["input_ids"][0] == tok.cls_token_id and enc["input_ids"][-1] == tok.sep_token_id


def test_round_trips(tok, tok_dir):
    text = "Wireless gaming keyboards in black"
    for loaded in (
        AutoTokenizer.from_pretrained(str(tok_dir)),
        load_tokenizer(tok_dir),
        load_tokenizer(tok_dir / "vocab.txt"),
    ):
        assert len(loaded) == len(tok), f"{type(loaded).__name__} lost the vocabulary"
        assert loaded(text)["input_ids"] == tok(text)["input_ids"]


def test_cased_and_errors(tmp_path):
    cased = train_wordpiece_tokenizer(TEXTS, vocab_size=300, lowercase=False, out_dir=str(tmp_path / "c"))
    assert "North" in cased.tokenize("North Peak"), "lowercase=False keeps case"
    with pytest.raises(ValueError, match="vocab_size"):
        train_wordpiece_tokenizer(TEXTS, vocab_size=5)
    with pytest.raises(ValueError, match="no non-empty text"):
        train_wordpiece_tokenizer(["", "  "])
    with pytest.raises(ValueError, match="no tokenizer files"):
        load_tokenizer(tmp_path)




def test_in_memory_tokenizer_leaves_no_files_and_saves_whole(tmp_path, monkeypatch):
    """out_dir=None: nothing stays on disk (the suite used to leave ~40 madr_tok_* folders in /tmp per run), and
    `save_pretrained` still writes a tokenizer that loads back with the same vocabulary and pieces."""
    import tempfile

    (tmp_path / "tmp").mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "tmp"))
    tok = train_wordpiece_tokenizer(["white nike socks", "black adidas running shoes", "red cotton t-shirt"] * 5, 200)
    assert list((tmp_path / "tmp").iterdir()) == []
    tok.save_pretrained(str(tmp_path / "saved"))
    back = load_tokenizer(tmp_path / "saved")
    assert back.get_vocab() == tok.get_vocab()
    for text in ("white nike running socks", "Adidas T-Shirt"):
        assert back(text)["input_ids"] == tok(text)["input_ids"]
