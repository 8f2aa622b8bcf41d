"""Named algorithms, so that a comparison can name a user's algorithm beside the built-in ones.

A *factory* is any callable ``factory(**options) -> Algorithm``. The main job calls it with the
options shared by every algorithm (``seed``, ``aggregation``, ``max_parallel_trees``, and the
loss options ``clip_eps``/``kl_coef`` where the preset sets them) plus that algorithm's own
options from the preset (``Preset.algorithm_options[name]``)::

    from bpo_algos import RLOO, register_algorithm

    register_algorithm("rloo-16", lambda **options: RLOO(group_size=16, **options))
    # bpo-compare --algorithms bpo rloo rloo-16  (with the registering module imported,
    # e.g. `bpo-compare --import mypkg.algos`)
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from bpo_algos.checks import add_named

if TYPE_CHECKING:
    from bpo_algos.algorithm import Algorithm

AlgorithmFactory = Callable[..., "Algorithm"]

_ALGORITHMS: dict[str, AlgorithmFactory] = {}


def register_algorithm(name: str, factory: AlgorithmFactory, *, overwrite: bool = False) -> AlgorithmFactory:
    """Register ``factory`` under ``name`` (a non-empty string without spaces).

    Registering a taken name raises unless ``overwrite=True``. Returns ``factory``, so it also
    works as a decorator: ``@functools.partial(register_algorithm, "mine")``.
    """
    add_named(_ALGORITHMS, "algorithm", name, factory, overwrite=overwrite)
    return factory


def registered_algorithms() -> list[str]:
    """The registered names, in registration order (built-ins first)."""
    _load_builtins()
    return list(_ALGORITHMS)


def algorithm_factory(name: str) -> AlgorithmFactory:
    """The factory registered as ``name``."""
    _load_builtins()
    if name not in _ALGORITHMS:
        raise ValueError(f"unknown algorithm {name!r}; registered: {', '.join(_ALGORITHMS)}")
    return _ALGORITHMS[name]


def factory_parameters(factory: Any) -> set[str]:
    """The keyword parameters ``factory`` names (empty for a bare ``**options`` factory or a
    callable without a signature): the shared options the main job passes it."""
    import inspect

    try:
        parameters = inspect.signature(factory).parameters.values()
    except (TypeError, ValueError):
        return set()
    return {p.name for p in parameters if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)}


def make_algorithm(name: str, **options: Any) -> Algorithm:
    """Build the algorithm registered as ``name`` with ``options``."""
    return algorithm_factory(name)(**options)


def _load_builtins() -> None:
    # the built-ins register themselves on import; importing here (not at module top) keeps
    # this module importable from the algorithm modules without a cycle
    import baselines  # noqa: F401
    import bpo_algos.bpo  # noqa: F401
    import bpo_algos.controls  # noqa: F401
