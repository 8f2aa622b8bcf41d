"""Named algorithms, so that a comparison can name a user's algorithm beside the built-in ones.

A *factory* is any callable ``factory(**options) -> Algorithm``. Algorithms are found in two
ways:

* **entry points** of the group ``bpo_algos.algorithms`` of every installed distribution (the
  name is the algorithm's, the object its factory): the built-in ones (BPO, and GRPO, RLOO,
  GiGPO, Tree-GRPO of the ``baselines`` package) are declared so in this project's
  ``pyproject.toml``, and a pip-installed package joins ``bpo-compare`` the same way::

      [project.entry-points."bpo_algos.algorithms"]
      rloo-16 = "mypkg.algos:rloo16"

* :func:`register_algorithm` at run time (``bpo-compare --import MODULE`` imports an
  unpackaged module that calls it)::

      from baselines import RLOO
      from bpo_algos import register_algorithm

      register_algorithm("rloo-16", lambda **options: RLOO(group_size=16, **options))

Advantage estimators are found the same way (group ``bpo_algos.advantages``; see
:mod:`bpo_algos.advantages`). Entry points are loaded on the first lookup or registration.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from bpo_algos.plugins import ALGORITHM_GROUP, PROJECT, add_named, load_entry_points

if TYPE_CHECKING:
    from bpo_algos.algorithm import Algorithm

AlgorithmFactory = Callable[..., "Algorithm"]

_ALGORITHMS: dict[str, AlgorithmFactory] = {}


def register_algorithm(name: str, factory: AlgorithmFactory, *, overwrite: bool = False) -> AlgorithmFactory:
    """Register ``factory`` under ``name`` (a non-empty string without spaces).

    Registering a taken name raises unless ``overwrite=True``. Returns ``factory``, so it also
    works as a decorator: ``@functools.partial(register_algorithm, "mine")``.
    """
    _load()
    add_named(_ALGORITHMS, "algorithm", name, factory, overwrite=overwrite)
    return factory


def registered_algorithms() -> list[str]:
    """The registered names: entry points (this project's first), then those registered at
    run time, in order."""
    _load()
    return list(_ALGORITHMS)


def algorithm_factory(name: str) -> AlgorithmFactory:
    """The factory registered as ``name``."""
    _load()
    if name not in _ALGORITHMS:
        hint = "" if "bpo" in _ALGORITHMS else (
            f" (no built-in algorithm: the {ALGORITHM_GROUP!r} entry points of {PROJECT} are missing; "
            "install the package, e.g. pip install -e .)"
        )
        raise ValueError(f"unknown algorithm {name!r}; registered: {', '.join(_ALGORITHMS) or 'none'}{hint}")
    return _ALGORITHMS[name]


def make_algorithm(name: str, **options: Any) -> Algorithm:
    """Build the algorithm registered as ``name`` with ``options``."""
    return algorithm_factory(name)(**options)


def _load() -> None:
    load_entry_points(ALGORITHM_GROUP, _ALGORITHMS, "algorithm")
