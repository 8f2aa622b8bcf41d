"""Loading WebShop data in the upstream schema, goals, splits, and the per-process shared store.

Files read from a data folder (upstream names; the ``_1000`` ones are preferred together):

* ``items_shuffle_1000.json`` or ``items_shuffle.json`` (required): a JSON list of raw product
  records with ``asin``, ``name``, ``category``, ``query``, ``product_category``,
  ``full_description``, ``small_description`` (str or list), ``customization_options``
  (``{name: [{"value", "image"}]}``, ``{}`` or ``null``) and optional ``pricing``
  (``"$12.99"`` or ``"$10.99 - $15.99"``).
* ``items_ins_v2_1000.json`` or ``items_ins_v2.json`` (required): ``{asin: {"attributes",
  "instruction", "instruction_attributes"}}``.
* ``items_human_ins.json`` (optional): ``{asin: [{"instruction", "instruction_attributes",
  "instruction_options"}]}``.
* ``reviews.json`` (optional): ``[{"asin", "reviews": [{"title", "stars"|"score",
  "review"|"body"}], "average_rating"}]``.

Products are cleaned as upstream's ``load_products`` does (ASINs ``"nan"`` or longer than 10
characters and duplicates skipped; option names and values lower-cased, ``/`` -> `` | ``;
``Attributes`` from the attribute file, else ``["DUMMY_ATTR"]``).

Goals as upstream's ``get_goals``: synthetic goals are one per option combination of every
product that has an instruction (``price_upper`` drawn once per product), human goals one per
annotated instruction with attributes. Upstream draws prices and ``price_upper`` from the
unseeded global ``random``; here they come from ``random.Random(goal_seed)`` (default 233, the
seed upstream shuffles the goals with) so that a goal index means the same goal in every
process. The goals are then shuffled with ``random.Random(233)`` as upstream.

Splits (goal indices): as upstream (test 0-499, eval 500-1499, train 1500+) when there are at
least 2000 goals; otherwise proportionally (first 10% test, next 20% eval, the rest train).
"""

from __future__ import annotations

import json
import math
import os
import random
import re
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from decimal import Decimal, InvalidOperation
from functools import lru_cache
from pathlib import Path
from typing import Any

from bpo_envs.webshop.search import SearchIndex

PRODUCT_FILES = ("items_shuffle_1000.json", "items_shuffle.json")
ATTRIBUTE_FILES = ("items_ins_v2_1000.json", "items_ins_v2.json")
HUMAN_FILE = "items_human_ins.json"
REVIEW_FILE = "reviews.json"
PRICE_RANGE = tuple(10.0 * i for i in range(1, 100))
SHUFFLE_SEED = 233
SPLITS = ("train", "eval", "test")
_REQUIRED_KEYS = (
    "asin", "name", "category", "query", "product_category", "full_description",
    "small_description", "customization_options",
)  # fmt: skip


class WebShopDataError(ValueError):
    """A WebShop data file is malformed; the message names the file and the record."""


def _read_json(path: Path) -> Any:
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except json.JSONDecodeError as exc:
        raise WebShopDataError(f"{path}: not valid JSON ({exc})") from exc
    except UnicodeDecodeError as exc:
        raise WebShopDataError(f"{path}: not UTF-8 text ({exc})") from exc


def find_data_files(data_dir: str | os.PathLike) -> dict[str, Path | None]:
    """The data files of ``data_dir`` (``product``, ``attribute``, ``human``, ``review``)."""
    root = Path(data_dir)
    if not root.is_dir():
        raise FileNotFoundError(f"WebShop data_dir {str(root)!r} is not a folder")
    product = next((root / n for n in PRODUCT_FILES if (root / n).is_file()), None)
    if product is None:
        raise FileNotFoundError(
            f"WebShop data_dir {str(root)!r} has no product file: expected "
            f"{' or '.join(PRODUCT_FILES)} (the upstream WebShop data files)"
        )
    order = ATTRIBUTE_FILES if product.name == PRODUCT_FILES[0] else ATTRIBUTE_FILES[::-1]
    attribute = next((root / n for n in order if (root / n).is_file()), None)
    if attribute is None:
        raise FileNotFoundError(
            f"WebShop data_dir {str(root)!r} has no attribute file: expected "
            f"{' or '.join(order)} next to {product.name}"
        )
    human = root / HUMAN_FILE
    review = root / REVIEW_FILE
    return {
        "product": product,
        "attribute": attribute,
        "human": human if human.is_file() else None,
        "review": review if review.is_file() else None,
    }


