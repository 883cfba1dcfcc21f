"""Seeded synthetic multi-task sources of paper 004 Sec. III: WikiMatrix-like parallel pairs, XNLI-like NLI
pairs and a position-biased click log over the e-commerce world of `madr.data.synthetic.catalog`.

Paper 004 trains one multilingual dual encoder on user click data plus public NLI (SNLI / MNLI / XNLI) and
WikiMatrix bridge pairs (Table II), because click data is biased toward what the old ranker showed. These
generators give toy versions of all three, each deterministic in its arguments (same seed -> same records).

- **Sentences** come from a closed bilingual lexicon (8 colours, 12 products, 11 adjectives; colours and
  products in de / fr / es are the catalog lexicon `madr.data.synthetic.catalog.translate`, the rest is our own) and
  a few sentence templates per language ("the {colour} {product} are {adj}"). Every non-English sentence is
  a deterministic, word-by-word-ish function of the English one (the template and its slot fillers), so
  a model can learn the alignment; they are not always grammatical translations. Scripts: Latin (de, fr,
  es), Cyrillic (ru), CJK (zh, written without spaces) and Arabic (ar).
- **Parallel** (`generate_parallel`): (non-English source, English target) with a WikiMatrix margin score.
  Clean pairs score in [1.06, 1.30]; a `noise_rate` share are the noisy pairs WikiMatrix is known for
  (a misaligned sentence, the untranslated English copy, a truncated translation) and score in
  [0.95, 1.03], so WikiMatrix's recommended threshold `WIKIMATRIX_THRESHOLD` = 1.04 drops exactly them.
- **NLI** (`generate_nli`): the premise states a colour, a product and an adjective; entailment drops one
  of them (a generalisation), neutral adds an unrelated attribute (new information), contradiction negates
  the adjective, uses its antonym or swaps the colour. Labels are balanced (round robin over `NLI_LABELS`).
- **Clicks** (`generate_click_log`, `click_log_from_catalog`): per query an "old ranker" orders candidates
  by relevance + Gaussian noise; each impression clicks a document with the position-based model
  P(click) = examination(position) * attractiveness(relevance), examination = 1 / position ** eta
  (`position_bias`), attractiveness = eps + (1 - eps) * (2 ** rel - 1) / (2 ** 4 - 1) (Ai et al. 2018,
  eps = `click_noise`). Documents have title, description and url (a slug); `relevance` is the catalog's
  ground truth, for evaluation only.
"""

from __future__ import annotations

import random
import re
from collections.abc import Sequence

import numpy as np

from madr.data.records import NLI_LABELS, ClickRecord, NLIRecord, ParallelRecord
from madr.data.schema import Catalog, Product
from madr.data.synthetic.catalog import generate_catalog, grade, translate

MULTILINGUAL_LANGUAGES = ("en", "de", "fr", "es", "ru", "zh", "ar")
PARALLEL_LANGUAGES = ("de", "fr", "es", "ru", "zh", "ar")
CLICK_LANGUAGES = ("en", "de", "fr", "es")  # the catalog's query languages (`madr.data.synthetic.catalog.LANGUAGES`)
WIKIMATRIX_THRESHOLD = 1.04  # the margin-score threshold WikiMatrix recommends (Schwenk et al. 2019)
CLEAN_SCORES, NOISY_SCORES = (1.06, 1.30), (0.95, 1.03)
MAX_RELEVANCE = 4
URL_PREFIX = "https://www.example-shop.com"

