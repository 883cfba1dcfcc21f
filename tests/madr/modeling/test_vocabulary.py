"""Aspect value vocabularies at phrase / word / token granularity (paper 001 Sec. 5.3.1)."""

from __future__ import annotations

import json

import pytest
from transformers import BertTokenizerFast

from madr.modeling.aspect_vocabulary import (
    AspectVocabularies,
    AspectVocabulary,
    build_vocabularies,
    split_words,
    value_pieces,
)
from madr.modeling.tokenization import train_wordpiece_tokenizer

ANNOTATIONS = [
    {"category": ["Handmade Products"], "color": ["black"]},
    {"category": ["handmade products", "home décor"], "color": ["black", "navy blue"]},
    {"category": ["sports shoes"], "color": []},
    {"category": ["sports  shoes"], "brand": ["north peak"]},
    {"category": ["running shoes"], "color": ["black"]},
]


@pytest.fixture(scope="module")
def wordpiece(tmp_path_factory):
    """A hand-written WordPiece vocabulary: "handmade" -> [hand, ##made] as in paper 001 Sec. 3."""
    vocab = [
        "[PAD]",
        "[UNK]",
        "[CLS]",
        "[SEP]",
        "[MASK]",
        "hand",
        "##made",
        "products",
        "home",
        "dec",
        "##or",
        "sports",
        "shoes",
        "running",
        "black",
        "navy",
        "blue",
        "north",
        "peak",
        "run",
        "##ning",
    ]
    path = tmp_path_factory.mktemp("wp") / "vocab.txt"
    path.write_text("\n".join(vocab) + "\n", encoding="utf-8")
    return BertTokenizerFast(vocab=str(path))


def test_pieces_of_one_value(wordpiece):
    assert value_pieces("  Handmade   Products ", "phrase") == ["handmade products"], "normalised phrase"
    assert value_pieces("handmade products", "word") == ["handmade", "products"]
    assert value_pieces("handmade products", "token", wordpiece.tokenize) == ["hand", "##made", "products"]
    assert split_words("t-shirts & tops, kids'") == ["t", "shirts", "tops", "kids"], "split on punctuation"
    assert wordpiece.tokenize("sports & zz") == ["sports", "[UNK]", "[UNK]"]
    assert value_pieces("sports & zz", "token", wordpiece.tokenize) == ["sports"], "no punctuation, no [UNK]"
    with pytest.raises(ValueError, match="tokenize"):
        value_pieces("x", "token")
    with pytest.raises(ValueError, match="granularity"):
        value_pieces("x", "char")


def test_three_granularities(wordpiece):
    v = build_vocabularies(
        ANNOTATIONS, ["category", "color"], ["phrase", "word", "token"], tokenize=wordpiece.tokenize
    )
    # document frequencies: handmade products 2, sports shoes 2, home décor 1, running shoes 1
    assert v.get("category", "phrase").values == [
        "handmade products",
        "sports shoes",
        "home décor",
        "running shoes",
    ], "freq desc, then alphabetical"
    # shoes 3; handmade, products, sports 2; décor, home, running 1
    assert v.get("category", "word").values == [
        "shoes",
        "handmade",
        "products",
        "sports",
        "décor",
        "home",
        "running",
    ]
    # shoes 3; ##made, hand, products, sports 2; ##or, dec, home, running 1  ("##" sorts before letters)
    assert v.get("category", "token").values == [
        "shoes",
        "##made",
        "hand",
        "products",
        "sports",
        "##or",
        "dec",
        "home",
        "running",
    ]
    assert v.get("color", "word").values == ["black", "blue", "navy"], "black counted once per document"
    assert v.get("color", "phrase").counts == [3, 1]
    assert (
        len(v) == 6 and v.aspects == ["category", "color"] and v.granularities == ["phrase", "word", "token"]
    )


