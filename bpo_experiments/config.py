"""``bpo-compare``'s configuration: a YAML file, the preset it starts from, and the flags over it.

One comparison's configuration is resolved here, once, in this order (a later source wins):

1. the base preset (``preset:`` in the file, else ``--preset`` / ``--smoke``, else ``cpu``);
2. the file (``--config FILE.yaml``): every key but ``preset`` and ``import`` is a
   :class:`~bpo_experiments.presets.Preset` field, merged over the base's (a dataclass field
   such as ``trainer`` or ``tuning`` field by field, ``envs`` env by env, ``options`` and
   ``tuning.grids`` kind by kind; a list of env names under ``envs`` picks the base's envs);
3. the flags (:mod:`bpo_experiments.command_line`): every ``bpo-compare`` flag overrides the file;
4. the pins: an algorithm option the user set (a ``--KIND.OPTION`` flag, or the file's
   ``tuning.pinned``) is recorded in :attr:`~bpo_experiments.tuning.TuningConfig.pinned` and
   applied to every env's options, so that tuning tunes the rest of its grid and never replaces
   it (:meth:`~bpo_experiments.tuning.TuningConfig.grid`).

The result, the :class:`~bpo_experiments.presets.Preset` as the user asked for it (tuning grids
and pinned values, not the tuning's choices: those are in ``results.json`` and are found again
by the same tuning seeds), is written to every results folder as ``config.yaml``
(:func:`config_yaml`), and ``bpo-compare --config DIR/config.yaml --out NEW`` runs it again;
``--print-config`` prints it without running. Each run's resolved
:class:`~bpo_experiments.run_config.RunConfig` stays in its own ``config.json``. The file format:
docs/main-job.md, "The configuration file".
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import importlib.util
import types
import typing
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import yaml

from bpo_algos.algorithm import Options
from bpo_algos.compute import Budget
from bpo_algos.memory_plan import check_preset_fits
from bpo_algos.policy.base import check_entropy_mode
from bpo_algos.registry import registered_algorithms
from bpo_envs.prompting import PromptConfig
from bpo_experiments.command_line import (
    add_config_flags,
    apply_data_sources,
    apply_flags,
    apply_tuning_flags,
    check_comparison,
    check_tuning_setting,
    option_flags,
)
from bpo_experiments.flags import given
from bpo_experiments.presets import (
    ENV_SETTINGS,
    PRESETS,
    RUN_FIELDS,
    EnvSetup,
    Preset,
    preset_dict,
    with_env_settings,
    with_server,
)
from bpo_experiments.run_config import comparison_config, option_classes
from bpo_experiments.tuning import TuningConfig

CONFIG_FILE = "config.yaml"
"""The comparison's configuration in its results folder (:func:`config_yaml`)."""

DEFAULT_PRESET = "cpu"
"""The base preset when neither the file nor a flag names one."""

FILE_KEYS = ("preset", "import")
"""The file's keys that are not :class:`~bpo_experiments.presets.Preset` fields: the base
preset's name and the modules imported first (``--import``)."""


@dataclass
class CompareConfig:
    """The whole configuration of one ``bpo-compare``: what ``config.yaml`` holds.

    ``__post_init__`` derives and cross-checks: the base preset must exist, and every pinned
    option (:attr:`~bpo_experiments.tuning.TuningConfig.pinned`) is applied to the options of
    every env, so that a pin named only in the file holds as a flag's does.
    """

    preset: str
    """The base preset's name (``PRESETS``): the settings the file and the flags start from,
    and the name its checks use (a gpu preset's SWE-bench data, its memory plan)."""
    settings: Preset
    """Every setting of the comparison, resolved."""
    imports: tuple[str, ...] = ()
    """Modules imported first: they register a user's algorithms (``--import``)."""
    pinned: dict[str, dict[str, Any]] = field(default_factory=dict)
    """The algorithm options the user set (``--KIND.OPTION``), per kind: pinned on a tuned env."""

    def __post_init__(self) -> None:
        if self.preset not in PRESETS:
            raise ValueError(f"preset {self.preset!r}: one of {', '.join(sorted(PRESETS))}")
        self.imports = tuple(self.imports)
        tuning = self.settings.tuning
        if tuning is not None:
            for kind, options in self.pinned.items():
                tuning.pinned[kind] = {**tuning.pinned.get(kind, {}), **options}
            pin_options(self.settings, tuning.pinned)

    def to_data(self) -> dict[str, Any]:
        """The configuration as plain data, the base preset's name and the imports first."""
        data = preset_dict(self.settings)
        # the trainer fields the main job sets per run are no setting (a flag neither)
        data["trainer"] = {k: v for k, v in data["trainer"].items() if k not in RUN_FIELDS}
        return {"preset": self.preset, "import": list(self.imports), **data}


