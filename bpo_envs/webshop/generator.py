"""A deterministic generator of WebShop-format catalogs (the bundled offline data).

:func:`generate_catalog` returns, for ``n_products`` products drawn from ``seed``, the three
upstream files' contents:

* ``items_shuffle.json`` — a list of raw product records (``asin``, ``name``, ``category``,
  ``query``, ``product_category``, ``full_description``, ``small_description``, ``pricing``,
  ``customization_options``, ``images``, ``product_information``);
* ``items_ins_v2.json`` — ``{asin: {"attributes", "instruction", "instruction_attributes"}}``;
* ``reviews.json`` — ``[{"asin", "reviews": [{"title", "stars", "review"}], "average_rating"}]``.

Products come from 30 product types over upstream's five categories (beauty, electronics,
fashion, food, furniture), each with its own search query, category path, attribute pool,
option groups and price range; titles, descriptions, bullet points, options, prices and
instructions are assembled from those pools. Every product of a type shares words with its
siblings, so search and reward have to discriminate (distractors), as on the real site.
The output depends only on ``(n_products, seed)`` and this module's ``GENERATOR_VERSION``.
"""

from __future__ import annotations

import json
import os
import random
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bpo_envs.files import user_cache_dir

GENERATOR_VERSION = 2
DEFAULT_N_PRODUCTS = 3000
DEFAULT_SEED = 0


@dataclass(frozen=True)
class ProductType:
    noun: str
    query: str
    category: str
    path: str
    attributes: tuple[str, ...]
    options: tuple[tuple[str, tuple[str, ...]], ...]
    price: tuple[float, float]
    extras: tuple[str, ...]


_COLORS = ("black", "white", "navy blue", "grey", "red", "beige", "dark green", "pink",
           "light blue", "brown", "burgundy", "khaki", "purple", "ivory", "teal")  # fmt: skip
_CLOTHING_SIZES = ("x-small", "small", "medium", "large", "x-large", "xx-large", "3x-large")
_SHOE_SIZES = ("6", "6.5", "7", "7.5", "8", "8.5", "9", "9.5", "10", "10.5", "11", "12")


def _t(noun, query, category, path, attributes, options, price, extras=()) -> ProductType:
    return ProductType(noun, query, category, path, tuple(attributes),
                       tuple((k, tuple(v)) for k, v in options), price, tuple(extras))  # fmt: skip


_BEAUTY = "Beauty & Personal Care"
_FOOD = "Grocery & Gourmet Food"
_FASHION = "Clothing, Shoes & Jewelry"
_HOME = "Home & Kitchen › Furniture"
_ELEC = "Electronics"