def _parse_pricing(pricing: Any, where: str) -> tuple[list[float], str]:
    if not pricing:
        return [100.0], "$100.0"
    if not isinstance(pricing, str):
        raise WebShopDataError(f"{where}: 'pricing' must be a string like '$12.99', got {pricing!r}")
    try:
        values = [float(Decimal(re.sub(r"[^\d.]", "", p))) for p in pricing.split("$")[1:]]
    except InvalidOperation as exc:
        raise WebShopDataError(f"{where}: cannot read the price {pricing!r}") from exc
    if not values:
        raise WebShopDataError(f"{where}: cannot read the price {pricing!r} (no '$' amount)")
    if len(values) == 1:
        return values, f"${values[0]}"
    return values[:2], f"${values[0]} to ${values[1]}"


def _parse_options(raw: Any, where: str) -> dict[str, list[str]]:
    if not raw:
        return {}
    if not isinstance(raw, Mapping):
        raise WebShopDataError(f"{where}: 'customization_options' must be an object, got {type(raw).__name__}")
    options: dict[str, list[str]] = {}
    for name, contents in raw.items():
        if contents is None:
            continue
        if not isinstance(contents, list) or not all(isinstance(c, Mapping) and isinstance(c.get("value"), str) for c in contents):
            raise WebShopDataError(
                f"{where}: option {name!r} must be a list of {{'value': str, 'image': ...}} records"
            )
        options[name.lower()] = [c["value"].strip().replace("/", " | ").lower() for c in contents]
    return options


def _product(raw: Any, index: int, path: Path, attributes: Mapping[str, Any]) -> dict[str, Any] | None:
    if not isinstance(raw, Mapping):
        raise WebShopDataError(f"{path}: record #{index} is a {type(raw).__name__}, not a product object")
    where = f"{path}: product #{index} (asin {raw.get('asin')!r})"
    missing = [k for k in _REQUIRED_KEYS if k not in raw]
    if missing:
        raise WebShopDataError(f"{where} lacks the key(s) {missing}")
    asin = raw["asin"]
    if not isinstance(asin, str):
        raise WebShopDataError(f"{where}: 'asin' must be a string")
    if asin == "nan" or len(asin) > 10:
        return None
    for key in ("name", "category", "query", "product_category"):
        if not isinstance(raw[key], str):
            raise WebShopDataError(f"{where}: {key!r} must be a string, got {raw[key]!r:.60}")
    small = raw["small_description"]
    bullets = small if isinstance(small, list) else [small]
    bullets = ["" if b is None else str(b) for b in bullets]
    pricing, price_tag = _parse_pricing(raw.get("pricing"), where)
    attrs = attributes.get(asin)
    if attrs is not None and not isinstance(attrs, Mapping):
        raise WebShopDataError(f"attribute record of {asin!r} must be an object, got {type(attrs).__name__}")
    product_attrs = list(attrs["attributes"]) if attrs and "attributes" in attrs else ["DUMMY_ATTR"]
    return {
        "asin": asin,
        "name": raw["name"],
        "Title": raw["name"],
        "category": raw["category"],
        "query": raw["query"].lower().strip(),
        "product_category": raw["product_category"],
        "Description": raw["full_description"] or "",
        "BulletPoints": bullets,
        "pricing": pricing,
        "Price": price_tag,
        "options": _parse_options(raw["customization_options"], where),
        "Attributes": product_attrs,
        "instruction_text": attrs.get("instruction") if attrs else None,
        "instruction_attributes": attrs.get("instruction_attributes") if attrs else None,
        "Reviews": [],
        "Rating": "N.A.",
    }


