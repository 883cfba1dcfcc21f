"""Synthetic multilingual sources of paper 004 Sec. III: parallel pairs, NLI pairs, a position-biased click log."""

from __future__ import annotations

import unicodedata
from collections import Counter

import numpy as np
import pytest

from madr.data.records import NLI_LABELS
from madr.data.synthetic.catalog import generate_catalog, grade
from madr.data.synthetic.multilingual import (
    ADJECTIVES,
    ANTONYMS,
    COLOURS,
    PARALLEL_LANGUAGES,
    PARALLEL_TEMPLATES,
    PRODUCTS,
    WIKIMATRIX_THRESHOLD,
    click_log_from_catalog,
    filter_parallel,
    generate_click_log,
    generate_nli,
    generate_parallel,
    render,
    slug,
)

SCRIPTS = {"ru": "CYRILLIC", "zh": "CJK", "ar": "ARABIC", "de": "LATIN", "fr": "LATIN", "es": "LATIN"}


def scripts_of(text: str) -> set[str]:
    return {unicodedata.name(ch).split()[0] for ch in text if ch.isalpha()}


# -- parallel ---------------------------------------------------------------------------------------
def test_hand_written_translations():
    assert render("colour_product_adj", "en", "red", "running shoes", "light") == "the red running shoes are light"
    assert render("colour_product_adj", "de", "red", "running shoes", "light") == "die rot laufschuhe sind leicht"
    assert render("colour_product_adj", "fr", "red", "running shoes", "light") == \
        "les chaussures de course rouge sont légers"
    assert render("colour_product_adj", "ru", "red", "running shoes", "light") == "красные кроссовки лёгкие"
    assert render("colour_product_adj", "zh", "red", "running shoes", "light") == "红色的跑鞋很轻"
    assert render("not_adj", "ar", "", "yoga mats", "cheap") == "هذه حصائر يوغا ليست رخيصة"


def test_parallel_is_deterministic():
    a, b = generate_parallel(60, seed=3), generate_parallel(60, seed=3)
    assert a == b, "same arguments must give identical records"
    assert a != generate_parallel(60, seed=4), "another seed gives other pairs"


def test_parallel_covers_languages_and_scripts():
    records = generate_parallel(120)
    counts = Counter(r.source_lang for r in records)
    assert set(counts) == set(PARALLEL_LANGUAGES) and len(PARALLEL_LANGUAGES) >= 4
    assert set(counts.values()) == {20}, f"round robin over languages, got {counts}"
    assert all(r.target_lang == "en" for r in records), "targets are English"
    for r in filter_parallel(records):
        assert SCRIPTS[r.source_lang] in scripts_of(r.source), f"{r.source_lang} source in its script: {r.source}"
        assert scripts_of(r.target) == {"LATIN"}, f"English target: {r.target}"
    zh = [r.source for r in filter_parallel(records) if r.source_lang == "zh"]
    assert zh and all(" " not in s for s in zh), "Chinese is written without spaces"


def all_translations() -> dict[tuple[str, str], str]:
    """(language, English sentence) -> its one translation, over every template and slot filling."""
    out = {}
    for t in PARALLEL_TEMPLATES:
        for c in COLOURS:
            for p in PRODUCTS:
                for a in ADJECTIVES:
                    english = render(t, "en", c, p, a)
                    for lang in PARALLEL_LANGUAGES:
                        out[(lang, english)] = render(t, lang, c, p, a)
    return out


def test_threshold_drops_exactly_the_noisy_pairs():
    records = generate_parallel(400, noise_rate=0.2, seed=1)
    kept = filter_parallel(records)
    assert len(records) - len(kept) == 80, f"noise_rate 0.2 of 400 pairs score below the threshold, kept {len(kept)}"
    assert filter_parallel(records, threshold=0.0) == records, "threshold 0 keeps all"
    truth = all_translations()
    for r in records:
        consistent = truth[(r.source_lang, r.target)] == r.source
        above = r.score >= WIKIMATRIX_THRESHOLD
        assert consistent == above, f"score {r.score} vs a {'clean' if consistent else 'noisy'} pair: {r}"
    noisy = [r for r in records if r.score < WIKIMATRIX_THRESHOLD]
    assert any(r.source == r.target for r in noisy), "some noisy pairs are untranslated English copies"
    assert any(r.source != r.target for r in noisy), "and some are misaligned or truncated"


def test_parallel_rejects_bad_arguments():
    with pytest.raises(ValueError, match="languages must be a non-empty subset"):
        generate_parallel(5, languages=("de", "xx"))
    with pytest.raises(ValueError, match="languages must be a non-empty subset"):
        generate_parallel(5, languages=("en",))
    with pytest.raises(ValueError, match="noise_rate"):
        generate_parallel(5, noise_rate=1.0)


# -- NLI --------------------------------------------------------------------------------------------
def test_nli_is_balanced_and_covers_languages():
    records = generate_nli(240, languages=("en", "de", "ru", "zh"))
    by_label = Counter(r.label for r in records)
    assert by_label == {label: 80 for label in NLI_LABELS}, f"balanced labels, got {by_label}"
    cells = Counter((r.label, r.language) for r in records)
    assert set(cells.values()) == {20} and len(cells) == 12, f"every (label, language) cell equally, got {cells}"
    assert {r.language for r in generate_nli(12)} == {"en", "de"}, "default languages en + de"
    assert generate_nli(30, seed=5) == generate_nli(30, seed=5) != generate_nli(30, seed=6)