def test_min_freq_and_max_size(wordpiece):
    v = build_vocabularies(ANNOTATIONS, ["category"], ["phrase", "word"], min_freq=2)
    assert v.get("category", "phrase").values == ["handmade products", "sports shoes"]
    assert v.get("category", "word").values == ["shoes", "handmade", "products", "sports"]
    top2 = build_vocabularies(ANNOTATIONS, ["category"], ["word"], max_size=2)
    assert top2.get("category", "word").values == ["shoes", "handmade"]
    with pytest.raises(ValueError, match="tokenize"):
        build_vocabularies(ANNOTATIONS, ["category"], ["token"])
    with pytest.raises(ValueError, match="list of strings"):
        build_vocabularies([{"category": "shoes"}], ["category"], ["phrase"])


def test_multi_valued_encode(wordpiece):
    v = build_vocabularies(
        ANNOTATIONS,
        ["category", "color"],
        ["phrase", "word", "token"],
        tokenize=wordpiece.tokenize,
        min_freq=2,
    )
    phrase, word, token = (v.get("category", g) for g in ("phrase", "word", "token"))
    value = ["Sports Shoes", "handmade products", "garden tools"]
    assert phrase.encode(value) == [0, 1], "sorted unique ids; the unseen phrase is dropped"
    assert word.encode(value) == [0, 1, 2, 3], "shoes, handmade, products, sports"
    assert token.encode(["handmade products", "running shoes"]) == [0, 1, 2, 3], "shoes ##made hand products"
    assert word.decode(word.encode(["running shoes"])) == ["shoes"], "running is below min_freq"
    assert phrase.encode([]) == []
    assert v.encode({"category": ["sports shoes"]}, "word") == {"category": [0, 3], "color": []}
    with pytest.raises(ValueError, match="out of range"):
        phrase.decode([7])


def test_token_granularity_matches_trained_tokenizer(tmp_path):
    texts = ["handmade products for the home", "hand cream", "made to order", "running shoes"] * 10
    tok = train_wordpiece_tokenizer(texts, vocab_size=60, out_dir=str(tmp_path))
    v = build_vocabularies(
        [{"category": ["handmade products"]}, {"category": ["running shoes"]}],
        ["category"],
        ["token"],
        tokenize=tok.tokenize,
    )
    expected = list(dict.fromkeys(tok.tokenize("handmade products") + tok.tokenize("running shoes")))
    assert sorted(v.get("category", "token").values) == sorted(expected)
    assert len(v.get("category", "token")) > 2, "wordpieces, not whole phrases"


def test_json_round_trip(tmp_path, wordpiece):
    v = build_vocabularies(
        ANNOTATIONS, ["category", "color"], ["phrase", "word", "token"], tokenize=wordpiece.tokenize
    )
    path = v.save(tmp_path / "vocab.json")
    data = json.loads(path.read_text(encoding="utf-8"))
    assert data["format"] == "madr.aspect_vocabularies", "plain JSON, no pickle"
    back = AspectVocabularies.load(path)
    for key, voc in v.items():
        assert back.get(*key).values == voc.values, f"{key} values survive the round trip"
    sample = {"category": ["handmade products", "running shoes"], "color": ["navy blue"]}
    for g in ("phrase", "word", "token"):
        assert back.encode(sample, g) == v.encode(sample, g), f"{g} encodes the same without a tokenizer"
    # an unseen phrase at token granularity: greedy WordPiece over the vocabulary's own pieces
    assert back.get("category", "token").decode(back.get("category", "token").encode(["handmade shoes"])) == [
        "shoes",
        "##made",
        "hand",
    ]
    path.write_text('{"format": "other"}', encoding="utf-8")
    with pytest.raises(ValueError, match="vocab.json"):
        AspectVocabularies.load(path)


def test_vocabulary_checks():
    with pytest.raises(ValueError, match="duplicate"):
        AspectVocabulary("brand", "phrase", ["a", "a"])
    with pytest.raises(ValueError, match="granularity"):
        AspectVocabulary("brand", "sentence", ["a"])
    voc = AspectVocabulary.from_dict(AspectVocabulary("brand", "phrase", ["north peak", "zentra"]).to_dict())
    assert len(voc) == 2 and "zentra" in voc and voc.encode(["Zentra"]) == [1]
