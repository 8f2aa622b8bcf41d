"""``BPO-WebShop-v0``: the WebShop text environment, offline, with native snapshots.

``WebShopEnv`` (the registered entry point) runs over the user's upstream WebShop data files
(``data_dir=``) or a bundled, deterministically generated catalog in the same schema. See
:mod:`bpo_envs.webshop.env` for the behaviour, :mod:`.data` for the files, goals and splits,
:mod:`.reward` for the score, :mod:`.search` for the BM25 index and :mod:`.generator` for the
bundled catalog.
"""

from bpo_envs.webshop.data import Catalog, WebShopDataError, get_catalog
from bpo_envs.webshop.env import REWARD_SETTINGS, VERL_AGENT_REWARD, WebShopEnv, parse_action
from bpo_envs.webshop.generator import generate_catalog, write_catalog
from bpo_envs.webshop.queries import DEFAULT_SEARCH_ACTIONS, SEARCH_ACTIONS, instruction_queries
from bpo_envs.webshop.reward import get_reward

__all__ = [
    "DEFAULT_SEARCH_ACTIONS",
    "REWARD_SETTINGS",
    "SEARCH_ACTIONS",
    "VERL_AGENT_REWARD",
    "Catalog",
    "WebShopDataError",
    "WebShopEnv",
    "generate_catalog",
    "get_catalog",
    "get_reward",
    "instruction_queries",
    "parse_action",
    "write_catalog",
]