# English term -> (ru, zh, ar); de / fr / es come from the catalog lexicon `translate`.
COLOURS: dict[str, tuple[str, str, str]] = {
    "black": ("чёрные", "黑色", "سوداء"),
    "white": ("белые", "白色", "بيضاء"),
    "red": ("красные", "红色", "حمراء"),
    "navy blue": ("тёмно-синие", "藏青色", "كحلية"),
    "dark green": ("тёмно-зелёные", "深绿色", "خضراء داكنة"),
    "light grey": ("светло-серые", "浅灰色", "رمادية فاتحة"),
    "brown": ("коричневые", "棕色", "بنية"),
    "yellow": ("жёлтые", "黄色", "صفراء"),
}
PRODUCTS: dict[str, tuple[str, str, str]] = {
    "running shoes": ("кроссовки", "跑鞋", "أحذية الجري"),
    "hiking boots": ("походные ботинки", "登山靴", "أحذية المشي"),
    "wool socks": ("шерстяные носки", "羊毛袜", "جوارب صوف"),
    "travel backpacks": ("дорожные рюкзаки", "旅行背包", "حقائب ظهر للسفر"),
    "laptop bags": ("сумки для ноутбуков", "电脑包", "حقائب الحاسوب"),
    "wireless keyboards": ("беспроводные клавиатуры", "无线键盘", "لوحات مفاتيح لاسلكية"),
    "wireless earbuds": ("беспроводные наушники", "无线耳机", "سماعات لاسلكية"),
    "office chairs": ("офисные кресла", "办公椅", "كراسي مكتب"),
    "camping tents": ("туристические палатки", "露营帐篷", "خيام تخييم"),
    "yoga mats": ("коврики для йоги", "瑜伽垫", "حصائر يوغا"),
    "scented candles": ("ароматические свечи", "香薰蜡烛", "شموع معطرة"),
    "ceramic mugs": ("керамические кружки", "陶瓷杯", "أكواب خزفية"),
}
# English adjective -> (de, fr, es, ru, zh, ar)
ADJECTIVES: dict[str, tuple[str, str, str, str, str, str]] = {
    "light": ("leicht", "légers", "ligeros", "лёгкие", "轻", "خفيفة"),
    "heavy": ("schwer", "lourds", "pesados", "тяжёлые", "重", "ثقيلة"),
    "cheap": ("günstig", "bon marché", "baratos", "дешёвые", "便宜", "رخيصة"),
    "expensive": ("teuer", "chers", "caros", "дорогие", "贵", "غالية"),
    "new": ("neu", "neufs", "nuevos", "новые", "新", "جديدة"),
    "old": ("alt", "vieux", "viejos", "старые", "旧", "قديمة"),
    "large": ("groß", "grands", "grandes", "большие", "大", "كبيرة"),
    "small": ("klein", "petits", "pequeños", "маленькие", "小", "صغيرة"),
    "waterproof": ("wasserdicht", "imperméables", "impermeables", "водонепроницаемые", "防水", "مقاومة للماء"),
    "comfortable": ("bequem", "confortables", "cómodos", "удобные", "舒适", "مريحة"),
    "durable": ("langlebig", "durables", "duraderos", "прочные", "耐用", "متينة"),
}
ANTONYMS = {"light": "heavy", "cheap": "expensive", "new": "old", "large": "small"}
ANTONYMS.update({v: k for k, v in list(ANTONYMS.items())})
_EXTRA_INDEX = {"ru": 0, "zh": 1, "ar": 2}
_ADJ_INDEX = {lang: i for i, lang in enumerate(PARALLEL_LANGUAGES)}

# template name -> language -> format string over {colour}, {product}, {adj}
TEMPLATES: dict[str, dict[str, str]] = {
    "colour_product_adj": {
        "en": "the {colour} {product} are {adj}", "de": "die {colour} {product} sind {adj}",
        "fr": "les {product} {colour} sont {adj}", "es": "los {product} {colour} son {adj}",
        "ru": "{colour} {product} {adj}", "zh": "{colour}的{product}很{adj}", "ar": "{product} ال{colour} {adj}",
    },
    "bought": {
        "en": "i bought {colour} {product}", "de": "ich habe {colour} {product} gekauft",
        "fr": "j'ai acheté des {product} {colour}", "es": "compré {product} {colour}",
        "ru": "я купил {colour} {product}", "zh": "我买了{colour}的{product}", "ar": "اشتريت {product} {colour}",
    },
    "not_adj": {
        "en": "these {product} are not {adj}", "de": "diese {product} sind nicht {adj}",
        "fr": "ces {product} ne sont pas {adj}", "es": "estos {product} no son {adj}",
        "ru": "эти {product} не {adj}", "zh": "这些{product}不{adj}", "ar": "هذه {product} ليست {adj}",
    },
    "sell": {
        "en": "we sell {adj} {product} in {colour}", "de": "wir verkaufen {adj} {product} in {colour}",
        "fr": "nous vendons des {product} {adj} en {colour}", "es": "vendemos {product} {adj} en {colour}",
        "ru": "мы продаём {adj} {colour} {product}", "zh": "我们卖{colour}的{adj}{product}",
        "ar": "نبيع {product} {colour} {adj}",
    },
    "have": {
        "en": "do you have {colour} {product}", "de": "haben sie {colour} {product}",
        "fr": "avez-vous des {product} {colour}", "es": "tienen {product} {colour}",
        "ru": "у вас есть {colour} {product}", "zh": "你们有{colour}的{product}吗", "ar": "هل لديكم {product} {colour}",
    },
    # NLI hypotheses
    "product_adj": {
        "en": "the {product} are {adj}", "de": "die {product} sind {adj}", "fr": "les {product} sont {adj}",
        "es": "los {product} son {adj}", "ru": "{product} {adj}", "zh": "{product}很{adj}", "ar": "ال{product} {adj}",
    },
    "product_colour": {
        "en": "the {product} are {colour}", "de": "die {product} sind {colour}",
        "fr": "les {product} sont {colour}", "es": "los {product} son {colour}", "ru": "{product} {colour}",
        "zh": "{product}是{colour}的", "ar": "ال{product} {colour}",
    },
    "product_not_adj": {
        "en": "the {product} are not {adj}", "de": "die {product} sind nicht {adj}",
        "fr": "les {product} ne sont pas {adj}", "es": "los {product} no son {adj}", "ru": "{product} не {adj}",
        "zh": "{product}不{adj}", "ar": "ال{product} ليست {adj}",
    },
}
PARALLEL_TEMPLATES = ("colour_product_adj", "bought", "not_adj", "sell", "have")