PRODUCT_TYPES: tuple[ProductType, ...] = (
    _t("deodorant", "deodorant", "beauty", f"{_BEAUTY} › Personal Care › Deodorants & Antiperspirants",
       ["long lasting", "aluminum free", "sensitive skin", "natural ingredients", "cruelty free", "paraben free"],
       [("scent", ["bright citrus", "calming lavender", "ginger fresh", "unscented", "coconut", "cedar & patchouli"]),
        ("size", ["2.5 ounce (pack of 1)", "3 ounce (pack of 1)", "3 ounce (pack of 2)", "travel set (4-pack)"])],
       (6.0, 24.0), ["stick", "roll-on"]),
    _t("shampoo", "shampoo", "beauty", f"{_BEAUTY} › Hair Care › Shampoo & Conditioner › Shampoos",
       ["sulfate free", "color safe", "dry hair", "hair growth", "tea tree oil", "argan oil"],
       [("size", ["8 fl oz (pack of 1)", "16 fl oz (pack of 1)", "33.8 fl oz (pack of 1)", "16 fl oz (pack of 2)"])],
       (7.0, 35.0), ["and conditioner set", "for men", "for women"]),
    _t("lipstick", "lipstick", "beauty", f"{_BEAUTY} › Makeup › Lips › Lipstick",
       ["long lasting", "matte finish", "cruelty free", "highly pigmented", "moisturizing", "vegan"],
       [("color", ["ruby red", "nude pink", "coral", "berry", "mauve", "plum", "classic red", "rose"])],
       (5.0, 28.0), ["liquid", "set"]),
    _t("face moisturizer", "face moisturizer", "beauty", f"{_BEAUTY} › Skin Care › Face › Creams & Moisturizers",
       ["fine lines", "dry skin", "hyaluronic acid", "oil free", "fragrance free", "spf 30"],
       [("size", ["1.7 ounce", "2.5 ounce", "3.4 ounce"])],
       (9.0, 60.0), ["cream", "gel", "lotion"]),
    _t("hair extension", "hair extensions", "beauty", f"{_BEAUTY} › Hair Care › Hair Extensions, Wigs & Accessories",
       ["natural looking", "clip in", "heat resistant", "easy to use", "human hair", "synthetic hair"],
       [("color", ["jet black", "dark brown", "light brown", "honey blonde", "platinum blonde", "auburn"]),
        ("size", ["14 inch", "18 inch", "22 inch", "26 inch"])],
       (12.0, 90.0), ["ponytail", "wig"]),
    _t("nail polish", "nail polish", "beauty", f"{_BEAUTY} › Foot, Hand & Nail Care › Nail Polish",
       ["quick drying", "long lasting", "non toxic", "gel finish", "chip resistant"],
       [("color", ["cherry red", "baby pink", "nude", "navy blue", "glitter silver", "mint green", "black"])],
       (4.0, 18.0), ["kit", "set"]),
    _t("coffee", "ground coffee", "food", f"{_FOOD} › Beverages › Coffee, Tea & Cocoa › Coffee › Ground Coffee",
       ["medium roast", "dark roast", "organic", "fair trade", "decaf", "single origin"],
       [("flavor name", ["original", "french vanilla", "hazelnut", "mocha", "caramel", "breakfast blend"]),
        ("size", ["12 ounce (pack of 1)", "2 pound (pack of 1)", "12 ounce (pack of 3)"])],
       (8.0, 40.0), ["beans", "pods"]),
    _t("protein bar", "protein bars", "food", f"{_FOOD} › Snack Foods › Bars › Protein Bars",
       ["gluten free", "low sugar", "high protein", "keto friendly", "non gmo", "plant based"],
       [("flavor name", ["chocolate peanut butter", "cookies & cream", "birthday cake", "salted caramel", "wild berry"]),
        ("size", ["12 count (pack of 1)", "24 count (pack of 1)", "12 count (pack of 2)"])],
       (12.0, 45.0), ["snack", "variety pack"]),
    _t("green tea", "green tea", "food", f"{_FOOD} › Beverages › Coffee, Tea & Cocoa › Tea › Green Tea",
       ["caffeine free", "organic", "antioxidant rich", "non gmo", "sugar free"],
       [("flavor name", ["jasmine", "matcha", "mint", "lemon ginger", "honey"]),
        ("size", ["20 count (pack of 1)", "100 count (pack of 1)", "20 count (pack of 6)"])],
       (4.0, 30.0), ["bags", "loose leaf"]),
    _t("beef jerky", "beef jerky", "food", f"{_FOOD} › Snack Foods › Jerky & Dried Meats › Jerky",
       ["high protein", "gluten free", "low fat", "grass fed", "no preservatives"],
       [("flavor name", ["original", "teriyaki", "black pepper", "sweet & hot", "smoked"]),
        ("size", ["3.25 ounce (pack of 1)", "8 ounce (pack of 1)", "2.85 ounce (pack of 4)"])],
       (6.0, 35.0), ["sticks", "strips"]),
    _t("olive oil", "olive oil", "food", f"{_FOOD} › Pantry Staples › Cooking Oils › Olive Oil",
       ["extra virgin", "cold pressed", "organic", "non gmo", "kosher"],
       [("size", ["16.9 fl oz", "25.3 fl oz", "33.8 fl oz", "101.4 fl oz"])],
       (7.0, 45.0), ["bottle", "spray"]),
    _t("gummy candy", "gummy candy", "food", f"{_FOOD} › Candy & Chocolate › Gummy Candy",
       ["sugar free", "gluten free", "vegan", "individually wrapped", "fat free"],
       [("flavor name", ["sour", "fruit", "peach rings", "cola", "mixed berry"]),
        ("size", ["5 ounce (pack of 1)", "2 pound (pack of 1)", "5 ounce (pack of 12)"])],
       (3.0, 25.0), ["bears", "worms"]),
    _t("t-shirt", "men's t-shirts", "fashion", f"{_FASHION} › Men › Clothing › Shirts › T-Shirts",
       ["short sleeve", "machine wash", "cotton blend", "relaxed fit", "crew neck", "moisture wicking"],
       [("color", _COLORS[:10]), ("size", _CLOTHING_SIZES)],
       (8.0, 30.0), ["tee", "crewneck"]),
    _t("jeans", "women's jeans", "fashion", f"{_FASHION} › Women › Clothing › Jeans",
       ["high waist", "slim fit", "machine wash", "stretch denim", "button closure", "ankle length"],
       [("color", ["light indigo", "dark indigo", "black", "medium indigo", "white"]),
        ("size", ["2", "4", "6", "8", "10", "12", "14"])],
       (18.0, 70.0), ["skinny", "straight leg", "bootcut"]),
    _t("dress", "women's dresses", "fashion", f"{_FASHION} › Women › Clothing › Dresses › Casual",
       ["long sleeve", "short sleeve", "v neck", "machine wash", "polyester spandex", "daily wear"],
       [("color", ["black", "navy blue", "floral print", "wine red", "green stripe", "leopard"]),
        ("size", _CLOTHING_SIZES[:6])],
       (15.0, 60.0), ["maxi", "midi", "wrap"]),
    _t("running shoes", "men's running shoes", "fashion", f"{_FASHION} › Men › Shoes › Athletic › Running",
       ["non slip", "rubber sole", "lightweight", "breathable mesh", "arch support", "memory foam"],
       [("color", ["black white", "grey", "navy", "all black", "red", "blue orange"]), ("size", _SHOE_SIZES)],
       (25.0, 110.0), ["sneakers", "trainers"]),
    _t("hoodie", "hoodies", "fashion", f"{_FASHION} › Men › Clothing › Fashion Hoodies & Sweatshirts",
       ["long sleeve", "fleece lined", "machine wash", "kangaroo pocket", "drawstring closure"],
       [("color", _COLORS[:8]), ("size", _CLOTHING_SIZES)],
       (16.0, 55.0), ["sweatshirt", "pullover"]),
    _t("sandals", "women's sandals", "fashion", f"{_FASHION} › Women › Shoes › Sandals",
       ["open toe", "ankle strap", "arch support", "rubber sole", "memory foam"],
       [("color", ["black", "tan", "white", "rose gold", "brown"]), ("size", _SHOE_SIZES[:9])],
       (14.0, 60.0), ["flip flops", "slides"]),
    _t("office chair", "office chairs", "furniture", f"{_HOME} › Home Office Furniture › Home Office Chairs",
       ["lumbar support", "height adjustable", "easy assemble", "high back", "swivel", "breathable mesh"],
       [("color", ["black", "grey", "white", "blue", "pink"])],
       (60.0, 300.0), ["desk chair", "gaming chair"]),
    _t("bookshelf", "bookshelves", "furniture", f"{_HOME} › Living Room Furniture › Bookcases",
       ["easy assemble", "solid wood", "space saving", "storage space", "engineered wood"],
       [("color", ["walnut", "white", "black", "rustic brown", "natural oak"]), ("size", ["3-tier", "4-tier", "5-tier"])],
       (40.0, 220.0), ["bookcase", "shelving unit"]),
    _t("sofa", "sofas", "furniture", f"{_HOME} › Living Room Furniture › Sofas & Couches",
       ["mid century", "easy assemble", "living room", "solid wood", "high density foam", "removable cushions"],
       [("color", ["grey", "navy blue", "beige", "dark green", "charcoal"])],
       (200.0, 900.0), ["couch", "loveseat"]),
    _t("bed frame", "bed frames", "furniture", f"{_HOME} › Bedroom Furniture › Beds, Frames & Bases › Bed Frames",
       ["metal frame", "easy assemble", "under bed storage", "noise free", "no box spring needed"],
       [("size", ["twin", "full", "queen", "king"]), ("color", ["black", "white", "grey"])],
       (90.0, 450.0), ["platform bed", "headboard"]),
    _t("coffee table", "coffee tables", "furniture", f"{_HOME} › Living Room Furniture › Tables › Coffee Tables",
       ["living room", "easy assemble", "storage space", "solid wood", "tempered glass"],
       [("color", ["rustic brown", "black", "white", "walnut", "grey oak"])],
       (45.0, 260.0), ["side table", "lift top"]),
    _t("curtains", "curtains", "furniture", "Home & Kitchen › Home Décor Products › Window Treatments › Curtains & Drapes",
       ["blackout", "thermal insulated", "machine wash", "living room", "grommet top"],
       [("color", ["grey", "navy blue", "beige", "white", "sage green"]),
        ("size", ["52w x 63l", "52w x 84l", "52w x 95l", "52w x 108l"])],
       (15.0, 70.0), ["drapes", "panels"]),
    _t("headphones", "wireless headphones", "electronics", f"{_ELEC} › Headphones, Earbuds & Accessories › Headphones",
       ["noise cancelling", "bluetooth", "long battery life", "over ear", "built in microphone", "fast charging"],
       [("color", ["black", "white", "silver", "navy blue", "rose gold"])],
       (20.0, 250.0), ["earbuds", "headset"]),
    _t("phone case", "iphone case", "electronics", f"{_ELEC} › Cell Phones & Accessories › Cases, Holsters & Sleeves",
       ["shockproof", "wireless charging", "slim fit", "drop protection", "screen protector", "kickstand"],
       [("color", ["clear", "black", "blue", "pink marble", "green", "purple"]),
        ("size", ["iphone 13", "iphone 14", "iphone 14 pro", "iphone 15", "iphone 15 pro max"])],
       (6.0, 35.0), ["cover", "wallet"]),
    _t("usb cable", "usb c cable", "electronics", f"{_ELEC} › Computers & Accessories › Cables & Accessories › Cables",
       ["fast charging", "braided nylon", "high speed", "data transfer", "durable"],
       [("size", ["3 ft", "6 ft", "10 ft", "3 ft (3-pack)", "6 ft (2-pack)"]), ("color", ["black", "white", "grey"])],
       (5.0, 25.0), ["charger cable", "cord"]),
    _t("bluetooth speaker", "bluetooth speaker", "electronics", f"{_ELEC} › Portable Audio & Video › Portable Speakers & Docks",
       ["waterproof", "long battery life", "stereo sound", "easy use", "built in microphone"],
       [("color", ["black", "blue", "red", "grey", "teal"])],
       (18.0, 160.0), ["portable speaker", "party speaker"]),
    _t("hdmi cable", "hdmi cable", "electronics", f"{_ELEC} › Television & Video › Accessories › Cables › HDMI Cables",
       ["high speed", "4k", "gold plated", "braided", "ethernet"],
       [("size", ["3 ft", "6 ft", "10 ft", "15 ft", "25 ft"])],
       (5.0, 30.0), ["cord", "adapter"]),
    _t("smart watch", "smart watch", "electronics", f"{_ELEC} › Wearable Technology › Smartwatches",
       ["heart rate", "sleep monitor", "waterproof", "long battery life", "fitness tracker", "blood oxygen"],
       [("color", ["black", "silver", "rose gold", "navy blue", "pink"])],
       (25.0, 200.0), ["fitness watch", "band"]),
)  # fmt: skip

