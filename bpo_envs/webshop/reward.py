"""The WebShop purchase reward, written to upstream ``web_agent_site/engine/goal.py::get_reward``.

``score = r_type * (n_attr + n_option + [price <= price_upper]) / (|attributes| + |options| + 1)``

* attributes: a goal attribute counts when its fuzzy token-set ratio with one of the product's
  ``Attributes`` is > 85, else when it is a substring of the lower-cased title, bullet points
  or description;
* options: a goal option counts when some purchased option value has a token-set ratio > 85
  with it, both passed through :func:`normalize_color` first;
* price: 1 when the price (a range product's drawn price) is at most ``price_upper``;
* type factor ``r_type``: 1, or 0.5 when neither the query, nor >= 2 levels of the category
  path, nor > 20% of the goal title's nouns match; 0.1 when under 10% of the title nouns
  match; 0 when none do.

Fuzzy matching reproduces ``thefuzz.fuzz.token_set_ratio`` (the scorer upstream calls) with
rapidfuzz: the inputs are ``str()``-ed, stripped of the characters 128-255 (thefuzz's
``force_ascii``), lower-cased with non-alphanumerics turned to spaces, scored, and rounded to
an int before the ``> 85`` test.

One upstream quirk is kept on purpose so that scores carry over: for synthetic goals (whose
``goal_options`` is a dict) upstream iterates ``goal_options.items()``, so each goal option is
the pair ``(name, value)``. ``normalize_color`` of a pair returns a colour only when the name
or value *equals* one, and the fuzzy scorer sees the pair's ``str()``, i.e. the option name's
tokens are part of the goal side. Human goals (a list of values) compare plain values.

Title nouns: upstream tags the titles with spaCy (``en_core_web_sm``) and keeps NOUN/PROPN
tokens. When spaCy and that model are installed (``noun_parser="spacy"``, the default when
available) the same is done here; otherwise a documented heuristic (:func:`heuristic_nouns`)
keeps every word of the title that is not a stop word, a number or unit, a known adjective or
a word with an adjective suffix. Product titles are mostly noun phrases, so the two agree on
most titles; where they differ only the ``title_score`` thresholds of ``r_type`` can change
(never for a purchase of the goal product itself, whose nouns match its own).
"""

from __future__ import annotations

import importlib.util
import os
import re
from collections.abc import Iterable, Mapping, Sequence
from functools import lru_cache
from typing import Any

from rapidfuzz import fuzz
from rapidfuzz.utils import default_process

COLOR_SET: tuple[str, ...] = (
    "alabaster", "apricot", "aqua", "ash", "asphalt", "azure", "banana", "beige", "black",
    "blue", "blush", "bordeaux", "bronze", "brown", "burgundy", "camel", "camo", "caramel",
    "champagne", "charcoal", "cheetah", "chestnut", "chocolate", "christmas", "coffee",
    "cognac", "copper", "coral", "cranberry", "cream", "crystal", "dark", "denim", "eggplant",
    "elephant", "espresso", "fuchsia", "gold", "granite", "grape", "graphite", "grass", "gray",
    "green", "grey", "heather", "indigo", "ivory", "ivy", "khaki", "lavender", "lemon",
    "leopard", "light", "lilac", "lime", "magenta", "maroon", "mauve", "merlot", "midnight",
    "mint", "mocha", "multicolor", "mushroom", "mustard", "natural", "navy", "nude", "olive",
    "orange", "peach", "pewter", "pink", "plum", "purple", "rainbow", "red", "rose", "royal",
    "rust", "sand", "sapphire", "seashell", "silver", "skull", "slate", "steel", "stone",
    "stonewash", "sunflower", "tan", "taupe", "teal", "tiger", "turquoise", "violet", "walnut",
    "wheat", "white", "wine", "yellow",
)  # fmt: skip
"""Upstream's colour list, in its order (the first one found wins)."""

FUZZY_THRESHOLD = 85
_LATIN1_HIGH = dict.fromkeys(range(128, 256))


def normalize_color(value: Any) -> Any:
    """The first colour of :data:`COLOR_SET` found in ``value`` (``in``: substring for a str,
    membership for a tuple), else ``value`` unchanged."""
    for color in COLOR_SET:
        if color in value:
            return color
    return value


def _fuzz_process(value: Any) -> str:
    return default_process(str(value).translate(_LATIN1_HIGH))