def pin_options(preset: Preset, pinned: dict[str, dict[str, Any]]) -> None:
    """Set every pinned option (``{kind: {option: value}}``) in ``preset``'s options of that kind
    and in every env's own options of that kind."""
    classes = option_classes()
    for kind, values in pinned.items():
        if kind not in classes:
            raise ValueError(f"pinned options of {kind!r}: no algorithm kind of that name (kinds: {', '.join(sorted(classes))})")
        unknown = sorted(set(values) - set(classes[kind].field_names()))
        if unknown:
            raise ValueError(f"pinned options {values} of {kind!r}: {unknown} are not {classes[kind].__name__} fields")
        if not values:
            continue
        preset.options[kind] = replace(preset.options.get(kind) or classes[kind](), **values)
        for setup in preset.envs.values():
            if kind in setup.options:
                setup.options[kind] = replace(setup.options[kind], **values)


# -- the file -------------------------------------------------------------------------------


def read_config_file(path: str | Path) -> dict[str, Any]:
    """The YAML mapping of ``path`` (a clear error for a missing file, bad YAML or a non-mapping)."""
    try:
        text = Path(path).read_text()
    except OSError as exc:
        raise SystemExit(f"--config {path}: {exc.strerror or exc}") from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise SystemExit(f"--config {path}: not YAML ({exc})") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise SystemExit(f"--config {path}: a mapping of settings (preset: NAME, seeds: [...], ...), got a {type(data).__name__}")
    return data


def config_yaml(config: CompareConfig) -> str:
    """``config.yaml``: the configuration as YAML, with a header saying how to run it."""
    header = (
        "# bpo-compare's configuration, as given (tuning's choices are in results.json; the same tuning seeds find them).\n"
        "# Run it again: bpo-compare --config THIS_FILE --out NEW_FOLDER; flags override it (docs/main-job.md,\n"
        "# \"The configuration file\").\n"
    )
    return header + yaml.dump(config.to_data(), Dumper=_Dumper, sort_keys=False, default_flow_style=False, width=120)


class _Dumper(yaml.SafeDumper):
    """YAML as a person edits it: mappings in blocks (one setting a line), lists and mappings
    of plain values on one line (``seeds: [0, 1]``, a tuning candidate ``{group_size: 4}``)."""


def _flow_if_flat(dumper: yaml.SafeDumper, value: Any, tag: str, flow: Any) -> yaml.Node:
    items = value.values() if isinstance(value, dict) else value
    flat = all(not isinstance(v, dict | list) for v in items)
    if tag == "list":
        return dumper.represent_sequence("tag:yaml.org,2002:seq", value, flow_style=flat)
    return dumper.represent_mapping("tag:yaml.org,2002:map", value, flow_style=flat and flow)


_Dumper.add_representer(list, lambda d, v: _flow_if_flat(d, v, "list", True))
_Dumper.add_representer(dict, lambda d, v: _flow_if_flat(d, v, "dict", len(v) <= 4 and len(str(v)) < 80))


