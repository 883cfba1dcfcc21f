"""Seeded synthetic product-QA evidence ranking in the hetPQA layout (paper 002 Sec. 3, Table 1-2).

Products come from the e-commerce world of `madr.data.synthetic.catalog` (its categories, brands, colours and
materials) and get attributes: colour, material, water resistance, charge time (powered categories
only), weight, warranty and a model number such as "XR-2400". Products come in families: 2-4 siblings
of one brand and subcategory whose model numbers share the letter prefix ("XR-2400", "XR-2700").

A question asks about one attribute of one product and names it by a reference: its model number, its
brand and subcategory, or both ("what colour is the XR-2400", "how fast does the volt edge wireless
mice charge"). Each question gets 6-15 candidate evidences from the six sources of paper 002
(`EVIDENCE_SOURCES`: attribute "color: red", bullet, CQA answer, description sentence, OSP on-site
text, review), label 1 for those that answer it:

- positives (1-3): the asked attribute of the asked product. Questions and evidences draw their wording
  from different synonym lists ("colour" / "shade", "how fast does it charge" / "charging speed",
  "waterproof" / "rated ipx7"), so lexical matching often misses them; 70% name the product by the
  question's reference (`REFERENCE_MENTION`: as often as the lexical traps and near misses, so that the
  reference alone tells no label among the asked product's candidates);
- lexical traps (1-3): the same product and the same reference, another attribute ("the XR-2400
  weighs 950 grams" for a colour question): exact tokens match, the meaning does not;
- sibling traps (1-3): the asked attribute of a sibling (same brand, model number with the same prefix,
  "XR-2700") or, for a brand reference, of the same subcategory by another brand; they differ from a
  positive only in exact tokens that dense vectors blur;
- near misses (0-2, from CQA and reviews): the right product and attribute, but no answer ("does anyone
  know if the XR-2400 comes in other colours");
- wrong answers (0-2, from CQA and reviews): presumptive opinions, the right product and attribute with
  a wrong value ("XR-2400: mine is purple"); only a source's reliability tells them from a positive;
- easy negatives: other attributes of other products and generic shop chatter, up to the candidate count.

Sources differ in reliability: attribute / bullet / description positives are short and clean; CQA and
review positives are rarer and wrapped in chatter, and CQA / reviews hold most traps and all near misses
and wrong answers, so a per-source prior (paper 002 Sec. 6.2) can help. Candidates are shuffled before they get ids, so id order
(the metrics' tie-break) carries no label. Splits (70/15/15) are by question and stored on each record.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from madr.data.records import EVIDENCE_SOURCES, EvidenceRecord
from madr.data.synthetic.catalog import CATEGORIES, COLOURS, MATERIALS, SPLIT_FRACTIONS, build_world

SPLIT_NAMES = ("train", "dev", "test")
POWERED = ("computers", "phone accessories", "audio", "kitchen appliances")
MODEL_PREFIXES = ("XR", "ZT", "KP", "MX", "QL", "VT", "HX", "RB", "TN", "GS", "PX", "DW")
CANDIDATES_PER_QUESTION = (6, 15)
# How often a candidate of each kind names the product by the question's reference (else "it", "this one").
# Equal for positives, lexical traps and near misses: an earlier 0.85 for traps vs 0.6 for positives made
# the reference anti-correlated with the label and put BM25 below a random order.
REFERENCE_MENTION = {"positive": 0.7, "lexical_trap": 0.7, "near_miss": 0.7, "wrong_answer": 0.6}

# Per attribute: question templates ({ref}), attribute-source keys, prose verb phrases for bullet /
# description / OSP ({v} = value), chat replies for CQA / reviews, and non-answers. Question words and
# evidence words overlap only partly, on purpose.
ATTRIBUTES: dict[str, dict[str, list[str]]] = {
    "colour": {
        "questions": ["what colour is the {ref}", "what color is the {ref}", "which shade does the {ref} come in",
                      "what hue is the {ref}", "what colour does the {ref} come in"],
        "keys": ["color", "colour", "shade", "finish"],
        "prose": ["comes in {v}", "is finished in a {v} shade", "has a {v} finish", "is dyed {v}",
                  "is available in {v}"],
        "chat": ["mine is {v}, exactly like the photo", "it is {v}", "the one i got is {v}",
                 "love the {v} look of it"],
        "misses": ["does anyone know if it comes in other colours", "the colour looked different on my screen",
                   "i can not tell the shade from the pictures", "wish there were more colour options"],
    },
    "material": {
        "questions": ["what is the {ref} made of", "what material is the {ref}", "what fabric is the {ref}",
                      "is the {ref} made of plastic"],
        "keys": ["material", "fabric", "made from", "construction"],
        "prose": ["is made of {v}", "is crafted from {v}", "uses {v} throughout", "is built from durable {v}"],
        "chat": ["it feels like real {v}", "mine is {v} and sturdy", "the body is {v}"],
        "misses": ["not sure what it is made of", "the material feels a bit thin",
                   "does anyone know the fabric content"],
    },
    "waterproof": {
        "questions": ["is the {ref} waterproof", "can i use the {ref} in the rain", "is the {ref} water resistant",
                      "will the {ref} survive getting wet"],
        "keys": ["water resistance", "ip rating", "weather sealing"],
        "prose": ["is rated {v}", "is sealed to {v}", "carries an {v} rating against splashes"],
        "chat": ["it is {v}, i took it out in a storm", "mine says {v} on the box", "yes, {v} rated"],
        "misses": ["i have not tested it in the rain yet", "would like to know about water too",
                   "no idea if it handles getting wet"],
    },
    "charging": {
        "questions": ["how fast does the {ref} charge", "how long does the {ref} take to charge",
                      "how quickly does the {ref} recharge", "what is the charge time of the {ref}"],
        "keys": ["charging speed", "charge time", "time to full battery", "recharge duration"],
        "prose": ["reaches a full battery in {v} minutes", "charges to full in {v} minutes",
                  "needs {v} minutes on the charger", "tops up completely within {v} minutes"],
        "chat": ["about {v} minutes from empty", "mine takes {v} minutes to fill up", "roughly {v} minutes"],
        "misses": ["the battery indicator is hard to read", "does it support fast charging",
                   "did not time the battery yet"],
    },
    "weight": {
        "questions": ["how heavy is the {ref}", "what does the {ref} weigh", "what is the weight of the {ref}",
                      "is the {ref} light"],
        "keys": ["weight", "item weight", "mass", "net weight"],
        "prose": ["weighs {v} grams", "tips the scales at {v} grams", "comes in at {v} grams",
                  "has a mass of {v} grams"],
        "chat": ["around {v} grams on my kitchen scale", "it is {v} grams, feels solid", "about {v} g"],
        "misses": ["heavier than i expected", "does anyone know the exact weight", "feels light in the hand"],
    },
    "warranty": {
        "questions": ["what warranty does the {ref} have", "how long is the warranty on the {ref}",
                      "is the {ref} under guarantee", "what guarantee comes with the {ref}"],
        "keys": ["warranty", "guarantee", "manufacturer cover", "warranty period"],
        "prose": ["is covered by a {v} year warranty", "comes with a {v} year guarantee",
                  "includes {v} years of manufacturer cover"],
        "chat": ["{v} years, it says so on the card", "the seller told me {v} years", "mine came with {v} years"],
        "misses": ["customer service never answered my warranty question", "how do i register the warranty",
                   "not sure the guarantee covers drops"],
    },
    "model": {
        "questions": ["what is the model number of the {ref}", "what is the part number of the {ref}",
                      "which model is the {ref}", "what is the exact model of the {ref}"],
        "keys": ["model number", "part number", "model", "item model number"],
        "prose": ["carries the model number {v}", "is sold as part number {v}", "is the {v} edition",
                  "ships as model {v}"],
        "chat": ["mine is the {v}", "the label says {v}", "it is the {v} version"],
        "misses": ["the model number is hard to find on the box", "which model is newer",
                   "could not find the part number anywhere"],
    },
}
SOURCE_WEIGHTS_POSITIVE = {"attribute": 0.28, "bullet": 0.22, "description": 0.18, "osp": 0.14, "cqa": 0.11,
                           "review": 0.07}
SOURCE_WEIGHTS_TRAP = {"attribute": 0.05, "bullet": 0.05, "description": 0.08, "osp": 0.22, "cqa": 0.3,
                       "review": 0.3}
CHATTER = ["fast shipping and friendly seller", "bought it as a gift for my brother", "packaging was damaged",
           "five stars, would buy again", "the box arrived a day late", "my second order from this shop",
           "returned the first one, this one is fine", "great value for the money"]
REVIEW_PREFIXES = ["bought this last month.", "honest review:", "update after two weeks:",
                   "was unsure at first.", "my wife picked this one."]
REVIEW_SUFFIXES = ["shipping was quick.", "would recommend.", "three stars for the price.",
                   "the box was dented.", "overall happy."]


@dataclass(frozen=True)
class PQAProduct:
    """One product of the PQA world and its attribute values (charging is None when unpowered)."""

    product_id: str
    brand: str
    top: str
    sub: str
    model: str
    colour: str
    material: str
    waterproof: str
    charging: str | None
    weight: str
    warranty: str

    def value(self, attribute: str) -> str:
        value = {"colour": self.colour, "material": self.material, "waterproof": self.waterproof,
                 "charging": self.charging, "weight": self.weight, "warranty": self.warranty,
                 "model": self.model}[attribute]
        if value is None:
            raise ValueError(f"product {self.product_id} has no {attribute}")
        return value

    def attributes(self) -> list[str]:
        return [a for a in ATTRIBUTES if a != "charging" or self.charging is not None]


def _model_number(rng: random.Random, prefix: str, used: set[str]) -> str:
    for _ in range(1000):
        model = f"{prefix}-{rng.randint(10, 99) * 100}"
        if model not in used:
            used.add(model)
            return model
    raise ValueError(f"model number prefix {prefix} is exhausted")


def make_products(num_products: int, rng: random.Random) -> list[PQAProduct]:
    """`num_products` products in families of 2-4 siblings (same brand, subcategory and prefix)."""
    world = build_world()
    products: list[PQAProduct] = []
    used: set[str] = set()
    while len(products) < num_products:
        top = rng.choice(list(CATEGORIES))
        sub = rng.choice(CATEGORIES[top])[0]
        brand = rng.choice(world.brands_for(top))
        prefix = rng.choice(MODEL_PREFIXES)
        for _ in range(min(rng.randint(2, 4), num_products - len(products))):
            powered = top in POWERED
            products.append(PQAProduct(
                product_id=f"PQ{len(products):05d}", brand=brand, top=top, sub=sub,
                model=_model_number(rng, prefix, used), colour=rng.choice(COLOURS),
                material=rng.choice(MATERIALS),
                waterproof=rng.choice(["ipx0", "ipx4", "ipx5", "ipx7", "ipx8"]),
                charging=str(rng.randrange(30, 181, 15)) if powered else None,
                weight=str(rng.randrange(150, 2500, 50)), warranty=str(rng.randint(1, 5))))
    return products


def _reference(product: PQAProduct, attribute: str, rng: random.Random) -> tuple[str, str]:
    """(reference text, kind): the model number, brand + subcategory, or brand + model number."""
    r = rng.random()
    if attribute == "model" or 0.5 <= r < 0.8:
        return f"{product.brand} {product.sub}", "brand"
    if r < 0.5:
        return product.model, "model"
    return f"{product.brand} {product.model}", "model"


def _mention(ref: str, rng: random.Random, p: float) -> str:
    return ref if rng.random() < p else rng.choice(["it", "this one", "this item"])


def render_evidence(source: str, attribute: str, value: str, ref: str, rng: random.Random) -> str:
    """One evidence sentence of `source` stating `value` of `attribute` about the product named `ref`."""
    spec = ATTRIBUTES[attribute]
    if source == "attribute":
        return f"{rng.choice(spec['keys'])}: {value}"
    if source in ("bullet", "description", "osp"):
        prose = rng.choice(spec["prose"]).format(v=value)
        if source == "bullet":
            return f"{rng.choice(spec['keys']).capitalize()} - {value}" if rng.random() < 0.4 else f"{prose.capitalize()}."
        subject = "The " + ref if ref not in ("it", "this one", "this item") else "This product"
        if source == "description":
            return f"{subject} {prose}."
        return f"Editor's pick this season: {subject.lower()} {prose}, a favourite with our readers."
    chat = rng.choice(spec["chat"]).format(v=value)
    if ref not in ("it", "this one", "this item"):
        chat = f"{ref}: {chat}" if source == "cqa" else f"the {ref}, {chat}"
    if source == "review":
        return f"{rng.choice(REVIEW_PREFIXES)} {chat}. {rng.choice(REVIEW_SUFFIXES)}"
    return chat


def render_miss(source: str, attribute: str, ref: str, rng: random.Random) -> str:
    """A CQA / review text about the asked attribute that does not answer the question."""
    text = rng.choice(ATTRIBUTES[attribute]["misses"])
    if ref not in ("it", "this one", "this item"):
        text = f"{text} ({ref})" if source == "cqa" else f"about the {ref}: {text}"
    if source == "review":
        return f"{rng.choice(REVIEW_PREFIXES)} {text}. {rng.choice(REVIEW_SUFFIXES)}"
    return text


def _source(rng: random.Random, weights: dict[str, float]) -> str:
    return rng.choices(list(weights), weights=list(weights.values()))[0]


def _sibling(product: PQAProduct, attribute: str, ref_kind: str,
             families: dict[tuple[str, str], list[PQAProduct]], by_sub: dict[str, list[PQAProduct]],
             rng: random.Random) -> tuple[PQAProduct, str] | None:
    """A near-identical other product and its reference in the question's style (None if there is none)."""
    if ref_kind == "model":
        prefix = product.model.split("-")[0]
        pool = [p for p in families[(product.brand, product.sub)]
                if p.model != product.model and p.model.split("-")[0] == prefix]
        pool = [p for p in pool if attribute in p.attributes() and p.value(attribute) != product.value(attribute)]
        return (sib := rng.choice(pool), sib.model) if pool else None
    pool = [p for p in by_sub[product.sub] if p.brand != product.brand and attribute in p.attributes()
            and p.value(attribute) != product.value(attribute)]
    return (sib := rng.choice(pool), f"{sib.brand} {sib.sub}") if pool else None