def _check_languages(languages: Sequence[str], allowed: Sequence[str], what: str) -> list[str]:
    languages = [languages] if isinstance(languages, str) else list(languages)
    bad = [lang for lang in languages if lang not in allowed]
    if bad or not languages:
        raise ValueError(f"{what}: languages must be a non-empty subset of {tuple(allowed)}, got {languages}")
    return languages


def translate_term(term: str, language: str) -> str:
    """`term` (a lexicon colour, product or adjective) in `language`; English returns it unchanged."""
    if language not in MULTILINGUAL_LANGUAGES:
        raise ValueError(f"translate_term: language must be one of {MULTILINGUAL_LANGUAGES}, got {language!r}")
    if language == "en":
        return term
    if term in ADJECTIVES:
        return ADJECTIVES[term][_ADJ_INDEX[language]]
    table = COLOURS if term in COLOURS else PRODUCTS if term in PRODUCTS else None
    if table is None:
        raise ValueError(f"translate_term: {term!r} is not in the lexicon")
    return table[term][_EXTRA_INDEX[language]] if language in _EXTRA_INDEX else translate(term, language)


def render(template: str, language: str, colour: str = "", product: str = "", adj: str = "") -> str:
    """The sentence of `template` in `language` with the English slot fillers translated by the lexicon."""
    if template not in TEMPLATES:
        raise ValueError(f"render: unknown template {template!r}; one of {sorted(TEMPLATES)}")
    if language not in TEMPLATES[template]:
        raise ValueError(f"render: language must be one of {MULTILINGUAL_LANGUAGES}, got {language!r}")
    slots = {name: translate_term(v, language) if v else "" for name, v in
             (("colour", colour), ("product", product), ("adj", adj))}
    return TEMPLATES[template][language].format(**slots)