def settings_from_data(data: dict[str, Any], base: Preset) -> Preset:
    """``base`` with the file's settings ``data`` (Preset fields) merged over it (module
    docstring); an unknown key or a value its field refuses is a ``ValueError`` naming it."""
    hints = typing.get_type_hints(Preset)
    unknown = sorted(set(data) - set(hints) - set(ENV_SETTINGS))
    if unknown:
        raise ValueError(f"{unknown} are not settings (Preset fields: {', '.join(sorted(hints))}; per-env settings: "
                         f"{', '.join(ENV_SETTINGS)}; and {', '.join(FILE_KEYS)})")
    out = copy.deepcopy(base)
    for key, value in data.items():
        if key in ENV_SETTINGS:
            continue
        if key == "envs":
            out.envs = _envs(value, base.envs)
        elif key == "trainer":
            per_run = sorted(set(value or {}) & set(RUN_FIELDS)) if isinstance(value, dict) else []
            if per_run:
                raise ValueError(f"trainer: {per_run} are set per run by the main job (the seeds, budgets and folders of "
                                 "the comparison), not in the configuration")
            out.trainer = _merge(base.trainer, value, "trainer")
        elif key == "shared":
            out.shared = _merge(base.shared, value, "shared")
        elif key == "options":
            out.options = _options(value, base.options, "options")
        elif key == "tuning":
            out.tuning = None if value is None else _tuning(value, base.tuning)
        else:
            setattr(out, key, _typed(hints[key], value))
    # a per-env setting at the top (every env's; ``{env: value}`` as files of earlier versions
    # write them), under what an env of the file sets itself
    every = {k: _typed(_ENV_HINTS[k] | dict[str, _ENV_HINTS[k]], v) for k, v in data.items() if k in ENV_SETTINGS}
    if every:
        own = {name: set(fields or {}) for name, fields in data["envs"].items()} if isinstance(data.get("envs"), dict) else {}
        converted = with_env_settings(out.envs, every)
        out.envs = {name: replace(converted[name], **{k: getattr(setup, k) for k in own.get(name, ()) if k in every})
                    for name, setup in out.envs.items()}
    return out


_ENV_HINTS = typing.get_type_hints(EnvSetup)


def _typed(hint: Any, value: Any) -> Any:
    """``value`` (YAML data) as a field of type ``hint`` holds it: tuples for tuple types (also
    inside a per-env ``dict[str, tuple[...]]``)."""
    if isinstance(value, list) and _has_tuple(hint):
        return tuple(value)
    if isinstance(value, dict) and _has_tuple(hint):
        return {k: tuple(v) if isinstance(v, list) else v for k, v in value.items()}
    return value


def _has_tuple(hint: Any) -> bool:
    if typing.get_origin(hint) is tuple or hint is tuple:
        return True
    if typing.get_origin(hint) in (typing.Union, types.UnionType, dict):
        return any(_has_tuple(part) for part in typing.get_args(hint))
    return False


def _merge(base: Any, value: Any, where: str) -> Any:
    """Dataclass ``base`` with the fields in mapping ``value`` (typed as :func:`_typed` does)."""
    if not isinstance(value, dict):
        raise ValueError(f"{where}: a mapping of {type(base).__name__} fields, got {value!r}")
    hints = typing.get_type_hints(type(base))
    unknown = sorted(set(value) - {f.name for f in dataclasses.fields(base)})
    if unknown:
        raise ValueError(f"{where}: {unknown} are not {type(base).__name__} fields")
    return replace(base, **{k: _typed(hints[k], v) for k, v in value.items()})


def _options(value: Any, base: dict[str, Options], where: str) -> dict[str, Options]:
    """``{kind: Options}`` from ``{kind: {option: value}}``, each merged over ``base``'s."""
    if not isinstance(value, dict):
        raise ValueError(f"{where}: a mapping of algorithm kinds to their options, got {value!r}")
    classes = option_classes()
    out = dict(base)
    for kind, fields in value.items():
        if kind not in classes:
            raise ValueError(f"{where}: {kind!r} is no algorithm kind with options (kinds: {', '.join(sorted(classes))})")
        out[kind] = _merge(base.get(kind) or classes[kind](), fields or {}, f"{where}.{kind}")
    return out


def _envs(value: Any, base: dict[str, EnvSetup]) -> dict[str, EnvSetup]:
    """The envs of the comparison: a list of the base's names, or ``{name: EnvSetup fields}``,
    each merged over the base's env of that name (a new name needs its ``env_id``)."""
    if isinstance(value, list):
        unknown = [e for e in value if e not in base]
        if unknown:
            raise ValueError(f"envs: {unknown} are not envs of the base preset ({sorted(base)}); give their settings")
        return {e: copy.deepcopy(base[e]) for e in value}
    if not isinstance(value, dict) or not value:
        raise ValueError(f"envs: a list of env names or a mapping of env names to their settings, got {value!r}")
    hints = typing.get_type_hints(EnvSetup)
    out: dict[str, EnvSetup] = {}
    for name, fields in value.items():
        fields = dict(fields or {})
        options = fields.pop("options", None)
        if name in base:
            setup = _merge(base[name], fields, f"envs.{name}")
        else:
            unknown = sorted(set(fields) - set(hints))
            if unknown or "env_id" not in fields:
                raise ValueError(f"envs.{name}: a new env needs its env_id and EnvSetup fields only (unknown: {unknown})")
            setup = EnvSetup(**{k: _typed(hints[k], v) for k, v in fields.items()})
        if options is not None:
            setup.options = _options(options, setup.options, f"envs.{name}.options")
        out[name] = setup
    return out


