"""An in-process WordPiece tokenizer on Latin, Cyrillic, CJK and Arabic text (paper 004 Sec. V: a
multilingual sub-word vocabulary that covers its languages without out-of-vocabulary words)."""

from __future__ import annotations

import unicodedata

import pytest

from madr.data.synthetic.multilingual import (
    ADJECTIVES,
    COLOURS,
    PARALLEL_LANGUAGES,
    PRODUCTS,
    generate_parallel,
    translate_term,
)
from madr.modeling.tokenization import MULTILINGUAL, load_tokenizer, train_wordpiece_tokenizer

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
    scripts); lowercase=False (BERT-cased) keeps them. Documents the trade-off, see madr.modeling.tokenization."""
    assert tok.tokenize("légers йод أحذية")[0] == "legers", "uncased strips the French accent"
    cased = train_wordpiece_tokenizer([s for v in held_out.values() for s in v] + lexicon() + ["йод"],
                                      vocab_size=3000, lowercase=False)
    assert cased.tokenize("légers")[0] == "légers", "cased keeps é"
    assert "й" in "".join(cased.tokenize("йод")), "cased keeps й distinct from и"
    assert cased.tokenize("أحذية") == ["أحذية"], "cased keeps the hamza of أ"


@pytest.fixture(scope="module")
def multilingual(tmp_path_factory, held_out):
    """lowercase=True, strip_accents=False: the multilingual setting (`madr.modeling.tokenization.MULTILINGUAL`)."""
    out = tmp_path_factory.mktemp("ml_tok_accents")
    train = [s for sentences in texts(seed=0).values() for s in sentences] + lexicon() + ["йод", "Éclair"]
    return train_wordpiece_tokenizer(train, vocab_size=3000, out_dir=str(out), **MULTILINGUAL), out


def test_multilingual_lowercases_but_keeps_accents_in_every_script(multilingual):
    tok, _ = multilingual
    assert tok.tokenize("LÉGERS Éclair") == ["légers", "éclair"], "lowercased, é kept"
    assert tok.tokenize("ЙОД") == ["йод"], "Cyrillic lowercased, й not folded to и"
    assert tok.tokenize("أحذية") == ["أحذية"], "the hamza of أ survives"
    assert tok.tokenize("跑鞋") == ["跑", "鞋"], "CJK: one piece per character"
    for lang, sentences in texts(seed=1).items():
        for s in sentences[:20]:
            ids = tok(s, add_special_tokens=False)["input_ids"]
            assert tok.unk_token_id not in ids, f"{lang}: {s!r} has [UNK] pieces"
            assert tok.decode(ids).replace(" ", "") == s.lower().replace(" ", ""), f"{lang}: lossless for {s!r}"


def test_multilingual_setting_survives_save_and_load(multilingual):
    tok, out = multilingual
    sample = "Légers йод أحذية 跑鞋"
    assert load_tokenizer(out).tokenize(sample) == tok.tokenize(sample), "saved dir keeps strip_accents=False"
    bare = load_tokenizer(out / "vocab.txt", **MULTILINGUAL)
    assert bare.tokenize(sample) == tok.tokenize(sample), "a bare vocab.txt takes the setting as arguments"
    assert load_tokenizer(out / "vocab.txt").tokenize("Légers")[0] != "légers", "default (uncased) strips é"


def test_limit_alphabet_bounds_the_characters():
    """More distinct CJK characters than the trainer's default alphabet limit (1000): the excess is [UNK]
    unless limit_alphabet is raised or None."""
    chars = [chr(0x4E00 + i) for i in range(1200)]
    corpus = ["".join(chars[i:i + 12]) for i in range(0, 1200, 12)]
    default = train_wordpiece_tokenizer(corpus, vocab_size=5000, **MULTILINGUAL)
    unlimited = train_wordpiece_tokenizer(corpus, vocab_size=5000, limit_alphabet=None, **MULTILINGUAL)
    small = train_wordpiece_tokenizer(corpus, vocab_size=5000, limit_alphabet=100, **MULTILINGUAL)
    text = "".join(chars)
    unk = {name: tok.tokenize(text).count("[UNK]") for name, tok in
           (("default", default), ("unlimited", unlimited), ("small", small))}
    assert unk["unlimited"] == 0, f"no limit keeps every character, got {unk}"
    assert unk["default"] == 200 and unk["small"] == 1100, f"limit 1000 / 100 keep 1000 / 100 characters: {unk}"
    with pytest.raises(ValueError, match="limit_alphabet"):
        train_wordpiece_tokenizer(corpus, limit_alphabet=0)



def test_training_is_deterministic():
    """The upstream trainer gives a different vocabulary on each call (hash-map order, tokenizers#1794: the
    control below); ours gives the same one."""
    from tokenizers import BertWordPieceTokenizer

    sentences = [t for r in generate_parallel(600, seed=0) for t in (r.source, r.target)]

    def upstream() -> list[str]:
        trainer = BertWordPieceTokenizer(lowercase=True, strip_accents=False)
        trainer.train_from_iterator(sentences, vocab_size=800, min_frequency=1, show_progress=False)
        return sorted(trainer.get_vocab(), key=trainer.get_vocab().get)

    def ours() -> list[str]:
        tok = train_wordpiece_tokenizer(sentences, 800, limit_alphabet=None, **MULTILINGUAL)
        return sorted(tok.get_vocab(), key=tok.get_vocab().get)

    assert len({tuple(upstream()) for _ in range(4)}) > 1, "control: upstream training varies from call to call"
    runs = {tuple(ours()) for _ in range(4)}
    assert len(runs) == 1, "the same text must train the same vocabulary (pieces and ids) every time"
    assert len(next(iter(runs))) > 300, "a real vocabulary, not only the alphabet"