# -- parallel (WikiMatrix-like) ---------------------------------------------------------------------
def _noisy_source(rng: random.Random, lang: str, english: str, clean: str) -> str:
    """A WikiMatrix-style bad pair: another sentence's translation, the English copy, or a truncation."""
    kind = rng.randrange(3)
    if kind == 0:
        while True:
            other = render(rng.choice(PARALLEL_TEMPLATES), lang, rng.choice(list(COLOURS)),
                           rng.choice(list(PRODUCTS)), rng.choice(list(ADJECTIVES)))
            if other != clean:
                return other
    if kind == 1:
        return english
    return clean[: max(1, len(clean) // 2)].strip()


def generate_parallel(n: int, languages: Sequence[str] = PARALLEL_LANGUAGES, seed: int = 0,
                      noise_rate: float = 0.15) -> list[ParallelRecord]:
    """`n` (source, English target) pairs, languages in round robin; see the module docstring.

    A `noise_rate` share of pairs (exactly round(noise_rate * n), at random rows) are noisy and score
    below `WIKIMATRIX_THRESHOLD`; `filter_parallel` drops them.
    """
    if n < 0:
        raise ValueError(f"generate_parallel: n must be >= 0, got {n}")
    if not 0.0 <= noise_rate < 1.0:
        raise ValueError(f"generate_parallel: noise_rate must be in [0, 1), got {noise_rate}")
    languages = _check_languages(languages, PARALLEL_LANGUAGES, "generate_parallel")
    rng = random.Random(seed)
    noisy = set(rng.sample(range(n), round(noise_rate * n)))
    records = []
    for i in range(n):
        lang = languages[i % len(languages)]
        template = rng.choice(PARALLEL_TEMPLATES)
        slots = {"colour": rng.choice(list(COLOURS)), "product": rng.choice(list(PRODUCTS)),
                 "adj": rng.choice(list(ADJECTIVES))}
        english, clean = render(template, "en", **slots), render(template, lang, **slots)
        if i in noisy:
            source, score = _noisy_source(rng, lang, english, clean), rng.uniform(*NOISY_SCORES)
        else:
            source, score = clean, rng.uniform(*CLEAN_SCORES)
        records.append(ParallelRecord(source, english, lang, "en", round(score, 4)))
    return records


def filter_parallel(records: Sequence[ParallelRecord],
                    threshold: float = WIKIMATRIX_THRESHOLD) -> list[ParallelRecord]:
    """The pairs whose margin score is >= `threshold` (pairs without a score are kept)."""
    return [r for r in records if r.score is None or r.score >= threshold]


# -- NLI (SNLI / XNLI-like) -------------------------------------------------------------------------
def _hypothesis(rng: random.Random, label: str, colour: str, product: str, adj: str) -> tuple[str, dict]:
    """(template, slots) of a hypothesis with `label` for the premise (colour, product, adj)."""
    if label == "entailment":  # a generalisation: drop the colour or the adjective
        if rng.random() < 0.5:
            return "product_adj", {"product": product, "adj": adj}
        return "product_colour", {"product": product, "colour": colour}
    if label == "neutral":  # new information: an adjective neither equal nor opposite to the premise's
        other = rng.choice([a for a in ADJECTIVES if a not in (adj, ANTONYMS.get(adj))])
        if rng.random() < 0.5:
            return "product_adj", {"product": product, "adj": other}
        return "colour_product_adj", {"colour": colour, "product": product, "adj": other}
    kind = rng.randrange(3) if adj in ANTONYMS else rng.choice([0, 2])
    if kind == 0:  # negation
        return "product_not_adj", {"product": product, "adj": adj}
    if kind == 1:  # antonym
        return "product_adj", {"product": product, "adj": ANTONYMS[adj]}
    swapped = rng.choice([c for c in COLOURS if c != colour])  # conflicting colour
    return "product_colour", {"product": product, "colour": swapped}


def generate_nli(n: int, languages: Sequence[str] = ("en", "de"), seed: int = 0) -> list[NLIRecord]:
    """`n` premise / hypothesis pairs, labels in round robin over `NLI_LABELS` (balanced) and languages
    in round robin over `languages`; see the module docstring for how each label is built."""
    if n < 0:
        raise ValueError(f"generate_nli: n must be >= 0, got {n}")
    languages = _check_languages(languages, MULTILINGUAL_LANGUAGES, "generate_nli")
    rng = random.Random(seed)
    records = []
    for i in range(n):
        label, lang = NLI_LABELS[i % len(NLI_LABELS)], languages[(i // len(NLI_LABELS)) % len(languages)]
        colour, product, adj = rng.choice(list(COLOURS)), rng.choice(list(PRODUCTS)), rng.choice(list(ADJECTIVES))
        premise = render("colour_product_adj", lang, colour, product, adj)
        template, slots = _hypothesis(rng, label, colour, product, adj)
        records.append(NLIRecord(premise, render(template, lang, **slots), label, lang))
    return records


# -- click log (position-based click model) ---------------------------------------------------------
def examination(positions: np.ndarray | Sequence[int], eta: float) -> np.ndarray:
    """P(examined | position) = 1 / position ** eta of the position-based model (1-based positions)."""
    return 1.0 / np.asarray(positions, dtype=float) ** eta


def attractiveness(relevance: np.ndarray | Sequence[int], noise: float = 0.1) -> np.ndarray:
    """P(click | examined, rel) = noise + (1 - noise) * (2 ** rel - 1) / (2 ** 4 - 1) (Ai et al. 2018)."""
    rel = np.asarray(relevance, dtype=float)
    return noise + (1.0 - noise) * (2.0 ** rel - 1.0) / (2.0 ** MAX_RELEVANCE - 1.0)


def slug(text: str) -> str:
    """Lowercase ASCII-ish URL slug: runs of non-alphanumeric characters become one '-'."""
    return re.sub(r"[^0-9a-z]+", "-", text.lower()).strip("-")


def product_fields(product: Product) -> dict[str, str]:
    """The document fields of a product: title, description and a url built from a slug of the title."""
    url = f"{URL_PREFIX}/{slug(product.title)}/dp/{product.product_id}"
    return {"title": product.title, "description": product.description, "url": url}


def _candidates(catalog: Catalog, query_aspects: dict, judged: dict[str, int], k: int,
                rng: random.Random) -> dict[str, int]:
    """The judged documents of a query, topped up with random (graded) products to at least `k`."""
    out = dict(judged)
    if len(out) >= k:
        return out
    order = list(range(len(catalog.products)))
    rng.shuffle(order)
    for i in order:
        if len(out) >= k:
            break
        p = catalog.products[i]
        if p.product_id not in out:
            out[p.product_id] = grade(query_aspects, p.aspects)
    return out


def click_log_from_catalog(catalog: Catalog, docs_per_query: int = 10, seed: int = 0,
                           position_bias: float = 1.5, ranker_noise: float = 1.0, click_noise: float = 0.1,
                           impressions_per_query: int = 1) -> list[ClickRecord]:
    """One `ClickRecord` per (query, shown document) of `catalog`, ranked by a noisy old ranker.

    The old ranker orders each query's candidates by relevance + N(0, `ranker_noise` ** 2) and shows the
    top `docs_per_query` at positions 1..k. Each of `impressions_per_query` impressions clicks a shown
    document with P = examination(position, `position_bias`) * attractiveness(relevance, `click_noise`);
    `clicks` counts them and `clicked` = clicks > 0.
    """
    if docs_per_query < 1 or impressions_per_query < 1:
        raise ValueError(f"docs_per_query and impressions_per_query must be >= 1, "
                         f"got {docs_per_query}, {impressions_per_query}")
    if position_bias < 0 or ranker_noise < 0 or not 0.0 <= click_noise <= 1.0:
        raise ValueError(f"need position_bias >= 0, ranker_noise >= 0 and 0 <= click_noise <= 1, got "
                         f"{position_bias}, {ranker_noise}, {click_noise}")
    rng, nprng = random.Random(seed), np.random.default_rng(seed)
    by_id = {p.product_id: p for p in catalog.products}
    judged: dict[str, dict[str, int]] = {}
    for j in catalog.judgments:
        judged.setdefault(j.query_id, {})[j.product_id] = j.relevance
    records = []
    for q in catalog.queries:
        cands = _candidates(catalog, q.aspects, judged.get(q.query_id, {}), docs_per_query, rng)
        ids = sorted(cands)
        rel = np.array([cands[d] for d in ids])
        scores = rel + nprng.normal(0.0, ranker_noise, len(ids)) if ranker_noise > 0 else rel.astype(float)
        shown = np.argsort(-scores, kind="stable")[:docs_per_query]
        positions = np.arange(1, len(shown) + 1)
        p_click = examination(positions, position_bias) * attractiveness(rel[shown], click_noise)
        clicks = nprng.binomial(impressions_per_query, p_click)
        for pos, idx, c in zip(positions, shown, clicks, strict=True):
            doc_id = ids[idx]
            records.append(ClickRecord(q.text, product_fields(by_id[doc_id]), bool(c > 0), int(pos),
                                       impressions_per_query, int(c), q.language, q.query_id, doc_id,
                                       int(rel[idx])))
    return records


def generate_click_log(num_queries: int, docs_per_query: int = 10, languages: Sequence[str] = CLICK_LANGUAGES,
                       seed: int = 0, position_bias: float = 1.5, num_products: int | None = None,
                       ranker_noise: float = 1.0, click_noise: float = 0.1,
                       impressions_per_query: int = 1) -> list[ClickRecord]:
    """A click log over a fresh `generate_catalog(num_products, num_queries, seed, languages)`.

    `num_products` defaults to max(200, 4 * num_queries). Use `click_log_from_catalog` to log clicks over
    a catalog you also evaluate on; see it for the click model arguments.
    """
    if num_queries < 1:
        raise ValueError(f"generate_click_log: num_queries must be >= 1, got {num_queries}")
    languages = _check_languages(languages, CLICK_LANGUAGES, "generate_click_log")
    num_products = max(200, 4 * num_queries) if num_products is None else num_products
    catalog = generate_catalog(num_products, num_queries, seed=seed, languages=languages)
    return click_log_from_catalog(catalog, docs_per_query, seed, position_bias, ranker_noise, click_noise,
                                  impressions_per_query)
