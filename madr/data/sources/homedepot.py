"""Home Depot product search relevance (Kaggle) as a madr catalog, with a title annotator for its aspects.

Paper 000 Sec. 8.1 annotates items and queries with an automatic aspect tool; paper 001 Sec. 5.1 uses the
catalog's own fields. Home Depot titles carry no aspect fields, so `TitleAnnotator` derives them from the
title text with rules over corpus statistics, and `annotator_accuracy` measures it against hand-checked
labels (benchmarks/data/homedepot_annotator_gold.tsv):

- brand: the longest leading word sequence (up to 4 words) that starts at least `min_brand_count` titles
  and `brand_share` of the titles starting with its first word ("Hampton Bay", "KOHLER", not
  "KOHLER Devonshire"); titles whose prefix is rarer fall back to their first word; none when the title
  starts with a number ("4 in. x 10 ft. Corex Drain Pipe");
- color: the finish after the last " in " ("... Faucet in Polished Chrome"), else the leftmost-longest
  colour phrase of the corpus's finishes that contains a basic colour word ("... Brown Hugger Ceiling Fan");
- category: the head noun: the last plain word (no digits, not a unit, singular) of the title before its
  first " with ", " for ", " in <finish>", " - ", "(" or ",", once the brand and colour are removed.

Queries are annotated with the corpus lexicon: the brands, colours and categories that occur in the query
text as whole words. `homedepot_catalog` builds the whole catalog: unique products, unique search terms
split by term, judgments with the raters' mean 1-3 mapped to 0-4 (`round(2 * (mean - 1))`) and ESCI-style
labels (3-4: E, 2: S, 0-1: I).
"""

from __future__ import annotations

import csv
import html
import random
import re
from collections import Counter, defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from madr.data.schema import Catalog, Judgment, Product, Query
from madr.data.sources.parquet_rows import read_rows

ASPECTS = ("category", "brand", "color")
BASIC_COLORS = frozenset(
    "white black brown gray grey red blue green yellow orange purple pink beige ivory bronze nickel chrome "
    "brass silver gold charcoal tan almond bisque biscuit cream navy teal taupe espresso mahogany cherry "
    "walnut".split()
)
UNITS = frozenset(
    "in in. ft ft. oz oz. lb lb. lbs lbs. gal gal. qt qt. cu cu. sq sq. mm cm w d h x btu amp volt watt "
    "pack piece count".split()
)
NOT_FINISHES = frozenset({"one", "stock", "store", "ground", "wall", "line", "place", "use", "the"})
_FINISH = re.compile(r" in ((?![\d.])[A-Za-z][^(),]*?)\s*(?=\(|,| with | - |-DISCONTINUED|$)")
_HEAD_CUTS = re.compile(r" with | for | - |\(|,| in (?=[A-Za-z])|-DISCONTINUED")
_WORD = re.compile(r"^[a-z][a-z'/\-]*[a-z]$")
_BRAND_WORD = re.compile(r"^[A-Za-z][A-Za-z'&.\-]*$")


def clean_title(title: str) -> str:
    """HTML entities decoded (`Children&#39;s`), whitespace collapsed."""
    return " ".join(html.unescape(title).split())


def singular(word: str) -> str:
    """A crude English singular for head nouns: hangers -> hanger, batteries -> battery, glass stays."""
    if word.endswith("ies") and len(word) > 4:
        return word[:-3] + "y"
    if word.endswith("s") and not word.endswith(("ss", "us", "is")) and len(word) > 3:
        return word[:-1]
    return word


def finish_of(title: str) -> str | None:
    """The colour / finish after the title's last " in " that starts with a letter, lower-cased."""
    found = [m.group(1).strip().lower() for m in _FINISH.finditer(title)]
    found = [f for f in found if f and f not in NOT_FINISHES and len(f.split()) <= 4]
    return found[-1] if found else None


def _phrase_at(words: Sequence[str], phrases: set[tuple[str, ...]], max_len: int) -> tuple[int, int] | None:
    """Leftmost-longest occurrence of any phrase (a tuple of words) in `words`: (start, length)."""
    for start in range(len(words)):
        for length in range(min(max_len, len(words) - start), 0, -1):
            if tuple(words[start:start + length]) in phrases:
                return start, length
    return None


def _words(text: str) -> list[str]:
    return re.findall(r"[a-z0-9][a-z0-9'\-/.]*[a-z0-9]|[a-z0-9]", text.lower())