def _attach_reviews(products: list[dict[str, Any]], reviews: Any, path: Path) -> None:
    if not isinstance(reviews, list):
        raise WebShopDataError(f"{path}: expected a JSON list of review records")
    by_asin = {p["asin"]: p for p in products}
    for i, record in enumerate(reviews):
        if not isinstance(record, Mapping) or "asin" not in record:
            raise WebShopDataError(f"{path}: review record #{i} is not an object with an 'asin'")
        product = by_asin.get(record["asin"])
        if product is None:
            continue
        items = []
        for r in record.get("reviews") or []:
            items.append({
                "title": str(r.get("title", "")),
                "score": r.get("score", r.get("stars", 0)),
                "body": str(r.get("body", r.get("review", ""))),
            })  # fmt: skip
        product["Reviews"] = items
        product["Rating"] = record.get("average_rating", "N.A.")


def _attach_human(products: list[dict[str, Any]], human: Any, path: Path) -> None:
    if not isinstance(human, Mapping):
        raise WebShopDataError(f"{path}: expected a JSON object {{asin: [instructions]}}")
    for product in products:
        entries = human.get(product["asin"])
        if entries is None:
            continue
        if not isinstance(entries, list):
            raise WebShopDataError(f"{path}: the entry of {product['asin']!r} must be a list")
        for j, e in enumerate(entries):
            if not isinstance(e, Mapping) or not {"instruction", "instruction_attributes", "instruction_options"} <= set(e):
                raise WebShopDataError(
                    f"{path}: instruction #{j} of {product['asin']!r} needs 'instruction', "
                    "'instruction_attributes' and 'instruction_options'"
                )
        product["instructions"] = entries


def load_products(
    files: Mapping[str, Path | None], num_products: int | None = None, human: bool = False
) -> list[dict[str, Any]]:
    """Clean product records from the files found by :func:`find_data_files`."""
    raw = _read_json(files["product"])
    if not isinstance(raw, list):
        raise WebShopDataError(f"{files['product']}: expected a JSON list of product records")
    attributes = _read_json(files["attribute"])
    if not isinstance(attributes, Mapping):
        raise WebShopDataError(f"{files['attribute']}: expected a JSON object {{asin: attributes}}")
    if num_products is not None:
        raw = raw[:num_products]
    products, seen = [], set()
    for i, record in enumerate(raw):
        product = _product(record, i, files["product"], attributes)
        if product is None or product["asin"] in seen:
            continue
        seen.add(product["asin"])
        products.append(product)
    if not products:
        raise WebShopDataError(f"{files['product']}: no usable product records")
    if files.get("review") is not None:
        _attach_reviews(products, _read_json(files["review"]), files["review"])
    if human and files.get("human") is not None:
        _attach_human(products, _read_json(files["human"]), files["human"])
    return products


def _price_upper(rng: random.Random, price: float) -> tuple[float, str]:
    price_range = [p for p in PRICE_RANGE if p > price][:4]
    if len(price_range) >= 2:
        _, upper = sorted(rng.sample(price_range, 2))
        return upper, f", and price lower than {upper:.2f} dollars"
    return 1000000, ""


@dataclass(frozen=True)
class GoalRef:
    """A goal, compactly: ``kind`` ``"s"`` (synthetic: ``which`` = option combination index)
    or ``"h"`` (human: ``which`` = instruction index)."""

    product: int
    kind: str
    which: int
    price_upper: float
    price_text: str


