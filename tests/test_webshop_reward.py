"""WebShop reward (upstream ``get_reward``) on hand-computed cases, and the BM25 search."""

from __future__ import annotations

import math

import pytest

pytest.importorskip("rapidfuzz")
pytest.importorskip("bm25s")

from bpo_envs.webshop.reward import (  # noqa: E402
    get_reward,
    heuristic_nouns,
    normalize_color,
    token_set_ratio,
    type_reward,
)
from bpo_envs.webshop.search import K1, B, SearchIndex  # noqa: E402

GOAL_NAME = "Earth Mama Citrus Deodorant Stick"  # heuristic nouns: earth mama citrus deodorant stick


def _product(**changes):
    product = {
        "query": "deodorant",
        "product_category": "Beauty & Personal Care › Personal Care › Deodorants",
        "name": GOAL_NAME,
        "Title": GOAL_NAME,
        "BulletPoints": ["Gentle on sensitive skin", "Made in USA"],
        "Description": "A natural deodorant.",
        "Attributes": ["long lasting", "aluminum free"],
    }
    product.update(changes)
    return product


def _goal(**changes):
    goal = {
        "query": "deodorant",
        "product_category": "Beauty & Personal Care › Personal Care › Deodorants",
        "name": GOAL_NAME,
        "attributes": ["long lasting", "sensitive skin"],
        "goal_options": {"scent": "bright citrus", "size": "3 ounce"},
        "price_upper": 20.0,
    }
    goal.update(changes)
    return goal


RIGHT = {"scent": "bright citrus", "size": "3 ounce"}


def test_heuristic_nouns_of_the_fixture_titles():
    assert heuristic_nouns(GOAL_NAME) == ["earth", "mama", "citrus", "deodorant", "stick"]
    assert heuristic_nouns("Natural Lavender Body Spray, 8.5 oz (Pack of 2)") == [
        "lavender", "body", "spray", "pack",
    ]  # fmt: skip


def test_exact_purchase_scores_one():
    # attributes: "long lasting" fuzzy-matches an Attribute, "sensitive skin" is in a bullet
    score, info = get_reward(_product(), _goal(), 10.99, RIGHT)
    assert score == 1.0
    assert info["r_att"] == 1.0 and info["r_option"] == 1.0 and info["r_price"] is True
    assert info["w_att"] == pytest.approx(2 / 5) and info["w_option"] == pytest.approx(2 / 5)


def test_wrong_option_loses_its_share():
    score, info = get_reward(_product(), _goal(), 10.99, {"scent": "bright citrus", "size": "2.5 ounce"})
    assert score == pytest.approx(4 / 5)
    assert info["r_option"] == 0.5


def test_missing_option_loses_its_share():
    score, _ = get_reward(_product(), _goal(), 10.99, {"scent": "bright citrus"})
    assert score == pytest.approx(4 / 5)


def test_price_over_the_limit():
    score, info = get_reward(_product(), _goal(), 25.0, RIGHT)
    assert score == pytest.approx(4 / 5)
    assert info["r_price"] is False
    assert get_reward(_product(), _goal(), 20.0, RIGHT)[0] == 1.0  # the limit itself is fine


def test_missing_attribute():
    product = _product(BulletPoints=["Made in USA"])  # "sensitive skin" appears nowhere now
    score, info = get_reward(product, _goal(), 10.99, RIGHT)
    assert score == pytest.approx(4 / 5)
    assert info["r_att"] == 0.5


def test_attribute_found_in_title_or_description():
    product = _product(BulletPoints=[], Attributes=["DUMMY_ATTR"], Description="Long lasting. For sensitive skin.")
    assert get_reward(product, _goal(), 10.99, RIGHT)[0] == 1.0


def test_wrong_category_and_title_gives_zero():
    product = _product(
        query="shampoo",
        product_category="Beauty & Personal Care › Hair Care › Shampoo",
        name="Lumora Argan Shampoo",
        Title="Lumora Argan Shampoo",
    )
    score, info = get_reward(product, _goal(), 10.99, RIGHT)
    assert info["r_type"] == 0.0 and info["title_score"] == 0.0
    assert score == 0.0


def test_type_factor_half_when_only_a_fifth_of_the_title_nouns_match():
    bought = _product(query="body spray", product_category="Beauty & Personal Care › Fragrance › Body Spray",
                      name="Citrus Body Spray")  # fmt: skip
    info = type_reward(bought, _goal())
    assert info["title_score"] == pytest.approx(1 / 5)
    assert not info["query_match"] and not info["category_match"]
    assert info["r_type"] == 0.5
    score, _ = get_reward(dict(bought, Title="Citrus Body Spray"), _goal(), 10.99, RIGHT)
    # attributes: "long lasting" (Attributes) + "sensitive skin" (bullet); options 2; price 1
    assert score == pytest.approx(0.5 * 5 / 5)


def test_type_factor_category_overlap_rescues_a_low_title_score():
    bought = _product(query="soap", name="Citrus Soap Bar",
                      product_category="Beauty & Personal Care › Personal Care › Soaps")  # fmt: skip
    info = type_reward(bought, _goal())
    assert info["category_match"] and info["title_score"] == pytest.approx(1 / 5)
    assert info["r_type"] == 1.0