def _tuning(value: Any, base: TuningConfig | None) -> TuningConfig:
    """A :class:`TuningConfig` from the file's ``tuning`` mapping, over ``base``'s (its
    ``grids`` and ``pinned`` kind by kind)."""
    if not isinstance(value, dict):
        raise ValueError(f"tuning: a mapping of TuningConfig fields or null (no tuning), got {value!r}")
    start = copy.deepcopy(base) if base is not None else TuningConfig()
    fields = dict(value)
    grids = fields.pop("grids", None)
    pinned = fields.pop("pinned", None)
    out = _merge(start, fields, "tuning")
    if grids is not None:
        if not isinstance(grids, dict):
            raise ValueError(f"tuning.grids: a mapping of kinds to lists of candidates, got {grids!r}")
        out.grids = {**out.grids, **{kind: tuple(grid or ()) for kind, grid in grids.items()}}
    if pinned is not None:
        if not isinstance(pinned, dict) or not all(isinstance(v, dict) for v in pinned.values()):
            raise ValueError(f"tuning.pinned: a mapping of kinds to {{option: value}}, got {pinned!r}")
        out.pinned = {**out.pinned, **{kind: dict(v) for kind, v in pinned.items()}}
    return out


# -- resolution -----------------------------------------------------------------------------


def _defaults(setup: EnvSetup) -> EnvSetup:
    """``setup`` with its :data:`~bpo_experiments.presets.ENV_SETTINGS` at their defaults."""
    return replace(setup, **{f.name: f.default for f in dataclasses.fields(EnvSetup) if f.name in ENV_SETTINGS})


def base_name(args: argparse.Namespace, data: dict[str, Any]) -> str:
    """The base preset's name: the file's ``preset``, else ``--smoke`` / ``--preset``, else
    :data:`DEFAULT_PRESET` (a flag naming another preset than the file is an error)."""
    flag = "smoke" if getattr(args, "smoke", False) else getattr(args, "preset", None)
    named = data.get("preset")
    if named is not None and flag is not None and flag != named:
        raise SystemExit(f"--config starts from the {named} preset and {'--smoke' if flag == 'smoke' else '--preset ' + flag} "
                         "names another: choose one")
    name = named or flag or DEFAULT_PRESET
    if name not in PRESETS:
        raise SystemExit(f"preset {name!r}: one of {', '.join(sorted(PRESETS))}")
    return name