_BRANDS = {
    "beauty": ("Lumora", "Petal & Pine", "Verdant Skin", "Aurelle", "Mossgrove", "Solene", "Kindra", "Bloomwell"),
    "food": ("Harvest Lane", "Old Mill", "Sunny Acre", "Bramble Co.", "Northfield Farms", "Copper Kettle", "Tidewater"),
    "fashion": ("Urban Thread", "Coastline", "Ridgeway", "Marlowe", "Fieldhouse", "Kestrel", "Amberly", "Stride Lab"),
    "furniture": ("Oakhaven", "Nordlund", "Casa Verde", "Timberline", "Loft & Co.", "Hearthstone", "Willowby"),
    "electronics": ("Voltix", "Sonara", "Nexwave", "Arcline", "Pulsetech", "Cobalt Audio", "Zentro"),
}  # fmt: skip
_TITLE_ADJ = ("Premium", "Classic", "Everyday", "Deluxe", "Essential", "Signature", "Pro", "Ultra", "Original", "Modern")
_INSTRUCTION_TEMPLATES = (
    "i need {a} {noun}",
    "i am looking for {a} {noun}",
    "i want to buy {a} {noun}",
    "find me {a} {noun}",
    "i'm looking for {a} {noun}",
    "i would like {a} {noun}",
    "i need a {noun} that is {attrs}",
    "i am looking for a {noun} that is {attrs}",
    "i want a {noun} which is {attrs}",
)  # fmt: skip
_REVIEW_TITLES = ((5, "Love it"), (5, "Exactly as described"), (4, "Great value"), (4, "Works well"),
                  (3, "It's okay"), (2, "Not what I expected"), (1, "Disappointed"))  # fmt: skip
