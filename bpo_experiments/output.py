"""The output folder of ``bpo-compare``: where each job keeps its files, and the resume checks.

``--out`` holds ``preset.json``, ``data.json``, ``sessions.json`` (one entry per invocation) and
``runs/ENV/`` with each env's ``setting.json``, its initial jobs (``_initial/seedS/``) and its runs
(``ALGORITHM/seedS/config.json``, the run's :class:`~bpo_experiments.run_config.RunConfig`,
``run.json`` and the files a run writes along the way). A resumed comparison must hold the same
setting and the same data per env (:func:`check_same_settings`, :func:`check_same_data`) and
each run the same configuration (:func:`~bpo_experiments.run_config.check_same_config`); a
finished job's file is read back instead of running it again.
"""

from __future__ import annotations

import dataclasses
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

from bpo_algos import data_parallel as dp
from bpo_envs.files import (
    atomic_write,
    read_json_or_redo,
    write_json,
)
from bpo_envs.sealed import SealError, seal, unseal
from bpo_experiments.presets import (
    ENV_SETTINGS,
    PER_ENV_FIELDS,
    EnvSetup,
    Preset,
    preset_dict,
)
from bpo_experiments.tuning import TuningConfig


def run_dir(out: Path, env: str, algorithm: str, seed: int) -> Path:
    return out / "runs" / env / algorithm / f"seed{seed}"


def initial_dir(out: Path, env: str, seed: int) -> Path:
    """Where the (env, seed)'s initial job keeps its result (``initial.json``, ``policy.pt``)."""
    return out / "runs" / env / "_initial" / f"seed{seed}"


def write_on_rank0(path: Path, value: Any) -> None:
    """Write ``value`` atomically; rank 0 only under torchrun (every rank holds the same value)."""
    if dp.rank() != 0:
        return
    write_json(path, value)


_GROWABLE = ("seeds",)
"""Setting keys a resumed comparison may change: each run depends on its own seed, not on the
list, so more seeds join a folder (and seeds left out are not reported)."""


def check_same_settings(out: Path, preset: Preset, saved_preset: dict[str, Any] | None) -> dict[str, dict[str, Any]]:
    """Each env's setting (:func:`env_setting`), after checking it against the one ``out`` was
    made with: cached runs are only valid for the setting that made them, per env (an env added
    to a comparison later joins it, and so do more seeds; a changed one is refused, naming what
    differs)."""
    current = preset_dict(preset)
    settings = {e: env_setting(current, e) for e in preset.envs}
    for env_name in settings:
        path = out / "runs" / env_name / "setting.json"
        saved_setting = read_json_or_redo(path)
        if saved_setting is None and saved_preset is not None and env_name in saved_preset.get("envs", {}):
            saved_setting = env_setting(saved_preset, env_name)  # a folder written before per-env settings
        if saved_setting is None:
            continue
        changed = sorted(k for k in setting_changes(saved_setting, preset, env_name) if k not in _GROWABLE)
        if changed:
            raise SystemExit(
                f"{out} holds a comparison with another setting for {env_name} (differs in: {', '.join(changed)}); choose another --out"
            )
    return settings


def setting_changes(saved_setting: dict[str, Any], preset: Preset, env_name: str) -> dict[str, tuple[Any, Any]]:
    """``{key: (saved, now)}`` for every key of env ``env_name``'s setting (:func:`env_setting`)
    whose value in ``saved_setting`` (a ``setting.json``, or :func:`env_setting` of a saved
    ``preset.json``) differs from ``preset``'s; fields added to :class:`EnvSetup` or
    :class:`~bpo_experiments.tuning.TuningConfig` since count at their defaults, and a removed
    field left at its default sets nothing (:data:`REMOVED_FIELDS`)."""
    saved_setting = dict(saved_setting)
    setting = env_setting(preset_dict(preset), env_name)
    if isinstance(saved_setting.get("envs"), dict):  # fields EnvSetup gained since count at their defaults
        saved_setting["envs"] = {**_env_setup_defaults(), **saved_setting["envs"]}
    if isinstance(saved_setting.get("tuning"), dict):  # and those TuningConfig gained (pinned)
        saved_setting["tuning"] = {**_tuning_defaults(), **saved_setting["tuning"]}
    for key, unset in REMOVED_FIELDS.items():  # a field removed since, left at its default, set nothing
        if saved_setting.get(key, unset) == unset:
            saved_setting.pop(key, None)
    defaults = env_setting(preset_dict(Preset(envs={env_name: preset.envs[env_name]})), env_name)
    return {
        k: (saved_setting.get(k, defaults.get(k)), setting.get(k, defaults.get(k)))
        for k in sorted(set(saved_setting) | set(setting))
        if saved_setting.get(k, defaults.get(k)) != setting.get(k, defaults.get(k))
    }


