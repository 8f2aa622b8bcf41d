"""``BPO-WebShop-v0``: the WebShop text environment (Yao et al. 2022), offline and snapshottable.

Behaviour follows upstream's ``web_agent_site/envs/web_agent_text_env.py`` (``SimServer`` /
``SimBrowser``):

* Actions are ``search[keywords]`` and ``click[label]``, parsed as upstream does (the text
  before the last ``[`` of the first line is the verb, up to the last ``]`` the argument, which
  is lower-cased). Labels are the page's buttons, product ASINs and option values, matched
  case-insensitively. ``search[...]`` works from any page (as upstream); the admissible list
  offers it only where the page has a search bar.
* Pages: search -> results (the top 50 BM25 hits, 10 a page, ``< Prev`` / ``Next >``) -> item
  (options, ``Description`` / ``Features`` / ``Reviews`` sub-pages, ``Buy Now``) -> done.
  ``Back to Search`` starts over (and forgets the visited products), ``< Prev`` goes back one
  level, clicking an option selects it. The observation is the page in the ``text`` (default)
  or ``text_rich`` mode (see :mod:`.pages`).
* ``click[buy now]`` ends the episode with reward = the upstream score (:mod:`.reward`);
  ``info["won"]`` is ``score == 1`` and ``info["reward_details"]`` has upstream's parts. An
  action that does nothing upstream (bad syntax, an empty search, a label not on the page,
  ``click[search]``) leaves the page as it is, gives reward 0 and ``info["invalid_action"]``,
  with an observation that starts with the reason.
* ``info["admissible_actions"]``: on a page with a search bar, the ``search[...]`` candidates
  of ``search_actions=`` (:mod:`.queries`: ``"instruction"``, the default, offers phrases of the
  instruction the agent reads; ``"free"`` the placeholder ``search[<your query>]`` as
  verl-agent; ``"upstream-il"`` upstream's IL candidates, built from hidden goal fields),
  otherwise every ``click[label]`` of the page. No default offers a hidden goal field.
* Rewards (docs in :mod:`bpo_envs.reward_settings`): ``reward_mode="score"`` (default) pays the
  upstream score on ``Buy Now``, ``"success"`` pays ``1[score == 1]``; ``reward_scale``
  multiplies it; ``invalid_penalty`` is paid (negated) for an invalid action.
  ``REWARD_SETTINGS["verl-agent"]`` is verl-agent's ``10 * success`` and ``-0.1``.

Tasks are goal indices (ints) into the shuffled goal list of the catalog (see :mod:`.data`);
``split=`` restricts ``task_ids()`` without renumbering: ``"test"`` is goals 0-499, ``"eval"``
500-1499 and ``"train"`` the rest (upstream's splits; human goals when ``items_human_ins.json``
is present), proportionally on catalogs under 2000 goals. The products and the search index
live in a per-process :class:`~bpo_envs.webshop.data.Catalog` shared by every env instance of
the same data configuration; an env holds only its session state (an immutable tuple), which
is what a snapshot copies.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any, NamedTuple

import numpy as np

from bpo_envs.core import SnapshotEnv, SnapshotError
from bpo_envs.reward_settings import REWARD_SETTINGS, VERL_AGENT_REWARD, reward_settings
from bpo_envs.webshop import pages
from bpo_envs.webshop.data import SHUFFLE_SEED, Catalog, get_catalog
from bpo_envs.webshop.queries import (
    DEFAULT_SEARCH_ACTIONS,
    SEARCH_ACTIONS,
    instruction_queries,
    search_candidates,
)
from bpo_envs.webshop.reward import get_reward, resolve_noun_parser, token_set_ratio

OBSERVATION_MODES = ("text", "text_rich")
DEFAULT_MAX_STEPS = 15
ENV_ID = "BPO-WebShop-v0"
__all__ = [
    "DEFAULT_SEARCH_ACTIONS", "REWARD_SETTINGS", "SEARCH_ACTIONS", "VERL_AGENT_REWARD", "Session", "WebShopEnv",
    "parse_action",
]  # fmt: skip


class Session(NamedTuple):
    """The whole mutable state of an episode (immutable: a snapshot stores it as is)."""

    page: str  # "start" | "results" | "item" | "sub" | "done"
    keywords: str | None = None
    page_num: int = 1
    product: int | None = None
    options: tuple[tuple[str, str], ...] = ()
    visited: frozenset[int] = frozenset()
    sub: str | None = None
    reward: float = 0.0


START = Session("start")
PAGE_CACHE_SIZE = 1 << 14
"""Pages kept in a catalog's shared page cache (:meth:`WebShopEnv._view`); emptied when full."""