_REVIEW_BODIES = {
    5: "I have bought this {noun} twice now and it is perfect. Highly recommend.",
    4: "Good {noun} for the price. Shipping was fast and it does what it says.",
    3: "The {noun} is fine but nothing special. Might try another brand next time.",
    2: "The {noun} arrived on time but the quality was lower than I hoped.",
    1: "This {noun} did not work for me at all. I returned it.",
}  # fmt: skip


def _article(phrase: str) -> str:
    return "an" if phrase[:1] in "aeiou" else "a"


def _join(words: list[str]) -> str:
    return words[0] if len(words) == 1 else ", ".join(words[:-1]) + " and " + words[-1]


def _asin(rng: random.Random, used: set[str]) -> str:
    alphabet = "ABCDEFGHJKLMNPQRSTUVWXYZ0123456789"
    while True:
        asin = "B0" + "".join(rng.choice(alphabet) for _ in range(8))
        if asin not in used:
            used.add(asin)
            return asin


def _price_text(rng: random.Random, low: float, high: float) -> str:
    price = round(rng.uniform(low, high), 0) - 0.01
    price = max(price, 1.99)
    if rng.random() < 0.15:
        top = round(price * rng.uniform(1.1, 1.6), 0) - 0.01
        return f"${price:.2f} - ${top:.2f}"
    return f"${price:.2f}"