def check_same_data(out: Path, data: dict[str, Any]) -> None:
    """The same preset on other data (a new generator version, other files) is another setting:
    refuse a folder whose ``data.json`` names other data for an env."""
    previous = out / "data.json"
    saved = read_json_or_redo(previous)
    if saved is None:
        return
    moved = sorted(e for e in data if e in saved and _data_identity(saved[e]) != _data_identity(data[e]))
    if moved:
        raise SystemExit(f"{out} holds a comparison made from other data for {', '.join(moved)} (see {previous}); choose another --out")


def start_session(out: Path, jobs: int, resumed: bool) -> dict[str, Any]:
    """Record this invocation in ``out/sessions.json`` (its start, jobs, the machine's load) and
    return its entry; :func:`note_session` keeps its wall time current, so an interrupted session
    still counts in the total across resumes."""
    entry = {"started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "wall_seconds": 0.0, "jobs": jobs,
             "resume_flag": resumed, "load_start": list(os.getloadavg()), "_t0": time.perf_counter()}
    path = out / "sessions.json"
    sessions = read_json_or_redo(path, [])
    entry["index"] = len(sessions)
    _write_sessions(path, [*sessions, entry])
    return entry


def note_session(out: Path, entry: dict[str, Any] | None) -> list[dict[str, Any]]:
    """Update this session's wall time and load in ``out/sessions.json``; returns every session."""
    path = out / "sessions.json"
    sessions = read_json_or_redo(path, [])
    if entry is not None:
        entry["wall_seconds"] = time.perf_counter() - entry["_t0"]
        entry["load_now"] = list(os.getloadavg())
        sessions = [s for s in sessions if s.get("index") != entry["index"]] + [entry]
        sessions.sort(key=lambda s: s.get("index", 0))
        _write_sessions(path, sessions)
    return [{k: v for k, v in s.items() if not k.startswith("_")} for s in sessions]


def _write_sessions(path: Path, sessions: list[dict[str, Any]]) -> None:
    write_json(path, [{k: v for k, v in s.items() if not k.startswith("_")} for s in sessions], indent=2)


def code_versions(initials: Any, runs: Any, out: Path) -> list[str]:
    """The code versions (:func:`~bpo_algos.run_log.code_version`) that made the initial jobs and
    runs of the comparison in ``out``, sorted (``"unrecorded"`` for results written before
    versions were); a warning when there are several (a folder resumed after the code changed)."""
    made = sorted({i["warm"].get("code", "unrecorded") for i in initials} | {r.get("code", "unrecorded") for r in runs})
    if len(made) > 1:
        print(f"warning: {out} holds results of {len(made)} code versions (a folder resumed after the code changed): "
              f"{'; '.join(made)}. For results of one version, run into a new --out.", file=sys.stderr)
    return made


POLICY_SEAL = "bpo-compare-initial-policy"


def save_initial(folder: Path, value: dict[str, Any]) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    for name in ("policy", "reference"):
        if value[name] is not None:
            # policy.pt pickles a whole policy object: sealed, so only this user's files load
            data = seal(value[name], POLICY_SEAL) if name == "policy" else value[name]
            atomic_write(folder / f"{name}.pt", data)
    write_json(folder / "initial.json", value["warm"])  # last: it marks the job done


def load_initial(folder: Path) -> dict[str, Any] | None:
    """The saved initial job in ``folder``; None when it is to be (re)done."""
    warm = read_json_or_redo(folder / "initial.json")
    if warm is None:
        return None

    def read(name: str) -> bytes | None:
        path = folder / f"{name}.pt"
        return path.read_bytes() if path.exists() else None

    policy = read("policy")
    if policy is not None:
        try:
            policy = unseal(policy, POLICY_SEAL, str(folder / "policy.pt"))
        except SealError as exc:
            print(f"warning: {exc}; redoing it", file=sys.stderr)
            return None
    reference = read("reference")
    if reference is not None:
        problem = reference_problem(reference)
        if problem is not None:
            print(f"warning: {folder / 'reference.pt'} does not load ({problem}); redoing it", file=sys.stderr)
            return None
    return {"warm": warm, "policy": policy, "reference": reference}