class PageView(NamedTuple):
    """A rendered page (shared by every env on a catalog: never mutate its parts)."""

    nodes: list[pages.Node]
    clickables: dict[str, pages.Node]
    observation: str
    admissible: tuple[str, ...]


def parse_action(action: str) -> tuple[str, str | None]:
    """Upstream's ``parse_action`` (``re.match(r'(.+)\\[(.+)\\]', action)``) in linear time."""
    line = action.split("\n", 1)[0]
    close = line.rfind("]")
    if close >= 3:
        open_ = line.rfind("[", 1, close - 1)
        if open_ >= 1:
            return line[:open_], line[open_ + 1 : close]
    return action, None


class WebShopEnv(SnapshotEnv):
    """The WebShop text env over the bundled catalog or the user's upstream data files.

    Args:
        data_dir: a folder with the upstream files (see :mod:`.data`); ``None`` (default) for
            the bundled generated catalog.
        observation_mode: ``"text"`` or ``"text_rich"``.
        goals: ``"auto"`` (human goals when ``items_human_ins.json`` is present, else
            synthetic), ``"synthetic"`` or ``"human"``.
        split: ``None``/``"all"``, ``"train"``, ``"eval"`` or ``"test"``: which goal indices
            ``task_ids()`` lists (test = goals 0-499, as upstream).
        search_actions: ``"instruction"`` (default), ``"free"`` or ``"upstream-il"``: the
            start page's admissible searches (see :mod:`.queries`). A text-generating policy
            may use ``"free"``; ``"upstream-il"`` uses hidden goal fields.
        reward_mode, reward_scale, invalid_penalty: see :mod:`bpo_envs.reward_settings`.
        num_products: use only the first N products of the product file (as upstream).
        noun_parser: ``"auto"``, ``"spacy"`` or ``"heuristic"`` (title nouns of the reward).
        goal_seed: seed of the drawn prices and price limits.
        max_episode_steps: step limit (default 15); the episode is truncated there.
    """

    step_may_block = False  # pure in-memory pages and search over a loaded catalog: bounded by construction
    has_expert = True  # the goal's own search and purchase

    def __init__(
        self,
        data_dir: str | os.PathLike | None = None,
        *,
        observation_mode: str = "text",
        goals: str = "auto",
        split: str | None = None,
        num_products: int | None = None,
        noun_parser: str = "auto",
        goal_seed: int = SHUFFLE_SEED,
        search_actions: str = DEFAULT_SEARCH_ACTIONS,
        reward_mode: str = "score",
        reward_scale: float = 1.0,
        invalid_penalty: float = 0.0,
        max_episode_steps: int = DEFAULT_MAX_STEPS,
        render_mode: str | None = None,
    ) -> None:
        super().__init__(max_episode_steps=max_episode_steps, render_mode=render_mode)
        if observation_mode not in OBSERVATION_MODES:
            raise ValueError(f"observation_mode must be one of {OBSERVATION_MODES}, got {observation_mode!r}")
        if isinstance(goal_seed, bool) or not isinstance(goal_seed, int | np.integer):
            raise ValueError(f"goal_seed must be an int, got {goal_seed!r}")
        if num_products is not None and (isinstance(num_products, bool) or not isinstance(num_products, int) or num_products < 1):
            raise ValueError(f"num_products must be a positive int or None, got {num_products!r}")
        if search_actions not in SEARCH_ACTIONS:
            raise ValueError(f"search_actions must be one of {SEARCH_ACTIONS}, got {search_actions!r}")
        self.search_actions = search_actions
        self.rewards = reward_settings(reward_mode, reward_scale, invalid_penalty)
        self.observation_mode = observation_mode
        self.noun_parser = resolve_noun_parser(noun_parser)
        self.catalog: Catalog = get_catalog(data_dir, goals, num_products, goal_seed)
        self.split = split
        self._task_ids = self.catalog.split(split)
        self._session = START
        self._goal: dict[str, Any] = {}
        # the last page built: (session, goal, nodes, clickables). A page is a pure function of
        # the (immutable) session and the goal, so an identity match is always the same page;
        # a click then reads the page it clicks on instead of building it again.
        self._page: tuple[Session, dict[str, Any], list[pages.Node], dict[str, pages.Node]] | None = None
        self._goal_task: Any = None  # the task id of ``_goal`` (part of the shared page cache's key)

    # ---- SnapshotEnv ---------------------------------------------------------------------
    def task_ids(self) -> Sequence[int]:
        return self._task_ids

    def _resolve_task(self, task_id: Any) -> Any:
        try:
            index = int(task_id)
        except (TypeError, ValueError):
            index = None
        if index is not None and not isinstance(task_id, bool) and str(index) == str(task_id).strip() and index in self._task_ids:
            return index
        r = self._task_ids
        raise ValueError(
            f"unknown task_id {task_id!r} for WebShopEnv (split {self.split or 'all'}: "
            f"goal indices {r.start}..{r.stop - 1})"
        )

    def _snapshot_kind(self) -> Any:
        return (
            "WebShop", self.catalog.key, self.observation_mode, self.noun_parser, self.max_episode_steps,
            self.search_actions, self.rewards,
        )  # fmt: skip

    def provenance(self) -> dict[str, Any]:
        """Which data, split and settings this env runs on (see :mod:`bpo_envs.provenance`)."""
        return {
            "env": ENV_ID,
            **self.catalog.provenance(),
            "split": self.split or "all",
            "task_count": len(self._task_ids),
            "search_actions": self.search_actions,
            "noun_parser": self.noun_parser,
            "reward": self.rewards.as_dict(),
        }

    def _reset_task(self, task_id: int) -> tuple[str, dict[str, Any]]:
        self._goal, self._goal_task = self.catalog.goal(task_id), task_id
        self._session = START
        return self._render(START)

    def _get_state(self) -> Session:
        return self._session

    def _set_state(self, state: Session) -> None:
        self._session = state

    def _apply(self, state: Any) -> None:
        # the goal depends on the task id, which the base restores after _set_state
        super()._apply(state)
        self._goal, self._goal_task = self.catalog.goal(self._task_id), self._task_id

    def _portable_task_state(self, inner: Session) -> tuple[Any, ...]:
        return (*inner[:5], tuple(sorted(inner.visited)), *inner[6:])

    def _task_state_from_portable(self, obj: tuple[Any, ...]) -> Session:
        if not (isinstance(obj, tuple) and len(obj) == len(Session._fields) and isinstance(obj[0], str)
                and isinstance(obj[5], tuple | frozenset) and isinstance(obj[4], tuple)):
            raise SnapshotError("portable bytes: not a WebShop session")
        return Session(*obj[:5], frozenset(obj[5]), *obj[6:])

    # ---- pages ---------------------------------------------------------------------------
    @property
    def goal(self) -> dict[str, Any]:
        """The current goal (upstream's goal dict: instruction, attributes, options, ...)."""
        return dict(self._goal)

    @property
    def session(self) -> Session:
        return self._session

    def _hits(self, keywords: str) -> tuple[int, ...]:
        return self.catalog.index.search(keywords, pages.SEARCH_RETURN_N)

    def _nodes(self, s: Session) -> list[pages.Node]:
        text = self._goal["instruction_text"]
        products = self.catalog.products
        if s.page == "start":
            return pages.search_page(text)
        if s.page == "results":
            hits = self._hits(s.keywords or "")
            start = (s.page_num - 1) * pages.PRODUCTS_PER_PAGE
            shown = [products[i] for i in hits[max(start, 0) : start + pages.PRODUCTS_PER_PAGE]] if start >= 0 else []
            return pages.results_page(text, s.page_num, len(hits), shown)
        if s.page == "item":
            return pages.item_page(text, products[s.product])
        if s.page == "sub":
            return pages.sub_page(text, products[s.product], s.sub)
        return pages.done_page(products[s.product]["asin"], dict(s.options), s.reward)

    def _page_of(self, s: Session) -> tuple[list[pages.Node], dict[str, pages.Node]]:
        """The nodes and clickables of session ``s``'s page (the last one built, if it is ``s``'s)."""
        page = self._page
        if page is not None and page[0] is s and page[1] is self._goal:
            return page[2], page[3]
        view = self._view(s)
        self._page = (s, self._goal, view.nodes, view.clickables)
        return view.nodes, view.clickables

    def _view(self, s: Session) -> PageView:
        """Session ``s``'s page under the current goal, from the catalog's shared page cache.

        A page is a pure function of the (immutable) session, the goal (fixed by the task id
        on a catalog) and the env's ``observation_mode`` and ``search_actions``, so every env
        instance on the catalog shares the pages it built: the trees of a batch and the batches
        of a run revisit the same pages of the same tasks many times."""
        key = (self.observation_mode, self.search_actions, self._goal_task, s)
        cache = self.catalog.page_cache
        view = cache.get(key)
        if view is None:
            nodes = self._nodes(s)
            table = pages.clickables(nodes)
            if self.observation_mode == "text":
                obs = pages.to_text(nodes)
            else:
                selected = [v for _, v in s.options] if s.page == "item" else []
                visited = [self.catalog.products[i]["asin"] for i in s.visited]
                obs = pages.to_text_rich(nodes, selected, visited)
            admissible = () if s.page == "done" else tuple(self._admissible(s, table))
            view = PageView(nodes, table, obs, admissible)
            if len(cache) >= PAGE_CACHE_SIZE:
                cache.clear()  # bounded; plain dict operations keep it safe across threads
            cache[key] = view
        return view

    def _admissible(self, s: Session, table: dict[str, pages.Node]) -> list[str]:
        if s.page == "start":
            return search_candidates(self.search_actions, self._goal)
        return [f"click[{label}]" for label in table if label != "search"]

    def _render(self, s: Session) -> tuple[str, dict[str, Any]]:
        view = self._view(s)
        return view.observation, {"admissible_actions": list(view.admissible), "page": s.page}

    # ---- transitions ---------------------------------------------------------------------
    def _step(self, action: str) -> tuple[str, float, bool, dict[str, Any]]:
        s = self._session
        name, arg = parse_action(action)
        if arg is not None:
            arg = arg.lower()
        if name == "search" and arg:
            new = Session("results", arg, 1, None, (), s.visited)
        elif name == "click" and arg is not None and arg != "search":
            node = self._page_of(s)[1].get(arg)
            if node is None:
                return self._invalid(action, f"there is no {arg[:80]!r} to click on this page")
            new = self._click(s, arg, node)
        elif name == "click" and arg == "search":
            return self._invalid(action, "type the query with search[keywords]; the Search button cannot be clicked")
        elif name == "search":
            return self._invalid(action, "search[...] needs keywords")
        else:
            return self._invalid(action, "actions are search[keywords] or click[label]")
        self._session = new
        obs, info = self._render(new)
        if new.page == "done":
            won = new.reward == 1.0
            info["won"] = won
            info["score"] = new.reward
            info["reward_details"] = self._details
            return obs, self.rewards.terminal(new.reward, won), True, info
        return obs, 0.0, False, info

    def _click(self, s: Session, label: str, node: pages.Node) -> Session:
        if label == "buy now":
            reward, details = self._purchase_reward(s)
            self._details = dict(details)
            return s._replace(page="done", reward=float(reward))
        if label == "back to search":
            return START
        if label == "next >" and s.page == "results":
            return s._replace(page_num=s.page_num + 1)
        if label == "< prev":
            if s.page == "results":
                return s._replace(page_num=s.page_num - 1)
            if s.page == "sub":
                return s._replace(page="item", sub=None)
            if s.page == "item":
                return Session("results", s.keywords, s.page_num, None, (), s.visited)
        if label in ("description", "features", "reviews"):
            return s._replace(page="sub", sub=label.capitalize())
        if node.kind == pages.LINK:
            index = self.catalog.asin_to_index[label]
            return s._replace(page="item", product=index, visited=s.visited | {index})
        if node.kind == pages.OPTION:
            options = dict(s.options)
            options[node.group] = label
            return s._replace(page="item", sub=None, options=tuple(options.items()))
        return s._replace(page="item", sub=None)

    def _purchase_reward(self, s: Session) -> tuple[float, dict[str, Any]]:
        """:func:`get_reward` of buying ``s``'s product with ``s``'s options for the current goal,
        from the catalog's shared cache (a pure function of the goal, the product, the options
        and the noun parser; the trees of a batch buy the same products again and again)."""
        key = (self._goal_task, s.product, s.options, self.noun_parser)
        cache = self.catalog.reward_cache
        found = cache.get(key)
        if found is None:
            product = self.catalog.products[s.product]
            found = get_reward(product, self._goal, self.catalog.prices[s.product], dict(s.options), self.noun_parser)
            if len(cache) >= PAGE_CACHE_SIZE:
                cache.clear()
            cache[key] = found
        return found

    def _invalid(self, action: str, why: str) -> tuple[str, float, bool, dict[str, Any]]:
        obs, info = self._render(self._session)
        shown = action if len(action) <= 80 else action[:77] + "..."
        info["invalid_action"] = True
        return f"Invalid action {shown!r}: {why}.\n{obs}", self.rewards.invalid, False, info

    # ---- expert and sampling -------------------------------------------------------------
    def expert_queries(self) -> list[str]:
        """The queries the expert tries, in order: the instruction's phrases (the start page's
        candidates under ``"instruction"``), with ``"upstream-il"`` also its candidates, then the
        goal product's title (which only the expert knows)."""
        goal = self._goal
        queries = instruction_queries(goal["instruction_text"])
        if self.search_actions == "upstream-il":
            queries += [a[len("search[") : -1] for a in search_candidates("upstream-il", goal)]
        queries.append(goal["name"].lower())
        return list(dict.fromkeys(queries))

    def expert_actions(self) -> list[str]:
        """Buy the goal product with the goal options, found by searching the goal's words.

        Of :meth:`expert_queries`, it searches the one whose results rank the goal product
        highest (the first such on ties, the title only when no other finds it); it then pages
        to it, opens it, selects each goal option and buys. With ``search_actions=
        "instruction"`` its search is an admissible action unless only the title finds the
        product; with ``"free"`` it types its query (behaviour cloning of a choice policy then
        skips that step).
        """
        goal = self._goal
        target = self.catalog.asin_to_index[goal["asin"].lower()]
        product = self.catalog.products[target]
        actions = [] if self._session.page == "start" else ["click[back to search]"]
        *visible, title = self.expert_queries()
        best: tuple[int, str, tuple[int, ...]] | None = None
        for query in [*visible, title]:
            if best is not None and (query == title or best[0] == 0):
                break
            hits = self._hits(query)
            if target in hits and (best is None or hits.index(target) < best[0]):
                best = (hits.index(target), query, hits)
        if best is None:
            raise RuntimeError(f"the goal product {goal['asin']} is not found by its own title")
        _, query, hits = best
        actions.append(f"search[{query}]")
        actions += ["click[next >]"] * (hits.index(target) // pages.PRODUCTS_PER_PAGE)
        actions.append(f"click[{product['asin'].lower()}]")
        for value in self._goal_option_values(product):
            actions.append(f"click[{value}]")
        actions.append("click[buy now]")
        return actions

    def _goal_option_values(self, product: dict[str, Any]) -> list[str]:
        wanted = self._goal["goal_options"]
        values = list(wanted.values()) if isinstance(wanted, dict) else list(wanted)
        available = [v for vs in product["options"].values() for v in vs]
        chosen = []
        for value in (str(v).lower() for v in values):
            if value in available:
                chosen.append(value)
                continue
            # human goals name options in free text: take the closest value (fuzzy > 85)
            best = max(available, key=lambda a: token_set_ratio(a, value), default=None)
            if best is not None and token_set_ratio(best, value) > 85:
                chosen.append(best)
        return chosen

    def sample_action(self, rng: np.random.Generator) -> str:
        """A random admissible action (or a random search when none is listed)."""
        _, info = self._render(self._session)
        actions = info["admissible_actions"] or ["search[product]"]
        return actions[int(rng.integers(len(actions)))]