def _candidates(product: PQAProduct, attribute: str, ref: str, ref_kind: str, products: list[PQAProduct],
                families: dict, by_sub: dict, rng: random.Random) -> list[tuple[str, str, int, str]]:
    """(evidence, source, label, kind) for one question, unshuffled."""

    def named(kind: str) -> str:  # the reference, or "it" / "this one" / "this item"
        return _mention(ref, rng, REFERENCE_MENTION[kind])

    out = []
    for _ in range(rng.choices([1, 2, 3], weights=[0.45, 0.35, 0.2])[0]):
        src = _source(rng, SOURCE_WEIGHTS_POSITIVE)
        out.append((render_evidence(src, attribute, product.value(attribute), named("positive"), rng),
                    src, 1, "positive"))
    others = [a for a in product.attributes() if a != attribute]
    for other in rng.sample(others, rng.randint(1, 3)):
        src = _source(rng, SOURCE_WEIGHTS_TRAP)
        if src == "attribute":  # an attribute line names no product: make it prose instead
            src = "description"
        out.append((render_evidence(src, other, product.value(other), named("lexical_trap"), rng),
                    src, 0, "lexical_trap"))
    for _ in range(rng.randint(1, 3)):
        sib = _sibling(product, attribute, ref_kind, families, by_sub, rng)
        if sib is None:
            break
        src = rng.choice(["description", "osp", "cqa", "review", "cqa", "review"])
        out.append((render_evidence(src, attribute, sib[0].value(attribute), sib[1], rng), src, 0, "sibling_trap"))
    for _ in range(rng.choices([0, 1, 2], weights=[0.3, 0.45, 0.25])[0]):
        src = rng.choice(["cqa", "review"])
        out.append((render_miss(src, attribute, named("near_miss"), rng), src, 0, "near_miss"))
    wrong = [p for p in products if attribute in p.attributes() and p.value(attribute) != product.value(attribute)]
    for _ in range(rng.choices([0, 1, 2], weights=[0.35, 0.4, 0.25])[0]):
        src = rng.choice(["cqa", "review"])  # a presumptive answer: the right product, a wrong value
        value = rng.choice(wrong).value(attribute)
        out.append((render_evidence(src, attribute, value, named("wrong_answer"), rng), src, 0,
                    "wrong_answer"))
    target = max(rng.randint(*CANDIDATES_PER_QUESTION), len(out))
    while len(out) < target:
        if rng.random() < 0.3:
            src = rng.choice(["review", "cqa"])
            out.append((rng.choice(CHATTER), src, 0, "easy"))
            continue
        other_p = rng.choice(products)
        other_a = rng.choice([a for a in other_p.attributes() if a != attribute])  # never the asked one
        src = rng.choice(EVIDENCE_SOURCES)
        ref_o = other_p.model if rng.random() < 0.5 else f"{other_p.brand} {other_p.sub}"
        out.append((render_evidence(src, other_a, other_p.value(other_a), ref_o, rng), src, 0, "easy"))
    return out