def test_type_factor_tenth_below_ten_percent():
    long_name = "Earth Mama Citrus Deodorant Stick Travel Kit Gift Box Bundle Pouch"
    assert len(heuristic_nouns(long_name)) == 11
    bought = _product(query="candle", product_category="Home › Candles", name="Citrus Candle")
    info = type_reward(bought, _goal(name=long_name))
    assert info["title_score"] == pytest.approx(1 / 11)
    assert info["r_type"] == 0.1


def test_title_without_nouns_scores_point_two():
    info = type_reward(_product(), _goal(name="New Natural 3.4 oz"))
    assert info["title_score"] == 0.2
    assert info["r_type"] == 1.0  # the query matches


def test_colour_normalisation_in_human_goal_options():
    # both normalise to "blue" ("blue" precedes "light" and "navy" in upstream's colour list)
    assert normalize_color("navy blue") == "blue" and normalize_color("light blue") == "blue"
    goal = _goal(goal_options=["navy blue"], attributes=["long lasting"])
    score, info = get_reward(_product(), goal, 10.99, {"color": "light blue"})
    assert info["r_option"] == 1.0 and score == 1.0
    score, info = get_reward(_product(), goal, 10.99, {"color": "ivory"})
    assert info["r_option"] == 0.0 and score == pytest.approx(2 / 3)


def test_human_goal_option_fuzzy_subset_matches():
    goal = _goal(goal_options=["bright citrus", "3 ounce"])
    score, _ = get_reward(_product(), goal, 10.99, {"scent": "bright citrus", "size": "3 ounce (pack of 1)"})
    assert score == 1.0


def test_synthetic_goal_options_compare_name_value_pairs_as_upstream():
    # upstream iterates goal_options.items(): ("size", "large") keeps "size" on the goal side,
    # so "x-large" does not match "large" for a synthetic goal but does for a human goal.
    attrs = ["long lasting"]
    synthetic = get_reward(_product(), _goal(attributes=attrs, goal_options={"size": "large"}), 5.0, {"size": "x-large"})
    human = get_reward(_product(), _goal(attributes=attrs, goal_options=["large"]), 5.0, {"size": "x-large"})
    assert synthetic[1]["r_option"] == 0.0
    assert human[1]["r_option"] == 1.0
    # a value that is itself a colour normalises to the colour through the pair
    assert normalize_color(("color", "black")) == "black"


def test_token_set_ratio_is_thefuzz_compatible():
    assert token_set_ratio("Long-Lasting", "long lasting") == 100
    assert token_set_ratio("x large", "large") == 100
    assert token_set_ratio("large", "('size', 'large')") == 100
    assert token_set_ratio("x large", "('size', 'large')") == 83  # rounded like thefuzz
    assert token_set_ratio("", "anything") == 0


# ---- search ------------------------------------------------------------------------------

DOCS = ["red running shoes", "blue running shoes for men", "red dress", "coffee beans 8.5 oz", "a b c"]


def test_search_ranks_and_filters_non_matching():
    index = SearchIndex(DOCS)
    assert index.search("red shoes") == (0, 2, 1)  # both terms, then the shorter one-term doc
    assert index.search("running") == (0, 1)  # Porter stems "running" -> "run"
    assert index.search("8.5") == (3,)  # decimals stay one token
    assert index.search("c") == (4,)  # one-character tokens are kept
    assert index.search("the a and") == ()  # stop words only
    assert index.search("zebra") == ()
    assert index.search("red shoes", k=1) == (0,)


def test_search_scores_follow_lucene_bm25():
    index = SearchIndex(DOCS)
    lengths = [3, 4, 2, 4, 2]  # after stop words ("for", "a") are dropped
    avg = sum(lengths) / len(lengths)
    n, df = len(DOCS), 2

    def term(dl):  # Lucene >= 8 (pyserini's) BM25: no (k1 + 1) factor in the numerator
        idf = math.log(1 + (n - df + 0.5) / (df + 0.5))
        return idf / (1 + K1 * (1 - B + B * dl / avg))

    scores = index.scores("red")
    assert scores[0] == pytest.approx(term(3), rel=1e-5)
    assert scores[2] == pytest.approx(term(2), rel=1e-5)
    assert scores[1] == 0.0


def test_noun_parser_choice():
    from bpo_envs.webshop.reward import resolve_noun_parser, spacy_available, title_nouns

    assert resolve_noun_parser("heuristic") == "heuristic"
    assert resolve_noun_parser("auto") == ("spacy" if spacy_available() else "heuristic")
    with pytest.raises(ValueError, match="noun_parser must be"):
        resolve_noun_parser("nltk")
    if not spacy_available():
        with pytest.raises(ImportError, match="en_core_web_sm"):
            resolve_noun_parser("spacy")
    else:  # upstream's tagger: the goal title's own nouns always match themselves
        nouns = title_nouns(GOAL_NAME, "spacy")
        assert "deodorant" in nouns
        assert get_reward(_product(), _goal(), 10.99, RIGHT, parser="spacy")[0] == 1.0