@dataclass
class Catalog:
    """Everything shared by the env instances of one data configuration in a process."""

    key: tuple[Any, ...]
    products: list[dict[str, Any]]
    prices: list[float]
    goals: list[GoalRef]
    goal_mode: str
    index: SearchIndex
    asin_to_index: dict[str, int] = field(default_factory=dict)
    files: dict[str, Path | None] = field(default_factory=dict)
    bundled: bool = False
    page_cache: dict[Any, Any] = field(default_factory=dict, compare=False, repr=False)
    """Rendered pages of the envs on this catalog (see ``WebShopEnv._view``)."""
    reward_cache: dict[Any, Any] = field(default_factory=dict, compare=False, repr=False)
    """Purchase rewards of the envs on this catalog (see ``WebShopEnv._purchase_reward``)."""

    def __post_init__(self) -> None:
        self.asin_to_index = {p["asin"].lower(): i for i, p in enumerate(self.products)}
        self.goal = lru_cache(maxsize=4096)(self._goal)

    def _goal(self, i: int) -> dict[str, Any]:
        ref = self.goals[i]
        product = self.products[ref.product]
        goal = {
            "asin": product["asin"],
            "category": product["category"],
            "query": product["query"],
            "name": product["name"],
            "product_category": product["product_category"],
            "price_upper": ref.price_upper,
        }
        if ref.kind == "s":
            names = sorted(product["options"])
            combo = _combination(product["options"], names, ref.which)
            goal_options = dict(zip(names, combo, strict=True))
            option_text = ", and ".join(f"{k}: {v}" for k, v in goal_options.items())
            option_text = f" with {option_text}" if option_text else ""
            goal["instruction_text"] = f"{product['instruction_text']}{option_text}{ref.price_text}"
            goal["attributes"] = list(product["instruction_attributes"])
            goal["goal_options"] = goal_options
        else:
            entry = product["instructions"][ref.which]
            goal["instruction_text"] = entry["instruction"].strip(".") + ref.price_text
            goal["attributes"] = list(entry["instruction_attributes"])
            goal["goal_options"] = list(entry["instruction_options"])
        return goal

    def provenance(self) -> dict[str, Any]:
        """The data source: the bundled generator (name, version) or the data folder, and a
        SHA-256 of the files read either way (:func:`bpo_envs.provenance.hash_files`)."""
        from bpo_envs.provenance import hash_files

        read = [p for p in self.files.values() if p is not None]
        out: dict[str, Any] = {}
        if self.bundled:
            from bpo_envs.webshop.generator import GENERATOR_VERSION

            out.update(data_source="bundled-generator", generator="bpo_envs.webshop.generator",
                       generator_version=GENERATOR_VERSION)  # fmt: skip
        else:
            out["data_source"] = "data_dir"
        out.update(
            data_dir=str(read[0].parent) if read else None,
            files=sorted(p.name for p in read),
            files_sha256=hash_files(read) if read else None,
            goals=self.goal_mode,
            goal_count=len(self.goals),
            product_count=len(self.products),
        )
        return out

    def split(self, name: str | None) -> range:
        """Goal indices of split ``name`` (``None``/``"all"`` for every goal)."""
        n = len(self.goals)
        if name in (None, "all"):
            return range(n)
        if name not in SPLITS:
            raise ValueError(f"split must be one of {SPLITS} or 'all', got {name!r}")
        if n >= 2000:
            bounds = {"test": (0, 500), "eval": (500, 1500), "train": (1500, n)}
        else:
            a, b = math.ceil(n * 0.1), math.ceil(n * 0.3)
            bounds = {"test": (0, a), "eval": (a, b), "train": (b, n)}
        return range(*bounds[name])


def _combination(options: Mapping[str, Sequence[str]], names: Sequence[str], index: int) -> tuple[str, ...]:
    # mixed-radix decoding in itertools.product order (the last name varies fastest)
    out = []
    for name in reversed(names):
        values = options[name]
        index, r = divmod(index, len(values))
        out.append(values[r])
    return tuple(reversed(out))


def _n_combinations(options: Mapping[str, Sequence[str]]) -> int:
    return math.prod(len(v) for v in options.values())