def token_set_ratio(a: Any, b: Any) -> int:
    """``thefuzz.fuzz.token_set_ratio(a, b)``: an int in [0, 100]."""
    return int(round(fuzz.token_set_ratio(_fuzz_process(a), _fuzz_process(b))))


# ---- title nouns ---------------------------------------------------------------------------

_STOP = frozenset(
    """a about above after against all an and any are as at be been being below between both
    but by can could did do does doing down during each few for from further had has have
    having he her here hers herself him himself his how i if in into is it its itself just me
    more most my myself no nor not now of off on once only or other our ours out over own same
    she should so some such than that the their them then there these they this those through
    to too under until up very was we were what when where which while who whom why will with
    within without would you your yours plus per via vs amp""".split()
)
_ADJECTIVES = frozenset(
    """new best great good high low long short big small large mini extra super ultra soft hard
    light heavy dark bright deep pure fresh free natural organic original premium professional
    classic modern vintage simple easy quick fast slow hot cold warm cool dry wet thin thick
    wide narrow full half double single multi top old little clear strong gentle smooth rich
    sweet sour spicy mild real true whole various assorted cute pretty beautiful elegant casual
    formal sexy comfy cozy durable portable adjustable waterproof wireless lightweight sturdy
    compact safe healthy delicious vegan kosher unscented fragrance-free sugar-free gluten-free
    non-gmo non-slip anti-slip stainless black white red blue green yellow pink purple orange
    brown grey gray silver golden gold beige navy ivory khaki teal maroon cream tan multicolor
    men's women's kids' baby's unisex mens womens""".split()
)
_ADJ_SUFFIXES = ("ly", "ous", "ful", "ive", "able", "ible", "less", "ish")
_WORD = re.compile(r"[a-z][a-z'\-]*[a-z']|[a-z]")
_UNIT = re.compile(r"^\d|^(?:oz|fl|lb|lbs|ml|mm|cm|kg|mg|ft|pcs|pc|pk|ct|in|inch|x)$")


def heuristic_nouns(title: str) -> list[str]:
    """Nouns of a product title without a tagger (see the module docstring).

    Lower-cased words of two letters or more, minus stop words, numbers and units, a lexicon of
    common product adjectives and colours, and words ending in an adjective suffix (-ly, -ous,
    -ful, -ive, -able, -ible, -less, -ish). Possessive ``'s`` is split off as spaCy does.
    """
    out = []
    for word in _WORD.findall(title.lower()):
        if word.endswith("'s"):
            word = word[:-2]
        word = word.strip("'-")
        if len(word) < 2 or word in _STOP or word in _ADJECTIVES or _UNIT.match(word):
            continue
        if word.endswith(_ADJ_SUFFIXES) and len(word) > 5:
            continue
        out.append(word)
    return out


def spacy_model_name() -> str:
    """The spaCy pipeline package to tag titles with: ``$BPO_WEBSHOP_SPACY_MODEL``, default
    ``en_core_web_sm`` (upstream's; a differently named copy of it can be named here)."""
    return os.environ.get("BPO_WEBSHOP_SPACY_MODEL") or "en_core_web_sm"


def spacy_available() -> bool:
    """Whether spaCy and its tagger (:func:`spacy_model_name`) can be imported."""
    return (
        importlib.util.find_spec("spacy") is not None
        and importlib.util.find_spec(spacy_model_name()) is not None
    )


@lru_cache(maxsize=4)
def _load_spacy(name: str) -> Any:
    import spacy

    return spacy.load(name)


def _spacy_model() -> Any:
    return _load_spacy(spacy_model_name())


def _spacy_nouns(title: str) -> list[str]:
    return [t.text.lower() for t in _spacy_model()(title) if t.pos_ in ("PNOUN", "NOUN", "PROPN")]


def resolve_noun_parser(name: str) -> str:
    """``"auto"`` -> ``"spacy"`` when available, else ``"heuristic"``; validates the name."""
    if name == "auto":
        return "spacy" if spacy_available() else "heuristic"
    if name == "spacy":
        if not spacy_available():
            raise ImportError(
                "noun_parser='spacy' needs spaCy and its en_core_web_sm model: "
                "pip install spacy && python -m spacy download en_core_web_sm"
            )
        return name
    if name == "heuristic":
        return name
    raise ValueError(f"noun_parser must be 'auto', 'spacy' or 'heuristic', got {name!r}")


