"""A seeded synthetic e-commerce world in the `madr.data.schema` layout (for tests and the demo).

It mimics the data of paper 000 Sec. 8.1 and paper 001 Sec. 5.1 (MA-Amazon ESCI) at toy scale:

- 18 top categories with 3-4 subcategories each; `category` is multi-valued ([top, sub], e.g.
  ["shoes", "running shoes"]) and the values are multi-word phrases, so phrase, word and token
  granularities differ (paper 001 Sec. 3: "handmade products" -> [handmade, products] -> [hand, ##made, ...]);
- 50 brands, each selling in 2-4 top categories (its home, a complement of it, 0-2 others); several
  share words or word pieces ("north peak" / "peak outdoor", "zentra" / "zentrix");
- 15 colours (some multi-word); ~15% of products have no colour (grocery never has one), ~20% of the
  others two; ~10% have no brand;
- titles mix brand, colour(s), subcategory phrase and 1-2 attribute words in varying order; descriptions
  repeat some aspects with filler, so aspect values are visible in the text most of the time;
- queries mention the category almost always (sometimes through a synonym such as "sneakers" for
  "running shoes", or only the top category), the brand ~50% and a colour ~40% of the time; their
  annotations are the canonical values of what they mention; 70/15/15 train/dev/test;
- 10-20 judgments per query graded by `grade`: all mentioned aspects match -> 4 or 3 (E), same top
  category but a mismatch -> 2 (S), a complementary category -> 1 (C), else 0 (I). Every query is built
  from an anchor product, which is an exact match, so every query has a positive.

`languages` (e.g. ["en", "de", "fr", "es"], the languages of paper 004's search data) renders each query
in one of them through a small lexicon (brands stay as they are; annotations stay canonical English).
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass

from madr.data.schema import SPLITS, Catalog, Judgment, Product, Query

ASPECT_NAMES = ["category", "brand", "color"]
LANGUAGES = ("en", "de", "fr", "es")
SPLIT_FRACTIONS = (0.70, 0.15, 0.15)
ESCI_BY_RELEVANCE = {4: "E", 3: "E", 2: "S", 1: "C", 0: "I"}

# top category -> [(subcategory, [query synonyms])]
CATEGORIES: dict[str, list[tuple[str, list[str]]]] = {
    "shoes": [
        ("running shoes", ["sneakers", "trainers"]),
        ("hiking boots", ["trail boots", "trekking boots"]),
        ("beach sandals", ["flip flops"]),
        ("dress shoes", ["oxfords", "formal loafers"]),
    ],
    "socks": [
        ("athletic socks", ["sport socks"]),
        ("wool socks", ["merino socks"]),
        ("ankle socks", ["no show socks"]),
    ],
    "bags": [
        ("laptop bags", ["notebook sleeve", "computer case"]),
        ("travel backpacks", ["rucksack", "daypack"]),
        ("tote bags", ["shopper bag"]),
    ],
    "computers": [
        ("gaming laptops", ["gaming notebook"]),
        ("wireless keyboards", ["bluetooth keyboard"]),
        ("wireless mice", ["cordless mouse"]),
    ],
    "kitchen appliances": [
        ("coffee makers", ["espresso machine", "coffee machine"]),
        ("electric kettles", ["water boiler"]),
        ("stand mixers", ["dough mixer"]),
        ("toasters", ["bread toaster"]),
    ],
    "grocery": [
        ("coffee beans", ["whole bean coffee"]),
        ("green tea", ["matcha"]),
        ("dark chocolate", ["cocoa bar"]),
    ],
    "phone accessories": [
        ("phone cases", ["phone cover"]),
        ("charging cables", ["usb cord", "charger cable"]),
        ("screen protectors", ["tempered glass"]),
    ],
    "audio": [
        ("noise cancelling headphones", ["anc headset", "over ear headphones"]),
        ("bluetooth speakers", ["portable speaker"]),
        ("wireless earbuds", ["true wireless earphones"]),
    ],
    "bedding": [
        ("duvet covers", ["comforter cover", "quilt cover"]),
        ("pillow cases", ["pillowcase"]),
        ("fitted sheets", ["bed sheets"]),
    ],
    "furniture": [
        ("office chairs", ["desk chair", "ergonomic chair"]),
        ("standing desks", ["sit stand desk"]),
        ("bookshelves", ["book case"]),
        ("bed frames", ["platform bed"]),
    ],
    "outdoor gear": [
        ("camping tents", ["dome tent"]),
        ("sleeping bags", ["mummy bag"]),
        ("trekking poles", ["hiking sticks"]),
    ],
    "sportswear": [
        ("running jackets", ["windbreaker"]),
        ("yoga pants", ["leggings"]),
        ("hoodies", ["hooded sweatshirt"]),
        ("t-shirts", ["tees"]),
    ],
    "fitness equipment": [
        ("yoga mats", ["exercise mat"]),
        ("dumbbells", ["hand weights"]),
        ("resistance bands", ["workout bands"]),
    ],
    "toys": [
        ("building blocks", ["construction bricks"]),
        ("board games", ["family game"]),
        ("plush toys", ["stuffed animal"]),
    ],
    "skin care": [
        ("face cream", ["moisturizer"]),
        ("sunscreen", ["sun block", "spf lotion"]),
        ("lip balm", ["chapstick"]),
    ],
    "pet supplies": [("dog food", ["puppy kibble"]), ("cat toys", ["kitten toy"]), ("pet beds", ["dog bed"])],
    "garden": [
        ("garden hoses", ["water hose"]),
        ("plant pots", ["flower pot", "planter"]),
        ("pruning shears", ["garden scissors", "secateurs"]),
    ],
    "handmade products": [
        ("scented candles", ["aroma candle"]),
        ("knitted scarves", ["wool scarf"]),
        ("ceramic mugs", ["pottery cup"]),
    ],
}

# top category -> complementary top categories (relevance 1, ESCI "C")
COMPLEMENTS: dict[str, list[str]] = {
    "shoes": ["socks"],
    "socks": ["shoes"],
    "bags": ["computers"],
    "computers": ["bags", "audio"],
    "kitchen appliances": ["grocery"],
    "grocery": ["kitchen appliances"],
    "phone accessories": ["audio"],
    "audio": ["phone accessories"],
    "bedding": ["furniture"],
    "furniture": ["bedding"],
    "outdoor gear": ["sportswear", "shoes"],
    "sportswear": ["fitness equipment"],
    "fitness equipment": ["sportswear"],
    "toys": ["handmade products"],
    "skin care": ["handmade products"],
    "pet supplies": ["garden"],
    "garden": ["outdoor gear"],
    "handmade products": ["skin care"],
}

# brand -> its home top category (each brand also sells in 1-3 others, drawn once for the world)
BRANDS: dict[str, str] = {
    "north peak": "outdoor gear",
    "peak outdoor": "outdoor gear",
    "summit trail": "shoes",
    "trail works": "outdoor gear",
    "urban step": "shoes",
    "step ahead": "shoes",
    "swift stride": "sportswear",
    "stride lab": "socks",
    "cozy toes": "socks",
    "river stone": "bags",
    "stone craft": "handmade products",
    "voyager": "bags",
    "technova": "computers",
    "techno": "computers",
    "zentra": "phone accessories",
    "zentrix": "phone accessories",
    "voltix": "phone accessories",
    "volt edge": "computers",
    "pixel forge": "computers",
    "forge gear": "fitness equipment",
    "soundwave": "audio",
    "wave audio": "audio",
    "echo bay": "audio",
    "brew house": "kitchen appliances",
    "brewmaster": "kitchen appliances",
    "kitchen pro": "kitchen appliances",
    "sun valley": "grocery",
    "valley farms": "grocery",
    "cocoa loco": "grocery",
    "cozy cloud": "bedding",
    "cloud nine": "bedding",
    "dream weave": "bedding",
    "oak & ash": "furniture",
    "oakridge": "furniture",
    "home nest": "furniture",
    "nest living": "handmade products",
    "iron core": "fitness equipment",
    "core motion": "sportswear",
    "fit forge": "fitness equipment",
    "brickster": "toys",
    "playful": "toys",
    "game night": "toys",
    "glow naturals": "skin care",
    "natura": "skin care",
    "wild fern": "skin care",
    "happy paws": "pet supplies",
    "paw pal": "pet supplies",
    "bloom garden": "garden",
    "root & stem": "garden",
    "clayworks": "handmade products",
}

COLOURS = [
    "black",
    "white",
    "red",
    "navy blue",
    "dark green",
    "light grey",
    "charcoal",
    "pink",
    "brown",
    "beige",
    "yellow",
    "orange",
    "purple",
    "silver",
    "rose gold",
]
MATERIALS = [
    "cotton",
    "leather",
    "bamboo",
    "stainless steel",
    "wool",
    "ceramic",
    "recycled",
    "linen",
    "aluminium",
]
SIZES = ["small", "large", "xl", "compact", "2 pack", "family size"]
# categories where the generic attributes make no sense get their own; grocery has no colour
ATTRIBUTE_OVERRIDES = {
    "grocery": ["organic", "fair trade", "1 kg", "family size", "premium", "dark roast"],
    "skin care": ["organic", "sensitive skin", "travel size", "unscented", "premium", "spf 50"],
}
COLOURLESS = ("grocery",)
STYLES = ["classic", "vintage", "slim", "lightweight", "waterproof", "premium", "eco friendly", "minimalist"]
QUERY_FILLERS = ["cheap", "best", "for women", "for men", "sale", "for kids", "gift", "new"]
DESCRIPTION_FILLERS = [
    "Free returns within 30 days.",
    "Easy to clean and built to last.",
    "A great gift idea.",
    "Customers love the fit and finish.",
    "Ships in recyclable packaging.",
    "Backed by a two year warranty.",
    "Designed for everyday use.",
]

# (prefix, field, suffix) segments; a segment whose field is missing is left out.
TITLE_TEMPLATES = [
    [("", "brand", ""), ("", "attrs", ""), ("", "colour", ""), ("", "sub", "")],
    [("", "attrs", ""), ("", "sub", ""), ("by ", "brand", ""), ("in ", "colour", "")],
    [("", "brand", ""), ("", "sub", ""), (", ", "colour", ""), (", ", "attrs", "")],
    [("", "colour", ""), ("", "attrs", ""), ("", "sub", ""), ("(", "brand", ")")],
    [("", "sub", ""), ("- ", "brand", ""), ("", "attrs", ""), ("| ", "colour", "")],
]
DESCRIPTION_TEMPLATES = [
    [("", "brand", ""), ("", "attrs", ""), ("", "sub", ""), (", available in ", "colour", "")],
    [("", "brand", ""), ("", "sub", " made for daily use.")],
    [("Available in ", "colour", ".")],
    [("Part of our ", "top", " collection.")],
    [("Quality ", "sub", ""), ("in ", "colour", ""), ("by ", "brand", ".")],
]
QUERY_TEMPLATES = [
    ("brand", "colour", "cat"),
    ("colour", "cat", "brand"),
    ("cat", "brand", "colour"),
    ("brand", "cat", "colour"),
    ("colour", "brand", "cat"),
    ("cat", "colour", "brand"),
]

# English term -> (de, fr, es); used for queries in other languages (brands are not translated).
TRANSLATIONS: dict[str, tuple[str, str, str]] = {
    "shoes": ("schuhe", "chaussures", "zapatos"),
    "running shoes": ("laufschuhe", "chaussures de course", "zapatillas de running"),
    "hiking boots": ("wanderstiefel", "chaussures de randonnée", "botas de montaña"),
    "beach sandals": ("strandsandalen", "sandales de plage", "sandalias de playa"),
    "dress shoes": ("anzugschuhe", "chaussures de ville", "zapatos de vestir"),
    "socks": ("socken", "chaussettes", "calcetines"),
    "athletic socks": ("sportsocken", "chaussettes de sport", "calcetines deportivos"),
    "wool socks": ("wollsocken", "chaussettes en laine", "calcetines de lana"),
    "ankle socks": ("sneakersocken", "socquettes", "calcetines tobilleros"),
    "bags": ("taschen", "sacs", "bolsos"),
    "laptop bags": ("laptoptaschen", "sacoches pour ordinateur", "bolsas para portátil"),
    "travel backpacks": ("reiserucksäcke", "sacs à dos de voyage", "mochilas de viaje"),
    "tote bags": ("einkaufstaschen", "sacs cabas", "bolsas de tela"),
    "computers": ("computer", "ordinateurs", "ordenadores"),
    "gaming laptops": ("gaming laptops", "pc portables gaming", "portátiles gaming"),
    "wireless keyboards": ("kabellose tastaturen", "claviers sans fil", "teclados inalámbricos"),
    "wireless mice": ("kabellose mäuse", "souris sans fil", "ratones inalámbricos"),
    "kitchen appliances": ("küchengeräte", "électroménager de cuisine", "electrodomésticos de cocina"),
    "coffee makers": ("kaffeemaschinen", "cafetières", "cafeteras"),
    "electric kettles": ("wasserkocher", "bouilloires électriques", "hervidores eléctricos"),
    "stand mixers": ("küchenmaschinen", "robots pâtissiers", "batidoras amasadoras"),
    "toasters": ("toaster", "grille-pain", "tostadoras"),
    "grocery": ("lebensmittel", "épicerie", "alimentación"),
    "coffee beans": ("kaffeebohnen", "café en grains", "café en grano"),
    "green tea": ("grüner tee", "thé vert", "té verde"),
    "dark chocolate": ("zartbitterschokolade", "chocolat noir", "chocolate negro"),
    "phone accessories": ("handyzubehör", "accessoires téléphone", "accesorios para móvil"),
    "phone cases": ("handyhüllen", "coques de téléphone", "fundas de móvil"),
    "charging cables": ("ladekabel", "câbles de charge", "cables de carga"),
    "screen protectors": ("displayschutzfolien", "protections d'écran", "protectores de pantalla"),
    "audio": ("audio", "audio", "audio"),
    "noise cancelling headphones": (
        "kopfhörer mit geräuschunterdrückung",
        "casques à réduction de bruit",
        "auriculares con cancelación de ruido",
    ),
    "bluetooth speakers": ("bluetooth lautsprecher", "enceintes bluetooth", "altavoces bluetooth"),
    "wireless earbuds": ("kabellose ohrhörer", "écouteurs sans fil", "auriculares inalámbricos"),
    "bedding": ("bettwäsche", "linge de lit", "ropa de cama"),
    "duvet covers": ("bettbezüge", "housses de couette", "fundas nórdicas"),
    "pillow cases": ("kissenbezüge", "taies d'oreiller", "fundas de almohada"),
    "fitted sheets": ("spannbettlaken", "draps housses", "sábanas bajeras"),
    "furniture": ("möbel", "meubles", "muebles"),
    "office chairs": ("bürostühle", "chaises de bureau", "sillas de oficina"),
    "standing desks": ("stehschreibtische", "bureaux debout", "escritorios elevables"),
    "bookshelves": ("bücherregale", "bibliothèques", "estanterías"),
    "bed frames": ("bettgestelle", "cadres de lit", "estructuras de cama"),
    "outdoor gear": ("outdoor ausrüstung", "équipement outdoor", "equipo de montaña"),
    "camping tents": ("campingzelte", "tentes de camping", "tiendas de campaña"),
    "sleeping bags": ("schlafsäcke", "sacs de couchage", "sacos de dormir"),
    "trekking poles": ("wanderstöcke", "bâtons de randonnée", "bastones de trekking"),
    "sportswear": ("sportbekleidung", "vêtements de sport", "ropa deportiva"),
    "running jackets": ("laufjacken", "vestes de running", "chaquetas de running"),
    "yoga pants": ("yogahosen", "pantalons de yoga", "pantalones de yoga"),
    "hoodies": ("kapuzenpullover", "sweats à capuche", "sudaderas con capucha"),
    "t-shirts": ("t-shirts", "tee-shirts", "camisetas"),
    "fitness equipment": ("fitnessgeräte", "équipement de fitness", "material de fitness"),
    "yoga mats": ("yogamatten", "tapis de yoga", "esterillas de yoga"),
    "dumbbells": ("hanteln", "haltères", "mancuernas"),
    "resistance bands": ("widerstandsbänder", "bandes de résistance", "bandas elásticas"),
    "toys": ("spielzeug", "jouets", "juguetes"),
    "building blocks": ("bausteine", "jeux de construction", "bloques de construcción"),
    "board games": ("brettspiele", "jeux de société", "juegos de mesa"),
    "plush toys": ("plüschtiere", "peluches", "peluches"),
    "skin care": ("hautpflege", "soins de la peau", "cuidado de la piel"),
    "face cream": ("gesichtscreme", "crème visage", "crema facial"),
    "sunscreen": ("sonnencreme", "crème solaire", "protector solar"),
    "lip balm": ("lippenbalsam", "baume à lèvres", "bálsamo labial"),
    "pet supplies": ("tierbedarf", "animalerie", "productos para mascotas"),
    "dog food": ("hundefutter", "croquettes pour chien", "comida para perros"),
    "cat toys": ("katzenspielzeug", "jouets pour chat", "juguetes para gatos"),
    "pet beds": ("tierbetten", "paniers pour animaux", "camas para mascotas"),
    "garden": ("garten", "jardin", "jardín"),
    "garden hoses": ("gartenschläuche", "tuyaux d'arrosage", "mangueras de jardín"),
    "plant pots": ("blumentöpfe", "pots de fleurs", "macetas"),
    "pruning shears": ("gartenscheren", "sécateurs", "tijeras de podar"),
    "handmade products": ("handgemachte produkte", "produits faits main", "productos artesanales"),
    "scented candles": ("duftkerzen", "bougies parfumées", "velas aromáticas"),
    "knitted scarves": ("strickschals", "écharpes tricotées", "bufandas de punto"),
    "ceramic mugs": ("keramikbecher", "mugs en céramique", "tazas de cerámica"),
    "black": ("schwarz", "noir", "negro"),
    "white": ("weiß", "blanc", "blanco"),
    "red": ("rot", "rouge", "rojo"),
    "navy blue": ("marineblau", "bleu marine", "azul marino"),
    "dark green": ("dunkelgrün", "vert foncé", "verde oscuro"),
    "light grey": ("hellgrau", "gris clair", "gris claro"),
    "charcoal": ("anthrazit", "anthracite", "antracita"),
    "pink": ("rosa", "rose", "rosa"),
    "brown": ("braun", "marron", "marrón"),
    "beige": ("beige", "beige", "beis"),
    "yellow": ("gelb", "jaune", "amarillo"),
    "orange": ("orange", "orange", "naranja"),
    "purple": ("lila", "violet", "morado"),
    "silver": ("silber", "argent", "plateado"),
    "rose gold": ("roségold", "or rose", "oro rosa"),
    "cheap": ("günstig", "pas cher", "barato"),
    "best": ("beste", "meilleur", "mejor"),
    "for women": ("für damen", "pour femme", "para mujer"),
    "for men": ("für herren", "pour homme", "para hombre"),
    "sale": ("angebot", "soldes", "oferta"),
    "for kids": ("für kinder", "pour enfant", "para niños"),
    "gift": ("geschenk", "cadeau", "regalo"),
    "new": ("neu", "nouveau", "nuevo"),
}
_LANG_INDEX = {"de": 0, "fr": 1, "es": 2}


def translate(term: str, language: str) -> str:
    """`term` in `language` from the lexicon (English, or the term itself when it has no entry)."""
    if language == "en" or term not in TRANSLATIONS:
        return term
    return TRANSLATIONS[term][_LANG_INDEX[language]]


def parallel_phrases(languages: Sequence[str] = ("de", "fr", "es")) -> list[tuple[str, str, str]]:
    """(language, phrase, English phrase) pairs of the lexicon, e.g. for a translation bridge task."""
    _check_languages(languages)
    return [
        (lang, row[_LANG_INDEX[lang]], en)
        for lang in languages
        if lang != "en"
        for en, row in TRANSLATIONS.items()
    ]


def _check_languages(languages: Sequence[str]) -> None:
    bad = [lang for lang in languages if lang not in LANGUAGES]
    if bad or not languages:
        raise ValueError(f"languages must be a non-empty subset of {LANGUAGES}, got {list(languages)}")


# -- grading ---------------------------------------------------------------------------------------
def _top(aspects: dict[str, list[str]]) -> str | None:
    cats = aspects.get("category", [])
    return cats[0] if cats else None


def grade(query_aspects: dict[str, list[str]], product_aspects: dict[str, list[str]]) -> int:
    """Graded relevance 0-4 of a product for a query, from their annotations (see the module docstring).

    4: every mentioned aspect matches, the query names the subcategory (or no category) and, when it
    names a colour, the product has exactly that colour; 3: every mentioned aspect matches otherwise;
    2: same top category (or, without a category, some mentioned aspect matches) but a mismatch;
    1: the product's top category complements the query's; 0: otherwise.
    """
    q_top, p_top = _top(query_aspects), _top(product_aspects)
    if q_top is not None and p_top != q_top:
        return 1 if p_top in COMPLEMENTS.get(q_top, []) else 0
    matches = [set(vals) <= set(product_aspects.get(a, [])) for a, vals in query_aspects.items() if vals]
    if matches and all(matches):
        q_colours = query_aspects.get("color", [])
        exact_colour = not q_colours or set(product_aspects.get("color", [])) == set(q_colours)
        return 4 if len(query_aspects.get("category", [])) != 1 and exact_colour else 3
    if q_top is not None or any(matches):
        return 2
    return 0


def esci_label(relevance: int) -> str:
    """ESCI label of a synthetic relevance grade: 4/3 -> E, 2 -> S, 1 -> C, 0 -> I."""
    if relevance not in ESCI_BY_RELEVANCE:
        raise ValueError(f"relevance must be in 0..4, got {relevance!r}")
    return ESCI_BY_RELEVANCE[relevance]


# -- world -----------------------------------------------------------------------------------------
@dataclass(frozen=True)
class World:
    """The fixed part of the world: which top categories each brand sells in."""

    brand_tops: dict[str, list[str]]

    def brands_for(self, top: str) -> list[str]:
        return [b for b, tops in self.brand_tops.items() if top in tops]


def build_world(seed: int = 1234) -> World:
    """Which top categories each brand sells in: its home, the first complement of it and 0-2 others.

    Drawn from its own fixed seed, so every catalog seed samples products from the same world.
    """
    rng = random.Random(seed)
    tops = list(CATEGORIES)
    brand_tops = {}
    for brand, home in BRANDS.items():
        related = COMPLEMENTS[home]
        others = [t for t in tops if t != home and t not in related]
        brand_tops[brand] = [home] + related[:1] + rng.sample(others, rng.randint(0, 2))
    return World(brand_tops)


def _render(template: list[tuple[str, str, str]], fields: dict[str, str]) -> str:
    parts = [f"{pre}{fields[name]}{suf}" for pre, name, suf in template if fields.get(name)]
    return " ".join(parts).replace(" ,", ",")


def _capitalise(text: str) -> str:
    return text[:1].upper() + text[1:]


def _attributes(rng: random.Random, top: str) -> list[str]:
    if top in ATTRIBUTE_OVERRIDES:
        return rng.sample(ATTRIBUTE_OVERRIDES[top], rng.randint(1, 2))
    groups = rng.sample([MATERIALS, SIZES, STYLES], rng.randint(1, 2))
    return [rng.choice(g) for g in groups]


def _make_product(i: int, rng: random.Random, world: World) -> Product:
    top = rng.choice(list(CATEGORIES))
    sub = rng.choice(CATEGORIES[top])[0]
    brand = rng.choice(world.brands_for(top)) if rng.random() >= 0.10 else None
    no_colour = top in COLOURLESS or rng.random() < 0.10
    colours = [] if no_colour else rng.sample(COLOURS, 2 if rng.random() < 0.2 else 1)
    attrs = _attributes(rng, top)
    colour_text = rng.choice([" and ", "/"]).join(colours)
    title_fields = {
        "brand": brand.title() if brand and rng.random() < 0.95 else "",
        "colour": colour_text if rng.random() < 0.9 else "",
        "sub": sub,
        "attrs": " ".join(attrs),
    }
    title = _capitalise(_render(rng.choice(TITLE_TEMPLATES), title_fields))
    desc_fields = {
        "brand": brand.title() if brand else "",
        "colour": colour_text,
        "sub": sub,
        "top": top,
        "attrs": rng.choice(attrs),
    }
    sentences = [
        _capitalise(_render(t, desc_fields)) for t in rng.sample(DESCRIPTION_TEMPLATES, rng.randint(1, 2))
    ]
    sentences = [s if s.endswith(".") else s + "." for s in sentences if s]
    description = " ".join(sentences + [rng.choice(DESCRIPTION_FILLERS)])
    aspects = {"category": [top, sub], "brand": [brand] if brand else [], "color": colours}
    return Product(f"P{i:06d}", title, description, aspects)


def _make_query(anchor: Product, rng: random.Random, language: str) -> tuple[str, dict[str, list[str]]]:
    """(text, annotations) of a query that the anchor product matches exactly."""
    top, sub = anchor.aspects["category"]
    brand = anchor.aspects["brand"][0] if anchor.aspects["brand"] and rng.random() < 0.5 else None
    colour = rng.choice(anchor.aspects["color"]) if anchor.aspects["color"] and rng.random() < 0.40 else None
    use_category = rng.random() < 0.96 or brand is None
    form = rng.random()
    if not use_category:
        cat_text, category = "", []
    elif form < 0.15:
        cat_text, category = translate(top, language), [top]
    elif form < 0.40 and language == "en":
        cat_text, category = rng.choice(dict(CATEGORIES[top])[sub]), [top, sub]
    else:
        cat_text, category = translate(sub, language), [top, sub]
    fields = {"brand": brand or "", "colour": translate(colour, language) if colour else "", "cat": cat_text}
    words = [fields[f] for f in rng.choice(QUERY_TEMPLATES) if fields[f]]
    if rng.random() < 0.3:
        filler = translate(rng.choice(QUERY_FILLERS), language)
        words = [filler] + words if rng.random() < 0.5 else words + [filler]
    aspects = {"category": category, "brand": [brand] if brand else [], "color": [colour] if colour else []}
    return " ".join(words), aspects


def _splits(n: int, rng: random.Random) -> list[str]:
    n_train = round(SPLIT_FRACTIONS[0] * n)
    n_dev = round(SPLIT_FRACTIONS[1] * n)
    labels = [SPLITS[0]] * n_train + [SPLITS[1]] * n_dev + [SPLITS[2]] * (n - n_train - n_dev)
    rng.shuffle(labels)
    return labels


def _judge(
    query: Query, anchor: Product, products: list[Product], by_top: dict[str, list[int]], rng: random.Random
) -> list[Judgment]:
    """10-20 judgments: some exact matches (always the anchor), substitutes, complements, irrelevant."""
    q_top = _top(query.aspects)
    if q_top is None:
        pool = range(len(products))
    else:
        pool = by_top[q_top] + [i for t in COMPLEMENTS.get(q_top, []) for i in by_top[t]]
    graded: dict[int, list[int]] = {g: [] for g in range(5)}
    for i in pool:
        graded[grade(query.aspects, products[i].aspects)].append(i)
    anchor_idx = int(anchor.product_id[1:])
    exact = [i for i in graded[4] + graded[3] if i != anchor_idx]
    chosen = [anchor_idx] + rng.sample(exact, min(len(exact), rng.randint(1, 6)))
    chosen += rng.sample(graded[2], min(len(graded[2]), rng.randint(3, 6)))
    chosen += rng.sample(graded[1], min(len(graded[1]), rng.randint(1, 3)))
    target = min(rng.randint(10, 20), len(products))
    taken = set(chosen)
    for _ in range(50 * target):
        if len(chosen) >= target:
            break
        i = rng.randrange(len(products))
        if i not in taken and grade(query.aspects, products[i].aspects) == 0:
            chosen.append(i)
            taken.add(i)
    out = []
    for i in sorted(chosen):
        rel = grade(query.aspects, products[i].aspects)
        out.append(Judgment(query.query_id, products[i].product_id, rel, esci_label(rel)))
    return out


def generate_catalog(
    num_products: int = 2000, num_queries: int = 600, seed: int = 0, languages: Sequence[str] | None = None
) -> Catalog:
    """A seeded synthetic catalog (same arguments -> identical catalog); see the module docstring."""
    if num_products < 1 or num_queries < 1:
        raise ValueError(f"num_products and num_queries must be >= 1, got {num_products}, {num_queries}")
    languages = list(languages) if languages is not None else ["en"]
    _check_languages(languages)
    rng = random.Random(seed)
    world = build_world()
    products = [_make_product(i, rng, world) for i in range(num_products)]
    by_top: dict[str, list[int]] = {t: [] for t in CATEGORIES}
    for i, p in enumerate(products):
        by_top[p.aspects["category"][0]].append(i)
    splits = _splits(num_queries, rng)
    queries, judgments, seen = [], [], set()
    for _ in range(200 * num_queries):
        if len(queries) == num_queries:
            break
        anchor = rng.choice(products)
        language = rng.choice(languages)
        text, aspects = _make_query(anchor, rng, language)
        if text in seen:
            continue
        seen.add(text)
        q = Query(f"Q{len(queries):05d}", text, aspects, splits[len(queries)], language)
        queries.append(q)
        judgments.extend(_judge(q, anchor, products, by_top, rng))
    if len(queries) < num_queries:
        raise ValueError(
            f"could only make {len(queries)} distinct queries out of {num_queries} requested; "
            f"use more products or fewer queries"
        )
    return Catalog(products, queries, judgments, list(ASPECT_NAMES)).validate()