def build_goals(
    products: list[dict[str, Any]], prices: list[float], mode: str, rng: random.Random
) -> list[GoalRef]:
    """Goals in upstream order (before the shuffle); ``mode`` is ``"synthetic"`` or ``"human"``."""
    goals: list[GoalRef] = []
    for i, product in enumerate(products):
        if mode == "synthetic":
            if product.get("instruction_text") is None or not product.get("instruction_attributes"):
                continue
            upper, text = _price_upper(rng, prices[i])
            n = _n_combinations(product["options"])
            goals.extend(GoalRef(i, "s", c, upper, text) for c in range(n))
        else:
            for j, entry in enumerate(product.get("instructions", ())):
                if len(entry["instruction_attributes"]) == 0:
                    continue
                upper, text = _price_upper(rng, prices[i])
                goals.append(GoalRef(i, "h", j, upper, text))
    return goals


def product_document(product: Mapping[str, Any]) -> str:
    """The text upstream indexes for a product (see :mod:`bpo_envs.webshop.search`)."""
    option_text = ", and ".join(f"{name}: {', '.join(values)}" for name, values in product["options"].items())
    first_bullet = product["BulletPoints"][0] if product["BulletPoints"] else ""
    return " ".join([product["Title"], product["Description"], first_bullet, option_text]).lower()


def build_catalog(
    files: Mapping[str, Path | None],
    goals: str = "auto",
    num_products: int | None = None,
    goal_seed: int = SHUFFLE_SEED,
    key: tuple[Any, ...] = (),
) -> Catalog:
    """Load products, draw prices and goals, shuffle them and index the products."""
    if goals not in ("auto", "synthetic", "human"):
        raise ValueError(f"goals must be 'auto', 'synthetic' or 'human', got {goals!r}")
    if goals == "human" and files.get("human") is None:
        raise FileNotFoundError(f"goals='human' needs {HUMAN_FILE} next to {files['product']}")
    mode = goals if goals != "auto" else ("human" if files.get("human") is not None else "synthetic")
    products = load_products(files, num_products=num_products, human=mode == "human")
    rng = random.Random(goal_seed)
    prices = [p["pricing"][0] if len(p["pricing"]) == 1 else rng.uniform(*p["pricing"][:2]) for p in products]
    goal_list = build_goals(products, prices, mode, rng)
    if not goal_list:
        raise WebShopDataError(
            f"no {mode} goals in {files['product'].parent}: no product has "
            + ("an instruction with attributes" if mode == "synthetic" else f"an entry in {HUMAN_FILE}")
        )
    random.Random(SHUFFLE_SEED).shuffle(goal_list)
    index = SearchIndex([product_document(p) for p in products])
    return Catalog(key, products, prices, goal_list, mode, index)


_CATALOGS: dict[tuple[Any, ...], Catalog] = {}
_LOCK = threading.Lock()


def get_catalog(
    data_dir: str | os.PathLike | None,
    goals: str = "auto",
    num_products: int | None = None,
    goal_seed: int = SHUFFLE_SEED,
) -> Catalog:
    """The process-wide shared :class:`Catalog` of this configuration (built on first use).

    ``data_dir=None`` means the bundled generated catalog (see :mod:`.generator`).
    """
    bundled = data_dir is None
    if bundled:
        from bpo_envs.webshop.generator import bundled_data_dir

        data_dir = bundled_data_dir()
    files = find_data_files(data_dir)
    where = (str(Path(data_dir).resolve()), goals, num_products, goal_seed)
    with _LOCK:
        catalog = _CATALOGS.get(where)
        if catalog is None:
            # the snapshot kind: what the data is, not where it lies (processes may differ)
            fingerprint = tuple((p.name, p.stat().st_size) for p in files.values() if p is not None)
            catalog = build_catalog(files, goals, num_products, goal_seed, (fingerprint, *where[1:]))
            catalog.files, catalog.bundled = dict(files), bundled
            _CATALOGS[where] = catalog
    return catalog

