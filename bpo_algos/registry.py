"""Named algorithms, so that a comparison can name a user's algorithm beside the built-in ones.

A name maps to an :class:`AlgorithmFactory`: it builds the algorithm from keyword options and
declares which options those are (the kind whose ``Options`` dataclass, ``Preset.options``
entry and ``--KIND.OPTION`` flags it takes; the options a variant fixes; for a control, the
algorithm it wraps), so the main job asks it and never probes. Algorithms are found in two ways:

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
      from bpo_algos.registry import Variant

      register_algorithm("rloo-16", Variant(RLOO, group_size=16))  # takes --rloo.* but group_size

The object registered is an :class:`AlgorithmFactory`, an :class:`~bpo_algos.algorithm.Algorithm`
subclass (its own kind: ``Variant(cls)``; a ``functools.partial`` of one: the ``Variant`` fixing
its keywords), or any callable ``factory(**options) -> Algorithm``
with its options dataclass given as ``options=`` (its kind is then its name: ``--NAME.OPTION``;
without ``options=`` it takes the shared options only).

Advantage estimators are found the same way (group ``bpo_algos.advantages``; see
:mod:`bpo_algos.advantages`). Entry points are loaded on the first lookup or registration.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from functools import partial
from types import MappingProxyType
from typing import Any

from bpo_algos.algorithm import Algorithm, NoOptions, Options
from bpo_algos.plugins import ALGORITHM_GROUP, PROJECT, add_named, load_entry_points


class AlgorithmFactory:
    """Base class of what the registry holds under a name: ``factory(**options) -> Algorithm``,
    and the declaration of which options it takes.

    The main job builds a registered algorithm with the shared options
    (:class:`~bpo_algos.algorithm.AlgorithmConfig`), the ``seed`` and, where :attr:`kind` is
    set, that kind's own options (``Preset.options[kind]``, set by ``--KIND.OPTION``) but those
    in :attr:`fixed`; a control (:meth:`wraps`) takes the options of the algorithm it wraps.
    """

    kind: str | None = None
    """The kind of algorithm whose own options this factory takes (``bpo-anchored``: ``"bpo"``);
    None: the shared options only."""
    Options: type[Options] = NoOptions
    """That kind's options dataclass."""
    fixed: Mapping[str, Any] = MappingProxyType({})
    """Options of that kind this factory fixes (``bpo-anchored``: ``baseline``): never taken
    from a preset."""

    def __call__(self, **options: Any) -> Algorithm:
        raise NotImplementedError

    def wraps(self, options: Options) -> str | None:
        """A control that collects as another registered algorithm (``frozen``): that
        algorithm's name, given this factory's own options (:attr:`Options`); None otherwise."""
        return None


class Variant(AlgorithmFactory):
    """An :class:`~bpo_algos.algorithm.Algorithm` subclass with some options fixed:
    ``Variant(BPO, baseline="anchored")`` takes BPO's options (kind ``"bpo"``) but ``baseline``."""

    def __init__(self, cls: type[Algorithm], **fixed: Any) -> None:
        unknown = sorted(set(fixed) - set(cls.Options.field_names()))
        if unknown:
            raise TypeError(f"Variant({cls.__name__}): {unknown} are not {cls.Options.__name__} fields")
        self.cls = cls
        self.kind = cls.name
        self.Options = cls.Options
        self.fixed = MappingProxyType(dict(fixed))

    def __call__(self, **options: Any) -> Algorithm:
        return self.cls(**{**self.fixed, **options})

    def __repr__(self) -> str:
        fixed = "".join(f", {k}={v!r}" for k, v in self.fixed.items())
        return f"Variant({self.cls.__name__}{fixed})"


@dataclass(frozen=True)
class Declared(AlgorithmFactory):
    """A plain callable ``build(**options) -> Algorithm`` with the kind and the options dataclass
    it takes declared beside it (:func:`register_algorithm`'s ``options=``)."""

    build: Callable[..., Algorithm]
    kind: str | None = None
    Options: type[Options] = NoOptions

    def __call__(self, **options: Any) -> Algorithm:
        return self.build(**options)


def as_factory(obj: Any) -> AlgorithmFactory:
    """``obj`` (what was registered) as an :class:`AlgorithmFactory`: itself, an ``Algorithm``
    subclass as ``Variant(obj)``, a ``functools.partial`` of one (keywords only) as the
    ``Variant`` that fixes those keywords, any other callable as one that takes the shared
    options only."""
    if isinstance(obj, AlgorithmFactory):
        return obj
    if isinstance(obj, type) and issubclass(obj, Algorithm):
        return Variant(obj)
    if isinstance(obj, partial) and not obj.args and isinstance(obj.func, type) and issubclass(obj.func, Algorithm):
        return Variant(obj.func, **obj.keywords)
    return Declared(obj)


_ALGORITHMS: dict[str, AlgorithmFactory] = {}


def register_algorithm(name: str, factory: Callable[..., Algorithm], *, options: type[Options] | None = None,
                       overwrite: bool = False) -> Callable[..., Algorithm]:
    """Register ``factory`` under ``name`` (a non-empty string without spaces).

    ``factory`` is an :class:`AlgorithmFactory`, an ``Algorithm`` subclass, or any callable
    ``factory(**options) -> Algorithm``; ``options=`` declares the dataclass of a callable's own
    options (its kind is then ``name``: ``bpo-compare --NAME.OPTION``). Registering a taken name
    raises unless ``overwrite=True``. Returns ``factory``, so it also works as a decorator:
    ``@functools.partial(register_algorithm, "mine")``.
    """
    _load()
    if options is not None:
        if isinstance(factory, AlgorithmFactory) or (isinstance(factory, type) and issubclass(factory, Algorithm)):
            raise TypeError(f"{name!r}: options= is for a plain callable; {factory!r} declares its own options")
        if not (isinstance(options, type) and issubclass(options, Options)):
            raise TypeError(f"{name!r}: options= must be an Options dataclass, got {options!r}")
    add_named(_ALGORITHMS, "algorithm", name, factory, overwrite=overwrite)  # checks the name and that it is callable
    _ALGORITHMS[name] = Declared(factory, name, options) if options is not None else as_factory(factory)
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
    load_entry_points(ALGORITHM_GROUP, _ALGORITHMS, "algorithm", convert=as_factory)