@dataclass
class TitleAnnotator:
    """Brand / colour / category annotator fitted on a corpus of titles (see the module docstring)."""

    prefix_counts: Counter = field(default_factory=Counter)
    colors: set[tuple[str, ...]] = field(default_factory=set)
    min_brand_count: int = 3
    brand_share: float = 0.6

    @classmethod
    def fit(cls, titles: Iterable[str], min_brand_count: int = 3, brand_share: float = 0.6,
            min_color_count: int = 2) -> TitleAnnotator:
        titles = [clean_title(t) for t in titles]
        prefixes: Counter = Counter()
        for title in titles:
            words = title.split()
            for n in range(1, min(4, len(words)) + 1):
                prefixes[" ".join(words[:n]).lower()] += 1
        finishes = Counter(f for t in titles if (f := finish_of(t)))
        colors = {tuple(f.split()) for f, c in finishes.items()
                  if c >= min_color_count and BASIC_COLORS & set(f.replace("-", " ").split())}
        colors |= {(c,) for c in BASIC_COLORS}
        return cls(prefixes, colors, min_brand_count, brand_share)

    # -- products --------------------------------------------------------------------------------
    def brand(self, title: str) -> str | None:
        words = title.split()
        if not words or not words[0][0].isalpha():
            return None
        first = self.prefix_counts[words[0].lower()]
        best = words[0]
        for n in range(2, min(4, len(words)) + 1):
            if not _BRAND_WORD.match(words[n - 1]):
                break  # brands stop before sizes and model numbers ("Hedrix 11 oz.", "Frost King E/O")
            count = self.prefix_counts[" ".join(words[:n]).lower()]
            if count >= self.min_brand_count and count >= self.brand_share * first:
                best = " ".join(words[:n])
        return best.lower()

    def color(self, title: str, skip_words: int = 0) -> str | None:
        finish = finish_of(title)
        if finish is not None:
            return finish
        words = [w.strip(",()").lower() for w in title.split()][skip_words:]
        hit = _phrase_at(words, self.colors, max_len=4)
        return " ".join(words[hit[0]:hit[0] + hit[1]]) if hit else None

    def category(self, title: str, brand: str | None, color: str | None) -> str | None:
        text = title[len(brand):] if brand else title
        cuts = [m.start() for m in _HEAD_CUTS.finditer(text)] + [len(text)]
        for end in cuts:  # the first head that ends in a plain word, once a colour in it is removed
            head = re.sub(rf"(?i)\b{re.escape(color)}\b", " ", text[:end], count=1) if color else text[:end]
            words = [w.lower().strip(".,;:!") for w in head.split()]
            while words and any(ch.isdigit() for ch in words[-1]):
                words.pop()  # a trailing model number ("... Insect Screen FCS8558-M")
            plain = [w for w in words if _WORD.match(w) and w not in UNITS]
            if plain and words and words[-1] == plain[-1]:
                return singular(plain[-1])
        return None

    def annotate(self, title: str) -> dict[str, list[str]]:
        """{"brand": [...], "color": [...], "category": [...]}: at most one value each, lower-cased."""
        title = clean_title(title)
        brand = self.brand(title)
        color = self.color(title, skip_words=len(brand.split()) if brand else 0)
        category = self.category(title, brand, color)
        return {"category": [category] if category else [], "brand": [brand] if brand else [],
                "color": [color] if color else []}

    # -- queries ---------------------------------------------------------------------------------
    def query_lexicon(self, products: Sequence[Product], min_count: int = 3,
                      min_brand_count: int = 5) -> QueryLexicon:
        """Aspect values frequent enough among `products` to be looked for in query text; brands that are
        also category words ("Wire ...", "Deck ...": annotator misses) are left out."""
        counts: dict[str, Counter] = {a: Counter() for a in ASPECTS}
        for p in products:
            for a in ASPECTS:
                counts[a].update(p.aspects.get(a, []))
        values = {a: {tuple(_words(v)) for v, c in counts[a].items() if c >= min_count} for a in ASPECTS}
        values["brand"] = {v for v in values["brand"] if counts["brand"][" ".join(v)] >= min_brand_count
                           and v not in values["category"] and v not in values["color"]}
        return QueryLexicon(values)


@dataclass
class QueryLexicon:
    """Aspect values as word tuples; `annotate` finds them in a query: every brand and colour it names, and
    its head category (the rightmost category word, singularised: "exterior floor stain" -> stain)."""

    values: dict[str, set[tuple[str, ...]]]

    def annotate(self, query: str) -> dict[str, list[str]]:
        words = _words(query)
        out: dict[str, list[str]] = {}
        for aspect, phrases in self.values.items():
            seq = [singular(w) for w in words] if aspect == "category" else words
            found, start = [], 0
            while (hit := _phrase_at(seq[start:], phrases, max_len=4)) is not None:
                s, n = hit[0] + start, hit[1]
                found.append(" ".join(seq[s:s + n]))
                start = s + n
            out[aspect] = found[-1:] if aspect == "category" else list(dict.fromkeys(found))
        return out


# -- the catalog -------------------------------------------------------------------------------------
def relevance_grade(mean_rating: float) -> int:
    """Raters' mean on 1-3 -> 0-4 (1.0 -> 0, 2.0 -> 2, 2.67 -> 3, 3.0 -> 4)."""
    return max(0, min(4, round(2 * (mean_rating - 1))))


def esci_label(grade: int) -> str:
    return "E" if grade >= 3 else "S" if grade == 2 else "I"