def _product(rng: random.Random, ptype: ProductType, asin: str) -> tuple[dict[str, Any], dict[str, Any]]:
    brand = rng.choice(_BRANDS[ptype.category])
    n_attrs = rng.randint(2, min(4, len(ptype.attributes)))
    attrs = rng.sample(ptype.attributes, n_attrs)
    extra = rng.choice(ptype.extras) if ptype.extras and rng.random() < 0.5 else ""
    options: dict[str, list[dict[str, Any]]] = {}
    if rng.random() > 0.08:
        for name, values in ptype.options:
            k = rng.randint(min(2, len(values)), min(5, len(values)))
            picked = sorted(rng.sample(range(len(values)), k))
            options[name] = [{"value": values[i], "image": None} for i in picked]
    first_value = {name: vals[0]["value"] for name, vals in options.items()}
    noun_phrase = f"{ptype.noun} {extra}".strip()
    title_bits = [brand, rng.choice(_TITLE_ADJ), attrs[0].title(), noun_phrase.title()]
    detail = ", ".join(a.title() for a in attrs[1:3])
    title = " ".join(title_bits) + (f", {detail}" if detail else "")
    if "size" in first_value and rng.random() < 0.5:
        title += f" - {first_value['size'].title()}"
    description = (
        f"The {brand} {noun_phrase} is made for {_join(attrs[:2])} use. "
        f"Every {ptype.noun} is checked by hand before it ships. "
        + " ".join(f"{a.capitalize()}: designed with care." for a in attrs[2:])
    ).strip()
    bullets = [f"{a.upper()} - our {ptype.noun} is {a} so you can rely on it every day." for a in attrs]
    bullets.append(f"WHAT YOU GET - one {noun_phrase} from {brand} with a 30-day guarantee.")
    if rng.random() < 0.3:
        bullets.append("EASY RETURNS - contact us any time.")
    n_goal = rng.randint(1, min(3, n_attrs))
    goal_attrs = rng.sample(attrs, n_goal)
    template = rng.choice(_INSTRUCTION_TEMPLATES)
    phrase = " ".join(goal_attrs)
    instruction = template.format(
        a=f"{_article(phrase)} {phrase}" if "{attrs}" not in template else "",
        noun=ptype.noun,
        attrs=_join(goal_attrs),
    )
    raw = {
        "asin": asin,
        "name": title,
        "category": ptype.category,
        "query": ptype.query,
        "product_category": ptype.path,
        "full_description": description,
        "small_description": bullets,
        "pricing": _price_text(rng, *ptype.price),
        "customization_options": options,
        "images": [f"https://example.invalid/images/{asin}.jpg"],
        "product_information": {"Manufacturer": brand},
    }
    ins = {"attributes": list(attrs), "instruction": instruction, "instruction_attributes": goal_attrs}
    if rng.random() < 0.05:
        ins["instruction"] = None  # like upstream: some products carry no instruction
    return raw, ins