def reference_problem(data: bytes) -> str | None:
    """Why ``reference.pt``'s bytes do not load as the reference gradient (tensors only, never
    unpickled), or None when they do."""
    import io

    import torch

    try:
        value = torch.load(io.BytesIO(data), map_location="cpu", weights_only=True)
    except Exception as exc:  # noqa: BLE001 - torch raises many kinds for bad bytes (pickle, zip, EOF)
        text = str(exc).strip()
        return f"{type(exc).__name__}: {text.splitlines()[0][:200] if text else ''}"
    if not isinstance(value, dict) or not {"mean", "signal"} <= set(value):
        return "it holds no reference gradient"
    return None


REMOVED_FIELDS: dict[str, Any] = {"algorithm_options": {}}
"""Preset fields of earlier versions and their default: a folder that left one at its default
resumes; one that set it holds another setting (its options are ``Preset.options`` now)."""


_LOGGING_FIELDS = ("tensorboard", "wandb_project", "wandb_group", "progress")
"""TrainerConfig fields that change where a run logs, not what it computes."""


def _setting(preset: dict[str, Any]) -> dict[str, Any]:
    """A preset's JSON without the logging fields (what a resumed comparison must match), its
    training and shared algorithm settings as ``trainer.FIELD`` / ``shared.FIELD`` keys."""
    out = {k: v for k, v in preset.items() if k not in ("trainer", "shared")}
    out.update({f"trainer.{k}": v for k, v in preset.get("trainer", {}).items() if k not in _LOGGING_FIELDS})
    out.update({f"shared.{k}": v for k, v in preset.get("shared", {}).items()})
    return out


def _env_setup_defaults() -> dict[str, Any]:
    """:class:`EnvSetup`'s defaults as :func:`preset_dict` writes them, but its
    :data:`~bpo_experiments.presets.ENV_SETTINGS` (a setting keeps them beside the setup)."""
    defaults = {f.name: f.default if f.default is not dataclasses.MISSING else f.default_factory()
                for f in dataclasses.fields(EnvSetup)
                if (f.default is not dataclasses.MISSING or f.default_factory is not dataclasses.MISSING)
                and f.name not in ENV_SETTINGS}
    return json.loads(json.dumps(defaults, default=str))


def _tuning_defaults() -> dict[str, Any]:
    """:class:`~bpo_experiments.tuning.TuningConfig`'s defaults as :func:`preset_dict` writes them."""
    return json.loads(json.dumps(dataclasses.asdict(TuningConfig()), default=str))


def env_setting(saved: dict[str, Any], env: str) -> dict[str, Any]:
    """What of a preset (as :func:`preset_dict` data) env ``env``'s runs depend on: its own
    ``EnvSetup``, its value of every per-env setting, and every other field but the loggers'
    (:func:`_setting`). One shape for the data of every version (``setting.json``): the per-env
    settings beside the setup, as the presets before ``EnvSetup`` held them wrote them (each a
    preset field, one value or ``{env: value}``)."""
    out: dict[str, Any] = {}
    defaults = {f.name: f.default for f in dataclasses.fields(EnvSetup) if f.name in ENV_SETTINGS}
    for key, value in _setting(saved).items():
        if key == "envs":
            setup = value.get(env)
            if isinstance(setup, dict):  # this version's: the settings in the setup
                setup = dict(setup)
                out.update({k: setup.pop(k) for k in ENV_SETTINGS if k in setup})
            out[key] = setup
        elif key in PER_ENV_FIELDS and isinstance(value, dict):
            out[key] = value.get(env, json.loads(json.dumps(defaults[key])))
        else:
            out[key] = value
    return out


_DATA_COUNTERS = ("planner_timeouts",)
"""Provenance fields that count what one process did (not which data it is)."""


def _data_identity(provenance: Any) -> Any:
    """``provenance`` without the per-process counters."""
    if isinstance(provenance, dict):
        return {k: _data_identity(v) for k, v in provenance.items() if k not in _DATA_COUNTERS}
    return provenance
