"""The WebShop pages as upstream's text env shows them.

Upstream renders HTML templates and flattens their visible text nodes. A page here is the same
sequence of text nodes (:class:`Node`: its text and what it is: plain text, a button, an option
label or a product link), built directly; :func:`to_text` and :func:`to_text_rich` flatten it
as upstream's ``convert_html_to_text`` does in the ``text`` and ``text_rich`` modes.

Page layouts follow the templates of the released site (the ones the published prompts show):
search ``WebShop [SEP] Instruction: [SEP] <goal> [SEP] Search``; results ``Instruction: [SEP]
<goal> [SEP] Back to Search [SEP] Page 1 (Total results: 50) [SEP] [< Prev] Next > [SEP]
<ASIN> [SEP] <title> [SEP] <price> ...``; item ``... [SEP] Back to Search [SEP] < Prev [SEP]
<option name> [SEP] <value> ... [SEP] <title> [SEP] Price: $x [SEP] Rating: N.A. [SEP]
Description [SEP] Features [SEP] Reviews [SEP] Buy Now``; the Description, Features and
Reviews sub-pages; and the done page.

Differences from upstream, all in whitespace: whitespace-only text nodes are dropped in both
modes (upstream's ``text`` mode drops them as well in its published outputs), and ``text_rich``
writes each node stripped rather than with the template's indentation.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple

TEXT, BUTTON, OPTION, LINK = "text", "button", "option", "link"
PRODUCTS_PER_PAGE = 10
SEARCH_RETURN_N = 50
SUB_PAGES = ("Description", "Features", "Reviews")


class Node(NamedTuple):
    text: str
    kind: str = TEXT
    group: str = ""  # the option group of an OPTION node


def _instruction(goal_text: str) -> list[Node]:
    return [Node("Instruction:"), Node(goal_text)]


def search_page(goal_text: str) -> list[Node]:
    return [Node("WebShop"), *_instruction(goal_text), Node("Search", BUTTON)]


def results_page(goal_text: str, page: int, total: int, items: Sequence[Mapping[str, Any]]) -> list[Node]:
    nodes = [*_instruction(goal_text), Node("Back to Search", BUTTON), Node(f"Page {page} (Total results: {total})")]
    if page > 1:
        nodes.append(Node("< Prev", BUTTON))
    nodes.append(Node("Next >", BUTTON))  # upstream shows it on every results page, the last too
    for item in items:
        nodes += [Node(item["asin"], LINK), Node(item["Title"]), Node(item["Price"])]
    return nodes


def item_page(goal_text: str, product: Mapping[str, Any]) -> list[Node]:
    nodes = [*_instruction(goal_text), Node("Back to Search", BUTTON), Node("< Prev", BUTTON)]
    for name, values in product["options"].items():
        nodes.append(Node(name))
        nodes += [Node(v, OPTION, name) for v in values]
    nodes += [
        Node(product["Title"]),
        Node(f"Price: {product['Price']}"),
        Node(f"Rating: {product['Rating']}"),
        *(Node(s, BUTTON) for s in SUB_PAGES),
        Node("Buy Now", BUTTON),
    ]
    return nodes


def sub_page(goal_text: str, product: Mapping[str, Any], which: str) -> list[Node]:
    nodes = [*_instruction(goal_text), Node("Back to Search", BUTTON), Node("< Prev", BUTTON)]
    if which == "Description":
        nodes.append(Node(product["Description"]))
    elif which == "Features":
        nodes += [Node(b) for b in product["BulletPoints"]]
    else:
        for review in product["Reviews"]:
            nodes += [Node(f'"{review["title"]}"'), Node(str(review["score"])), Node(review["body"])]
    return nodes


def _tojson(options: Mapping[str, str]) -> str:
    # Flask's ``tojson`` filter: sorted keys, ASCII, HTML-safe escapes
    text = json.dumps(dict(options), sort_keys=True, ensure_ascii=True)
    for ch, esc in (("<", "\\u003c"), (">", "\\u003e"), ("&", "\\u0026"), ("'", "\\u0027")):
        text = text.replace(ch, esc)
    return text


def done_page(asin: str, options: Mapping[str, str], reward: float) -> list[Node]:
    labels = ["Thank you for shopping with us!", "Your code:", "None", "(Paste it in your MTurk interface.)",
              "Purchased", "asin", asin, "options", _tojson(options), "attrs", "None", "category", "None",
              "query", "None", "product category", "None", "Target", "asin", "options", "attrs",
              "price upper", "instuction text", "category", "product category", "query", "Goal", "None",
              "Reward", "Your score (min 0.0, max 1.0)", str(reward), "Reward Details", "None"]  # fmt: skip
    return [Node(t) for t in labels]


def to_text(nodes: Sequence[Node]) -> str:
    """The ``text`` observation: the stripped, non-empty node texts joined by `` [SEP] ``."""
    return " [SEP] ".join(s for s in (n.text.strip() for n in nodes) if s)


def to_text_rich(nodes: Sequence[Node], selected: Sequence[str] = (), visited: Sequence[str] = ()) -> str:
    """The ``text_rich`` observation: ``[button] x [button_]`` marks, clicked options and
    visited products as ``[clicked button] x [clicked button_]``, one node per line."""
    out: list[str] = []
    clicked: list[str] = []
    for node in nodes:
        t = node.text.strip()
        if not t:
            continue
        if node.kind == BUTTON:
            out.append(f"[button] {t} [button_]")
        elif node.kind == OPTION:
            if node.text in selected:
                out.append(f"  [clicked button] {t} [clicked button_]")
                clicked.append(f"You have clicked {t}.\n")
            else:
                out.append(f"  [button] {t} [button_]")
        elif node.kind == LINK:
            mark = "clicked button" if node.text in visited else "button"
            out.append(f"\n[{mark}] {t} [{mark}_]")
        else:
            out.append(t)
    return "".join(reversed(clicked)) + "".join(s + "\n" for s in out)


def clickables(nodes: Sequence[Node]) -> dict[str, Node]:
    """Lower-cased label -> node: buttons and product links first, then options (as upstream,
    an option whose label repeats a button's replaces it)."""
    table = {n.text.lower(): n for n in nodes if n.kind in (BUTTON, LINK)}
    for n in nodes:
        if n.kind == OPTION:
            table[n.text] = n
    return table