def _split_terms(terms: Sequence[str], fractions: Sequence[float], seed: int) -> dict[str, str]:
    if len(fractions) != 3 or abs(sum(fractions) - 1) > 1e-6 or min(fractions) < 0:
        raise ValueError(f"fractions must be three non-negative numbers summing to 1, got {list(fractions)}")
    order = sorted(terms)
    random.Random(seed).shuffle(order)
    n_train = round(fractions[0] * len(order))
    n_dev = round(fractions[1] * len(order))
    return {t: "train" if i < n_train else "dev" if i < n_train + n_dev else "test" for i, t in enumerate(order)}


def homedepot_catalog(path: str | Path, *, seed: int = 0, fractions: Sequence[float] = (0.7, 0.1, 0.2),
                      max_queries: int | None = None) -> Catalog:
    """The Home Depot relevance file as a catalog (see the module docstring); every product stays in the
    corpus when `max_queries` keeps only a seeded sample of search terms."""
    rows = read_rows(path, ["product_uid", "product_title", "search_term", "relevance"])
    titles: dict[str, str] = {}
    ratings: dict[tuple[str, str], list[float]] = defaultdict(list)
    for row in rows:
        pid, term = str(row["product_uid"]), " ".join(str(row["search_term"]).split()).lower()
        titles.setdefault(pid, clean_title(row["product_title"]))
        if term:
            ratings[(term, pid)].append(float(row["relevance"]))
    annotator = TitleAnnotator.fit(titles.values())
    products = [Product(pid, title, "", annotator.annotate(title)) for pid, title in sorted(titles.items())]
    terms = sorted({term for term, _ in ratings})
    if max_queries is not None and max_queries < len(terms):
        terms = sorted(random.Random(seed).sample(terms, max_queries))
    splits = _split_terms(terms, fractions, seed)
    lexicon = annotator.query_lexicon(products)
    query_ids = {t: f"hd{i:05d}" for i, t in enumerate(terms)}
    queries = [Query(query_ids[t], t, lexicon.annotate(t), splits[t]) for t in terms]
    judgments = []
    for (term, pid), values in sorted(ratings.items()):
        if term in query_ids:
            grade = relevance_grade(sum(values) / len(values))
            judgments.append(Judgment(query_ids[term], pid, grade, esci_label(grade)))
    return Catalog(products, queries, judgments, list(ASPECTS)).validate(
        {"products": f"{path} (products)", "queries": f"{path} (search terms)", "judgments": str(path)})


def write_homedepot_catalog(path: str | Path, out_dir: str | Path, *, seed: int = 0,
                            fractions: Sequence[float] = (0.7, 0.1, 0.2),
                            max_queries: int | None = None) -> Path:
    """`homedepot_catalog` written as a catalog directory (`madr.data.schema` layout)."""
    return homedepot_catalog(path, seed=seed, fractions=fractions, max_queries=max_queries).write(out_dir)


# -- annotator accuracy ------------------------------------------------------------------------------
def read_gold(path: str | Path) -> list[dict[str, str]]:
    """Hand-checked rows (product_uid, brand, category, color) of a TSV with `#` comment lines."""
    with open(path, encoding="utf-8") as f:
        lines = [line for line in f if not line.startswith("#") and line.strip()]
    rows = list(csv.DictReader(lines, delimiter="\t"))
    for i, row in enumerate(rows):
        missing = [k for k in ("product_uid", *ASPECTS) if not (row.get(k) or "").strip()]
        if missing:
            raise ValueError(f"{path}: row {i}: field {missing[0]!r} is empty")
    return rows


def _matches(predicted: list[str], gold: str) -> bool:
    accepted = {g.strip().lower() for g in gold.split(";")}
    if not predicted:
        return "-" in accepted
    return predicted[0].lower() in accepted


def annotator_accuracy(annotator: TitleAnnotator, titles: dict[str, str],
                       gold: Sequence[dict[str, str]]) -> dict[str, dict[str, float]]:
    """Per aspect: accuracy (exact match, "no value" included), and precision / recall of the values
    the annotator emits, over the gold rows whose label is not "?"."""
    out = {}
    for aspect in ASPECTS:
        n = correct = emitted = emitted_ok = has_value = found = 0
        for row in gold:
            label = row[aspect].strip()
            if label == "?":
                continue
            if row["product_uid"] not in titles:
                raise ValueError(f"gold row product_uid {row['product_uid']!r} not in the titles")
            predicted = annotator.annotate(titles[row["product_uid"]])[aspect]
            ok = _matches(predicted, label)
            n, correct = n + 1, correct + ok
            emitted += bool(predicted)
            emitted_ok += bool(predicted) and ok
            has_value += label != "-"
            found += label != "-" and ok and bool(predicted)
        out[aspect] = {"n": n, "accuracy": correct / max(n, 1), "precision": emitted_ok / max(emitted, 1),
                       "recall": found / max(has_value, 1)}
    return out