@lru_cache(maxsize=65536)
def title_nouns(title: str, parser: str = "heuristic") -> tuple[str, ...]:
    """The nouns of ``title`` by ``parser`` (``"spacy"`` or ``"heuristic"``), cached."""
    if parser == "spacy":
        return tuple(_spacy_nouns(title))
    return tuple(heuristic_nouns(title))


# ---- the reward terms ----------------------------------------------------------------------


def type_reward(product: Mapping[str, Any], goal: Mapping[str, Any], parser: str = "heuristic") -> dict[str, Any]:
    """``r_type`` and its parts (query match, category match, title noun score)."""
    query_match = product["query"] == goal["query"]
    bought_cat = {x.strip() for x in product["product_category"].split("›")}
    goal_cat = {x.strip() for x in goal["product_category"].split("›")}
    category_match = len(bought_cat & goal_cat) >= 2
    bought_nouns = set(title_nouns(product["name"], parser))
    desired = title_nouns(goal["name"], parser)
    if not desired:
        title_score = 0.2
    else:
        title_score = len(bought_nouns & set(desired)) / len(desired)
    r_type = 1.0
    if not (query_match or category_match or title_score > 0.2):
        r_type = 0.5
    if title_score < 0.1:
        r_type = 0.1
    if title_score == 0.0:
        r_type = 0.0
    return {
        "r_type": r_type,
        "query_match": query_match,
        "category_match": category_match,
        "title_score": title_score,
    }


def attribute_matches(product: Mapping[str, Any], goal_attributes: Sequence[str]) -> int:
    """How many goal attributes the product has (fuzzy in Attributes, else in its text)."""
    title = product["Title"].lower()
    bullets = " ".join(product["BulletPoints"]).lower()
    description = product["Description"].lower()
    matches = 0
    for g_attr in goal_attributes:
        if any(token_set_ratio(p_attr, g_attr) > FUZZY_THRESHOLD for p_attr in product["Attributes"]):
            matches += 1
        elif g_attr in title or g_attr in bullets or g_attr in description:
            matches += 1
    return matches


def option_matches(purchased_options: Iterable[str], goal_options: Iterable[Any]) -> int:
    """How many goal options some purchased option matches (colour-normalised, fuzzy > 85)."""
    purchased = [normalize_color(o) for o in purchased_options]
    matches = 0
    for g_option in (normalize_color(o) for o in goal_options):
        if any(token_set_ratio(p, g_option) > FUZZY_THRESHOLD for p in purchased):
            matches += 1
    return matches


def get_reward(
    product: Mapping[str, Any],
    goal: Mapping[str, Any],
    price: float,
    options: Mapping[str, str],
    parser: str = "heuristic",
) -> tuple[float, dict[str, Any]]:
    """The score of buying ``product`` at ``price`` with ``options`` for ``goal``, and its parts.

    ``product`` needs ``query``, ``product_category``, ``name``, ``Title``, ``BulletPoints``,
    ``Description``, ``Attributes``; ``goal`` needs ``query``, ``product_category``, ``name``,
    ``attributes``, ``goal_options`` (a dict for synthetic goals, a list for human goals) and
    ``price_upper``. The details dict has upstream's verbose keys (``r_type``, ``r_att``,
    ``w_att``, ``query_match``, ``category_match``, ``title_score``, ``r_option``,
    ``w_option``, ``r_price``, ``w_price``).
    """
    type_info = type_reward(product, goal, parser)
    goal_attrs = goal["attributes"]
    goal_options = goal["goal_options"]
    r_price = price <= goal["price_upper"] if goal["price_upper"] > 0 else None
    n_attr = attribute_matches(product, goal_attrs)
    g_opts = list(goal_options.items()) if isinstance(goal_options, Mapping) else list(goal_options)
    n_opt = option_matches(options.values(), g_opts)
    denom = len(goal_attrs) + len(goal_options) + 1
    total = (n_attr + n_opt + bool(r_price)) / denom * type_info["r_type"]
    info: dict[str, Any] = {
        "r_type": type_info["r_type"],
        "r_att": n_attr / len(goal_attrs) if goal_attrs else 0.0,
        "w_att": len(goal_attrs) / denom,
        "query_match": type_info["query_match"],
        "category_match": type_info["category_match"],
        "title_score": type_info["title_score"],
    }
    if g_opts:
        info["r_option"] = n_opt / len(g_opts)
        info["w_option"] = len(goal_options) / denom
    if r_price is not None:
        info["r_price"] = bool(r_price)
        info["w_price"] = 1 / denom
    return total, info