def _split_labels(n: int, rng: random.Random) -> list[str]:
    n_train, n_dev = round(SPLIT_FRACTIONS[0] * n), round(SPLIT_FRACTIONS[1] * n)
    labels = ["train"] * n_train + ["dev"] * n_dev + ["test"] * (n - n_train - n_dev)
    rng.shuffle(labels)
    return labels


def generate_pqa(num_products: int = 300, num_questions: int = 1500, seed: int = 0) -> list[EvidenceRecord]:
    """Seeded synthetic evidence-ranking records (same arguments -> identical records); see the module
    docstring. Question ids are "Q00000".., evidence ids "<question id>-<nn>"; `extra` holds the asked
    `attribute`, the candidate's `kind` (positive, lexical_trap, sibling_trap, near_miss, wrong_answer,
    easy) and the
    question's `ref_kind` (model or brand)."""
    if num_products < 2 or num_questions < 1:
        raise ValueError(f"generate_pqa: need num_products >= 2 and num_questions >= 1, got "
                         f"{num_products}, {num_questions}")
    rng = random.Random(seed)
    products = make_products(num_products, rng)
    families: dict[tuple[str, str], list[PQAProduct]] = {}
    by_sub: dict[str, list[PQAProduct]] = {}
    for p in products:
        families.setdefault((p.brand, p.sub), []).append(p)
        by_sub.setdefault(p.sub, []).append(p)
    splits = _split_labels(num_questions, rng)
    records: list[EvidenceRecord] = []
    for qi in range(num_questions):
        product = rng.choice(products)
        attribute = rng.choice(product.attributes())
        ref, ref_kind = _reference(product, attribute, rng)
        question = rng.choice(ATTRIBUTES[attribute]["questions"]).format(ref=ref)
        cands = _candidates(product, attribute, ref, ref_kind, products, families, by_sub, rng)
        rng.shuffle(cands)
        qid = f"Q{qi:05d}"
        for j, (text, source, label, kind) in enumerate(cands):
            records.append(EvidenceRecord(qid, question, f"{qid}-{j:02d}", text, source, label, product.product_id,
                                          splits[qi], {"attribute": attribute, "kind": kind, "ref_kind": ref_kind}))
    return records


def split_records(records: list[EvidenceRecord], split: str) -> list[EvidenceRecord]:
    """The records of one split ("train", "dev" or "test")."""
    if split not in SPLIT_NAMES:
        raise ValueError(f"split must be one of {SPLIT_NAMES}, got {split!r}")
    return [r for r in records if r.split == split]