def generate_catalog(
    n_products: int = DEFAULT_N_PRODUCTS, seed: int = DEFAULT_SEED
) -> dict[str, Any]:
    """The three files' contents (see the module docstring) for ``n_products`` products."""
    if isinstance(n_products, bool) or not isinstance(n_products, int) or n_products < 1:
        raise ValueError(f"n_products must be a positive int, got {n_products!r}")
    rng = random.Random(f"bpo-webshop-catalog/{GENERATOR_VERSION}/{seed}")
    used: set[str] = set()
    products, ins, reviews = [], {}, []
    for i in range(n_products):
        ptype = PRODUCT_TYPES[i % len(PRODUCT_TYPES)] if i < len(PRODUCT_TYPES) else rng.choice(PRODUCT_TYPES)
        asin = _asin(rng, used)
        raw, attrs = _product(rng, ptype, asin)
        products.append(raw)
        ins[asin] = attrs
        if rng.random() < 0.6:
            picked = [rng.choice(_REVIEW_TITLES) for _ in range(rng.randint(1, 3))]
            reviews.append({
                "asin": asin,
                "reviews": [
                    {"title": title, "stars": stars, "review": _REVIEW_BODIES[stars].format(noun=ptype.noun)}
                    for stars, title in picked
                ],
                "average_rating": round(sum(s for s, _ in picked) / len(picked), 1),
            })  # fmt: skip
    rng.shuffle(products)  # items_shuffle: upstream ships its products shuffled
    return {"items_shuffle.json": products, "items_ins_v2.json": ins, "reviews.json": reviews}


def default_cache_dir() -> Path:
    """``$BPO_WEBSHOP_CACHE``, else ``$XDG_CACHE_HOME/bpo_gym/webshop``, else ``~/.cache/...``."""
    env = os.environ.get("BPO_WEBSHOP_CACHE")
    if env:
        return Path(env)
    return user_cache_dir("webshop")


def write_catalog(directory: str | os.PathLike, n_products: int = DEFAULT_N_PRODUCTS, seed: int = DEFAULT_SEED) -> Path:
    """Write the generated files into ``directory`` (atomically per file); return it."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    for name, content in generate_catalog(n_products, seed).items():
        fd, tmp = tempfile.mkstemp(dir=directory, prefix=f".{name}.", suffix=".tmp")
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            json.dump(content, f, ensure_ascii=False)
        os.replace(tmp, directory / name)
    return directory


def bundled_data_dir(n_products: int = DEFAULT_N_PRODUCTS, seed: int = DEFAULT_SEED) -> Path:
    """The bundled catalog's folder, generated into the cache on first use."""
    name = f"catalog-v{GENERATOR_VERSION}-n{n_products}-s{seed}"
    directory = default_cache_dir() / name
    if all((directory / f).is_file() for f in ("items_shuffle.json", "items_ins_v2.json", "reviews.json")):
        return directory
    try:
        return write_catalog(directory, n_products, seed)
    except OSError:  # a read-only home: fall back to the temp folder
        return write_catalog(Path(tempfile.gettempdir()) / f"bpo_gym_webshop_{os.getuid()}" / name, n_products, seed)
