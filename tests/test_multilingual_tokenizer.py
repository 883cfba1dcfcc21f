"""An in-process WordPiece tokenizer on Latin, Cyrillic, CJK and Arabic text (paper 004 Sec. V: a
multilingual sub-word vocabulary that covers its languages without out-of-vocabulary words)."""

from __future__ import annotations

import unicodedata

import pytest

from madr.data.synthetic_multilingual import (
    ADJECTIVES,
    COLOURS,
    PARALLEL_LANGUAGES,
    PRODUCTS,
    generate_parallel,
    translate_term,
)
from madr.tokenization import load_tokenizer, train_wordpiece_tokenizer

SCRIPTS = {"de": "LATIN", "fr": "LATIN", "es": "LATIN", "ru": "CYRILLIC", "zh": "CJK", "ar": "ARABIC"}


def texts(seed: int) -> dict[str, list[str]]:
    """Clean sentences per language (English as "en") from the parallel generator."""
    out: dict[str, list[str]] = {lang: [] for lang in (*PARALLEL_LANGUAGES, "en")}
    for r in generate_parallel(300, seed=seed, noise_rate=0.0):
        out[r.source_lang].append(r.source)
        out["en"].append(r.target)
    return out


@pytest.fixture(scope="module")
def tok_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("ml_tok")


def lexicon() -> list[str]:
    """Every lexicon term in every language, so that the training text covers the closed vocabulary."""
    terms = [*COLOURS, *PRODUCTS, *ADJECTIVES]
    return [translate_term(t, lang) for lang in (*PARALLEL_LANGUAGES, "en") for t in terms]


@pytest.fixture(scope="module")
def tok(tok_dir):
    train = [s for sentences in texts(seed=0).values() for s in sentences] + lexicon()
    return train_wordpiece_tokenizer(train, vocab_size=3000, out_dir=str(tok_dir))


@pytest.fixture(scope="module")
def held_out():
    return texts(seed=1)


def test_every_script_tokenises_into_vocabulary_pieces(tok, held_out):
    unk = tok.unk_token_id
    for lang, sentences in held_out.items():
        pieces = [p for s in sentences for p in tok.tokenize(s)]
        ids = tok.convert_tokens_to_ids(pieces)
        assert pieces and unk not in ids, f"{lang}: held-out text gives [UNK] pieces"
        if lang in SCRIPTS:
            seen = {unicodedata.name(ch).split()[0] for p in pieces for ch in p.removeprefix("##") if ch.isalpha()}
            assert SCRIPTS[lang] in seen, f"{lang}: pieces in the {SCRIPTS[lang]} script, got scripts {seen}"


def test_unseen_script_gives_unk(tok):
    """Control: the [UNK] check above can fail, a script absent from training is out of vocabulary."""
    assert tok.tokenize("καλημέρα κόσμε") == ["[UNK]", "[UNK]"], "Greek was not in the training text"


def test_cjk_splits_into_characters(tok, held_out):
    for s in held_out["zh"]:
        pieces = tok.tokenize(s)
        assert pieces == list(s), f"BERT's CJK handling: one piece per Chinese character, got {pieces} for {s}"


def test_words_of_spaced_scripts_are_wordpieces(tok):
    for word in ("кроссовки", "خفيفة", "laufschuhe"):
        pieces = tok.tokenize(word)
        assert len(pieces) >= 1 and all(p.startswith("##") for p in pieces[1:]), f"{word} -> {pieces}"
        assert "".join(p.removeprefix("##") for p in pieces) == word, f"pieces re-join to {word}: {pieces}"


def test_decode_round_trip_and_save_load(tok, tok_dir, held_out):
    reloaded = load_tokenizer(tok_dir)
    normalise = tok.backend_tokenizer.normalizer.normalize_str
    for lang, sentences in held_out.items():
        for s in sentences[:10]:
            ids = tok(s, add_special_tokens=False)["input_ids"]
            assert reloaded(s, add_special_tokens=False)["input_ids"] == ids, f"{lang}: same ids after load"
            decoded = tok.decode(ids)
            assert decoded.replace(" ", "") == normalise(s).replace(" ", ""), \
                f"{lang}: decode gives back the normalised text: {s!r} -> {decoded!r}"


def test_uncased_strips_accents_cased_keeps_them(tok, held_out):
    """The BERT-uncased normaliser strips combining marks: é -> e, й -> и, أ -> ا (lossy for these
    scripts); lowercase=False (BERT-cased) keeps them. Documents the trade-off, see madr.tokenization."""
    assert tok.tokenize("légers йод أحذية")[0] == "legers", "uncased strips the French accent"
    cased = train_wordpiece_tokenizer([s for v in held_out.values() for s in v] + lexicon() + ["йод"],
                                      vocab_size=3000, lowercase=False)
    assert cased.tokenize("légers")[0] == "légers", "cased keeps é"
    assert "й" in "".join(cased.tokenize("йод")), "cased keeps й distinct from и"
    assert cased.tokenize("أحذية") == ["أحذية"], "cased keeps the hamza of أ"