def english_facts(sentence: str) -> tuple[set[str], set[str], bool]:
    """(colours, adjectives, negated) mentioned by an English NLI sentence."""
    colours = {c for c in COLOURS if f" {c} " in f" {sentence} "}
    words = sentence.split()
    adjs = {a for a in ADJECTIVES if a in words[-1:]}  # the predicate adjective ends the sentence
    return colours, adjs, "not" in words


def test_nli_labels_follow_their_definitions():
    for r in generate_nli(300, languages=("en",), seed=2):
        p_col, p_adj, _ = english_facts(r.premise)
        h_col, h_adj, negated = english_facts(r.hypothesis)
        product = next(p for p in PRODUCTS if p in r.premise)
        assert product in r.hypothesis, f"the hypothesis is about the premise's product: {r}"
        if r.label == "entailment":
            assert not negated and h_col <= p_col and h_adj <= p_adj and len(r.hypothesis) < len(r.premise), \
                f"entailment states a subset of the premise: {r}"
        elif r.label == "neutral":
            (adj,), (p,) = h_adj, p_adj
            assert not negated and adj != p and ANTONYMS.get(p) != adj, f"neutral adds unrelated info: {r}"
        else:
            antonym = any(ANTONYMS.get(p) == h for p in p_adj for h in h_adj)
            swapped = bool(h_col) and not h_col <= p_col
            assert negated or antonym or swapped, f"contradiction negates or conflicts: {r}"


# -- click log --------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def click_log():
    return generate_click_log(300, impressions_per_query=20, seed=0)


def ctr(records, keep) -> tuple[float, int]:
    rows = [r for r in records if keep(r)]
    return sum(r.clicks for r in rows) / max(1, sum(r.impressions for r in rows)), len(rows)


def test_click_log_layout(click_log):
    by_query = Counter(r.query_id for r in click_log)
    assert len(by_query) == 300 and set(by_query.values()) == {10}, "10 shown documents per query"
    for qid in list(by_query)[:20]:
        rows = [r for r in click_log if r.query_id == qid]
        assert [r.position for r in rows] == list(range(1, 11)), "positions 1..10 in order"
        assert len({r.doc_id for r in rows}) == 10, "no document shown twice"
    r = click_log[0]
    assert set(r.fields) == {"title", "description", "url"}
    assert r.fields["url"].endswith(f"/{slug(r.fields['title'])}/dp/{r.doc_id}")
    assert all(r.clicked == (r.clicks > 0) and 0 <= r.clicks <= r.impressions == 20 for r in click_log)
    assert {r.language for r in click_log} == {"en", "de", "fr", "es"}, "four query languages by default"


def test_click_log_is_deterministic_and_relevance_is_the_catalogs():
    catalog = generate_catalog(200, 40, seed=7)
    a = click_log_from_catalog(catalog, seed=1)
    assert a == click_log_from_catalog(catalog, seed=1)
    assert a != click_log_from_catalog(catalog, seed=2)
    aspects = {q.query_id: q.aspects for q in catalog.queries}
    products = {p.product_id: p.aspects for p in catalog.products}
    assert all(r.relevance == grade(aspects[r.query_id], products[r.doc_id]) for r in a), "ground-truth grades"


def test_old_ranker_is_informative_but_noisy(click_log):
    rel_at = {p: np.mean([r.relevance for r in click_log if r.position == p]) for p in (1, 10)}
    assert rel_at[1] > rel_at[10] + 1.5, f"relevance drops with position: {rel_at}"
    assert any(r.position >= 8 and r.relevance == 4 for r in click_log), "some perfect documents shown low"


def test_position_bias_is_visible(click_log):
    top_bad, n_top = ctr(click_log, lambda r: r.position <= 2 and r.relevance <= 2)
    low_good, n_low = ctr(click_log, lambda r: r.position >= 8 and r.relevance >= 3)
    assert n_top > 50 and n_low > 30, f"enough rows in both cells: {n_top}, {n_low}"
    assert top_bad > 3 * low_good, \
        f"CTR of top-2 positions at relevance <= 2 ({top_bad:.3f}) must far exceed that of positions >= 8 " \
        f"at relevance >= 3 ({low_good:.3f})"


def test_click_model_is_position_times_attractiveness(click_log):
    at = {p: ctr(click_log, lambda r, p=p: r.position == p and r.relevance == 4)[0] for p in (1, 2)}
    assert at[1] == pytest.approx(1.0), "examination(1) * attractiveness(4) = 1"
    assert at[2] == pytest.approx(2 ** -1.5, abs=0.06), f"examination(2) = 1 / 2 ** 1.5, got {at[2]:.3f}"
    grades = [ctr(click_log, lambda r, g=g: r.position == 1 and r.relevance == g)[0] for g in (2, 3, 4)]
    assert grades == sorted(grades), f"CTR rises with relevance at a fixed position: {grades}"


def test_no_position_bias_when_eta_is_zero():
    log = generate_click_log(150, impressions_per_query=20, seed=0, position_bias=0.0)
    top, _ = ctr(log, lambda r: r.position <= 2 and r.relevance == 4)
    low, _ = ctr(log, lambda r: r.position >= 6 and r.relevance == 4)
    assert top == pytest.approx(1.0) and low == pytest.approx(1.0), f"eta 0: all examined, got {top}, {low}"


def test_click_log_rejects_bad_arguments():
    with pytest.raises(ValueError, match="languages must be a non-empty subset"):
        generate_click_log(5, languages=("en", "ru"))
    with pytest.raises(ValueError, match="docs_per_query"):
        generate_click_log(5, docs_per_query=0)
    with pytest.raises(ValueError, match="position_bias"):
        generate_click_log(5, position_bias=-1.0)