def resolve(args: argparse.Namespace, holders: dict[str, dict[str, str]] | None = None) -> CompareConfig:
    """The comparison's :class:`CompareConfig` from ``--config``, the base preset and the flags
    (module docstring), checked: a bad setting is an error (``SystemExit``) before any run."""
    data = read_config_file(args.config) if getattr(args, "config", None) else {}
    name = base_name(args, data)
    try:
        preset = settings_from_data({k: v for k, v in data.items() if k not in FILE_KEYS}, PRESETS[name])
    except (TypeError, ValueError) as exc:
        raise SystemExit(f"--config {args.config}: {exc}") from None
    imports = data.get("import") or ()
    holders = holders if holders is not None else add_config_flags(argparse.ArgumentParser())
    if args.envs:
        unknown = [e for e in args.envs if e not in preset.envs and e not in PRESETS["gpu"].envs]
        if unknown:
            raise SystemExit(f"unknown env(s) {unknown}; known: {sorted(set(preset.envs) | set(PRESETS['gpu'].envs))}")
        # an env of the gpu presets joins with its setup and the settings' defaults (its seeds, evaluation, probes)
        preset.envs = {e: preset.envs.get(e) or _defaults(PRESETS["gpu"].envs[e]) for e in args.envs}
    if args.algorithms:
        known = registered_algorithms()
        unknown = [a for a in args.algorithms if a not in known]
        if unknown:
            raise SystemExit(f"unknown algorithm(s) {unknown}; registered: {known} (a user's algorithm: --import MODULE)")
        preset.algorithms = tuple(args.algorithms)
    if args.treatment:
        preset.treatment = args.treatment
    if preset.treatment not in preset.algorithms:
        raise SystemExit(f"--treatment {preset.treatment!r} is not among the algorithms {list(preset.algorithms)}")
    if args.algorithms and preset.competitors is not None:
        # the preset's competitors that are still trained (an explicit list changes what is compared)
        preset.competitors = tuple(b for b in preset.competitors if b in preset.algorithms) or None
    apply_flags(preset, args, holders)
    for url in args.env_server or ():
        preset.envs = with_server(preset.envs, url)
    check_comparison(preset)
    apply_tuning_flags(preset, args)
    try:  # the options the user set are pinned (on a tuned env), then the tuning setting is checked
        config = CompareConfig(name, preset, tuple(dict.fromkeys((*imports, *(args.import_modules or ())))),
                               option_flags(args, holders))
    except (TypeError, ValueError) as exc:
        raise SystemExit(f"bpo-compare: {exc}") from exc
    for wanted, package in ((preset.trainer.tensorboard, "tensorboard"), (preset.trainer.wandb_project, "wandb")):
        if wanted and importlib.util.find_spec(package) is None:  # fail before hours of training, not after
            raise SystemExit(f"logging to {package} needs `pip install {package}`")
    base = PRESETS[name]
    named = data.get("envs") if isinstance(data.get("envs"), dict) else {}  # (a list names envs only)
    budget_set = "budget" in given(args, holders["envs"]) or bool(data.get("budget")) or any(
        isinstance(own, dict) and own.get("budget") for own in named.values())
    if not budget_set and preset.budget_unit != base.budget_unit:
        raise SystemExit(
            f"the {name} preset's budgets are in {base.budget_unit}; with --budget-unit {preset.budget_unit} "
            f"give --budget in {preset.budget_unit}"
        )
    missing = [e for e, setup in preset.envs.items() if setup.budget is None]
    if missing:
        raise SystemExit(
            f"no {preset.budget_unit} budget for env(s) {missing} in the {name} preset; give --budget in {preset.budget_unit}"
        )
    try:
        Budget(preset.budget_unit, 1)  # validates the unit
    except ValueError as exc:
        raise SystemExit(f"--budget-unit: {exc}") from exc
    check_tuning_setting(preset)
    apply_data_sources(preset, args, name)
    try:  # every env's settings resolve (run_config's checks); a GPU preset fits its GPUs (bpo-memory-plan)
        check_entropy_mode(preset.decision_entropy, preset.probe_samples)
        try:
            PromptConfig(layout=preset.prompt_layout)
        except ValueError as exc:
            raise ValueError(f"--prompt-layout: {exc}") from exc
        check_preset_fits(comparison_config(preset), name)
    except ValueError as exc:
        raise SystemExit(str(exc)) from exc
    return config


def build_preset(args: argparse.Namespace, holders: dict[str, dict[str, str]] | None = None) -> Preset:
    """The resolved settings (:func:`resolve`). ``args.preset`` and ``args.import_modules`` are
    set to the resolved base preset's name and imports (the file's with the flag's), which
    :func:`config_of` reads back."""
    config = resolve(args, holders)
    args.preset, args.import_modules = config.preset, list(config.imports)
    return config.settings


def config_of(args: argparse.Namespace, preset: Preset) -> CompareConfig:
    """The :class:`CompareConfig` of settings ``preset`` that :func:`build_preset` resolved from ``args``."""
    return CompareConfig(args.preset, preset, tuple(args.import_modules or ()))


def file_imports(argv: list[str] | None) -> tuple[str, ...]:
    """The modules a ``--config`` file in ``argv`` imports (its ``import``), read before the
    flags are parsed: they register algorithms, and so flags of their options."""
    early = argparse.ArgumentParser(add_help=False)
    early.add_argument("--config")
    path = early.parse_known_args(argv)[0].config
    if not path:
        return ()
    imports = read_config_file(path).get("import") or ()
    if isinstance(imports, str) or not all(isinstance(m, str) for m in imports):
        raise SystemExit(f"--config {path}: import: a list of module names, got {imports!r}")
    return tuple(imports)


__all__ = ["CONFIG_FILE", "CompareConfig", "build_preset", "config_of", "config_yaml", "file_imports", "pin_options",
           "read_config_file", "resolve", "settings_from_data"]
