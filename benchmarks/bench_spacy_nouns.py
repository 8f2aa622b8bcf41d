"""How much the WebShop reward depends on the title-noun parser: heuristic vs spaCy.

Run it in a Python environment that has spaCy and an ``en_core_web_sm`` pipeline (not the
project's main one: installing spaCy there changes every WebShop reward, since
``noun_parser="auto"`` then picks it). Name a differently packaged copy of the pipeline with
``--spacy-model`` (or ``$BPO_WEBSHOP_SPACY_MODEL``). Writes JSON:

* ``titles``: of the bundled catalog's product titles, how many get a different noun set
  (as sets, the way the reward uses them) from the two parsers;
* ``purchases``: for ``--goals`` goals of the test split, buying each of the top ``--hits``
  results of the expert's search (no option chosen, and the goal product with the goal's
  options): how often the type factor ``r_type``, the score, and ``won`` (score == 1) change.

    python benchmarks/bench_spacy_nouns.py --spacy-model en_core_web_sm --out spacy_nouns.json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
from pathlib import Path


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--spacy-model", default=os.environ.get("BPO_WEBSHOP_SPACY_MODEL", "en_core_web_sm"))
    ap.add_argument("--goals", type=int, default=500, help="test-split goals to buy for")
    ap.add_argument("--hits", type=int, default=10, help="search results bought per goal")
    ap.add_argument("--out", default="spacy_nouns.json")
    args = ap.parse_args(argv)
    os.environ["BPO_WEBSHOP_SPACY_MODEL"] = args.spacy_model

    import spacy

    from bpo_envs.webshop import WebShopEnv
    from bpo_envs.webshop.reward import get_reward, spacy_available, title_nouns

    if not spacy_available():
        sys.exit(f"spaCy pipeline {args.spacy_model!r} is not importable here")
    env = WebShopEnv(split="test", noun_parser="heuristic")
    catalog = env.catalog
    titles = sorted({p["name"] for p in catalog.products})
    differ = [t for t in titles if set(title_nouns(t, "heuristic")) != set(title_nouns(t, "spacy"))]

    n = r_type_changed = score_changed = won_changed = 0
    abs_diff = 0.0
    for task in list(env.task_ids())[: args.goals]:
        env.reset(options={"task_id": task})
        goal = env.goal
        search = env.expert_actions()[0]
        hits = catalog.index.search(search[len("search[") : -1], 50)[: args.hits]
        target = catalog.asin_to_index[goal["asin"].lower()]
        chosen = {f"g{i}": v for i, v in enumerate(env._goal_option_values(catalog.products[target]))}
        purchases = [(i, {}) for i in hits] + [(target, chosen)]
        for index, options in purchases:
            product, price = catalog.products[index], catalog.prices[index]
            a, da = get_reward(product, goal, price, options, "heuristic")
            b, db = get_reward(product, goal, price, options, "spacy")
            n += 1
            r_type_changed += da["r_type"] != db["r_type"]
            score_changed += abs(a - b) > 1e-12
            won_changed += (a == 1.0) != (b == 1.0)
            abs_diff += abs(a - b)
    result = {
        "spacy": spacy.__version__,
        "spacy_model": args.spacy_model,
        "python": platform.python_version(),
        "catalog": env.provenance(),
        "titles": {"count": len(titles), "noun_sets_differ": len(differ), "fraction": len(differ) / len(titles),
                   "examples": [{"title": t, "heuristic": sorted(set(title_nouns(t, "heuristic"))),
                                 "spacy": sorted(set(title_nouns(t, "spacy")))} for t in differ[:10]]},
        "purchases": {"count": n, "goals": min(args.goals, len(env.task_ids())), "hits_per_goal": args.hits,
                      "r_type_changed": r_type_changed, "score_changed": score_changed,
                      "won_changed": won_changed, "score_changed_fraction": score_changed / n,
                      "mean_abs_score_difference": abs_diff / n},
    }  # fmt: skip
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps({k: v for k, v in result.items() if k != "catalog"}, indent=2))
    return result


if __name__ == "__main__":
    main()
