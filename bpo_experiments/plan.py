"""``bpo-compare --plan``: size a comparison before paying for it (no training).

It prints the runs a preset makes, the compute they will use (in the budget unit and in flops)
and the wall time they will take with ``--jobs N``, and the effect the preset can detect with its
seeds and evaluation episodes (docs/main-job.md, "Planning"). The figures come from, in order:

* a saved earlier ``results.json`` (``--plan-from``, else the preset's ``recorded_results`` for
  the env):
  its seconds per run, flops per update and, per metric, the spread over seeds of each
  algorithm's paired difference with the comparator. The detectable effect at the preset's
  ``n`` seeds is ``(t_{0.975, n-1} + t_{0.80, n-1}) sd / sqrt(n)`` with that spread ``sd``;
* a GPU preset (``preset.gpus`` set; no CPU pilot can run its model): the named assumptions of
  :mod:`bpo_experiments.gpu_plan` (the spread from the CPU pilot plus evaluation noise,
  flops from the budget, GPU-hours at an assumed share of the peak), GPU-hours and days on one
  H200 and on 8 x H100 printed beside;
* else the env's pilot recorded in the preset's ``recorded_pilots`` (``--plan --pilot`` measures
  and writes them) while the settings it was measured with are the preset's;
* else a short pilot: per env, the first seed's initial policy is built and evaluated once, and
  the comparator trains ``PILOT_UPDATES`` updates; every algorithm is assumed to cost what the
  comparator costs per update (named so in the output). With no spread measured, the
  detectable effect printed is the one evaluation noise alone allows: two independent
  evaluations of ``T`` tasks x ``E`` episodes at the warm start's success ``p`` differ with
  ``sd = sqrt(2 p (1 - p) / (T E))`` (``p`` shrunk to ``(wins + 1/2) / (T E + 1)``; training adds
  its own spread, so the real one is larger).
"""

from __future__ import annotations

import json
import math
import os
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

from bpo_envs.files import CorruptFileError, read_json
from bpo_experiments.build import make_policy
from bpo_experiments.evaluation import evaluate_episodes
from bpo_experiments.gpu_plan import ASSUMED_MFU, ASSUMED_SPREAD, PEAK_BF16_FLOPS, gpu_plan
from bpo_experiments.output import env_setting, setting_changes
from bpo_experiments.presets import EnvSetup, Preset, setup_data
from bpo_experiments.run_config import ComparisonConfig, comparison_config
from bpo_experiments.significance import minimal_detectable_effect, power
from bpo_experiments.stats import METRICS
from bpo_experiments.tasks import env_factory, eval_env_factory, task_sets, task_split

PILOT_UPDATES = 3
"""Updates the pilot trains the comparator for, per env (the first, which warms caches, is not
timed)."""

REPOSITORY = Path(__file__).resolve().parents[1]


def recorded(comparison: ComparisonConfig, plan_from: Path | None, env: str) -> tuple[dict[str, Any] | None, str | None]:
    """The saved results the plan of ``env`` uses and where they came from (None, None: none):
    ``plan_from``, else the env's ``recorded_results``."""
    if plan_from is not None:
        if not plan_from.exists():
            raise SystemExit(f"--plan-from {plan_from}: no such file")
        try:
            return read_json(plan_from), str(plan_from)
        except CorruptFileError as exc:
            raise SystemExit(f"--plan-from: {exc}") from None
    name = comparison.envs[env].recorded_results
    if isinstance(name, str):
        path = REPOSITORY / name
        if path.exists():
            return json.loads(path.read_text()), str(path.relative_to(REPOSITORY))
    return None, None


PLAN_SIZES = ("seeds", "recorded_results", "recorded_pilots")
"""Setting keys in which a recorded run may differ from the plan's preset and still describe it:
the plan sizes the seeds itself, and the other two only say where its sources are."""


def record_differences(saved: dict[str, Any], preset: Preset, env: str) -> dict[str, list[Any]]:
    """What ``env``'s setting in the recorded ``results.json`` ``saved`` (its ``preset``) and
    ``preset`` differ in, ``{key: [recorded, now]}``, a mapping field by field (``envs.FIELD``,
    ``envs.trainer.FIELD``), :data:`PLAN_SIZES` aside; empty when the record is this setting's (or holds
    no preset to tell). A record of another setting still sizes the plan, which says so: its
    seconds and spreads are that setting's."""
    saved_preset = saved.get("preset")
    if not isinstance(saved_preset, dict) or env not in (saved_preset.get("envs") or {}):
        return {}
    out: dict[str, list[Any]] = {}

    def add(key: str, old: Any, new: Any) -> None:
        if isinstance(old, dict) and isinstance(new, dict):  # name the fields that differ
            for k in sorted(set(old) | set(new)):
                if old.get(k) != new.get(k):
                    add(f"{key}.{k}", old.get(k), new.get(k))
        else:
            out[key] = [old, new]

    for key, (old, new) in setting_changes(env_setting(saved_preset, env), preset, env).items():
        if key not in PLAN_SIZES:
            add(key, old, new)
    return out


def pilot_settings(comparison: ComparisonConfig, env: str) -> dict[str, Any]:
    """What a pilot of ``env`` measured depends on: the env's setup, budget, policy, warm start,
    pool, evaluation episodes and the comparator's options. A recorded pilot sizes a plan only
    while these are the same."""
    e = comparison.envs[env]
    return json.loads(json.dumps({
        "setup": setup_data(e.setup), "budget": e.budget, "budget_unit": e.budget_unit, "policy": comparison.policy,
        "sft_epochs": comparison.sft_epochs, "sft_lr": comparison.sft_lr, "pool_size": e.pool_size, "torch_threads": e.torch_threads,
        "eval_episodes": e.evaluation.episodes, "comparator": comparison.comparator,
        "options": comparison.comparator_specs[env].build().config(),
    }, default=str))


def recorded_pilot(comparison: ComparisonConfig, env: str) -> tuple[dict[str, Any] | None, str | None]:
    """``env``'s pilot in the preset's ``recorded_pilots`` when it was measured with the preset's
    settings (:func:`pilot_settings`), and where it came from; (None, None) otherwise."""
    if not comparison.recorded_pilots:
        return None, None
    path = REPOSITORY / comparison.recorded_pilots
    try:
        saved = read_json(path) if path.exists() else {}
    except CorruptFileError:
        return None, None
    entry = saved.get("per_env", {}).get(env)
    if not entry or entry.get("settings") != pilot_settings(comparison, env):
        return None, None
    return entry, f"{comparison.recorded_pilots} (measured {entry.get('measured', '?')}, {entry.get('uptime', '')})"


def save_pilots(comparison: ComparisonConfig, pilots: dict[str, dict[str, Any]]) -> Path | None:
    """Write the pilots measured now into the preset's ``recorded_pilots`` (``--plan --pilot``),
    keeping the other envs'; None when the preset names no such file."""
    if not comparison.recorded_pilots:
        return None
    path = REPOSITORY / comparison.recorded_pilots
    saved = read_json(path) if path.exists() else {}
    per_env = {**saved.get("per_env", {}), **pilots}
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"about": "bpo-compare --plan --pilot: each env's pilot (bpo_experiments/plan.py)", "per_env": per_env},
                               indent=2) + "\n")
    return path


def _pilot(comparison: ComparisonConfig, env: str) -> dict[str, Any]:
    """Seconds per update, per evaluation and per initial policy, flops per update and the warm
    start's success, measured on the first seed."""
    from bpo_algos.rollout import EnvPool as Pool
    from bpo_algos.trainer import Trainer

    e = comparison.envs[env]
    setup = e.setup
    seed = e.seeds[0]
    train_tasks, eval_tasks = task_split(setup)
    t0 = time.perf_counter()
    policy = make_policy(e.policy, setup, seed, train_tasks)
    build = time.perf_counter() - t0
    pool = Pool([eval_env_factory(setup)] * e.pool_size, workers=setup.workers)
    try:
        t0 = time.perf_counter()
        wins = evaluate_episodes(policy, pool, eval_tasks, e.evaluation.episodes, seed)
        evaluation = time.perf_counter() - t0
    finally:
        pool.close()
    pool = Pool([env_factory(setup)] * e.pool_size, workers=setup.workers)
    try:
        algorithm = comparison.comparator_specs[env].build(seed=seed)
        config = replace(e.run_trainer(seed, len(train_tasks)), updates=PILOT_UPDATES, out_dir=None, save_trees_every=0)
        stamps: list[float] = []
        history = Trainer(algorithm, policy, pool, train_tasks, config).train(after_update=lambda _: stamps.append(time.perf_counter()))
        update = (stamps[-1] - stamps[1]) / (PILOT_UPDATES - 1)
    finally:
        pool.close()
    return {
        "seconds_per_update": update,
        "seconds_per_eval": evaluation,
        "seconds_initial": build + evaluation,
        "flops_per_update": float(np.mean([row["compute"]["flops"] for row in history])),
        "warm_success": float(np.mean(wins)),
        "eval_episodes_total": len(wins),
    }


def extra_runs(comparison: ComparisonConfig, env: str) -> dict[str, list[str]]:
    """The runs tuning adds on ``env`` (:mod:`bpo_experiments.tuning`), as the algorithm each
    costs like: ``{"tuning": [...], "defaults": [...]}``: every candidate of every tuned kind
    once per tuning seed, and the treatment and the comparator at their defaults once per
    evaluation seed of the secondary row (counted even where a default will equal the tuned choice)."""
    tuning = comparison.tuning
    if tuning is None or not tuning.tunes(env):
        return {"tuning": [], "defaults": []}
    kinds = comparison.kinds
    tuned = [k for k in dict.fromkeys(kinds.values()) if k in tuning.grids]
    runs_as = {k: next(a for a, kind in kinds.items() if kind == k) for k in tuned}
    tuning_runs = [runs_as[k] for k in tuned if len(tuning.grid(k)) > 1 for _ in tuning.grid(k) for _ in tuning.seeds]
    seeds = list(comparison.envs[env].seeds)[: tuning.default_seeds]
    defaults = [a for a in (comparison.treatment, comparison.comparator) if kinds.get(a) in tuned for _ in seeds]
    return {"tuning": tuning_runs, "defaults": defaults}


def plan(preset: Preset, jobs: int, plan_from: Path | None = None, progress: bool = True, pilot: bool = False) -> dict[str, Any]:
    """Print and return the plan of ``preset`` with ``jobs`` parallel runs (module docstring);
    tuning's runs (:func:`extra_runs`) are counted and costed like their algorithm's. ``pilot``
    (``--plan --pilot``): every env sized by a pilot run now, written to the preset's
    ``recorded_pilots`` (:func:`save_pilots`)."""
    comparison = comparison_config(preset)
    envs: dict[str, Any] = {}
    measured: dict[str, dict[str, Any]] = {}
    total_seconds = 0.0
    for env, settings in comparison.envs.items():
        setup = settings.setup
        seeds = list(settings.seeds)
        n = len(seeds)
        updates = settings.trainer.updates
        points = list(settings.eval_points)
        probing = [s for s in seeds if settings.probes_on(s)]
        extra = extra_runs(comparison, env)
        entry: dict[str, Any] = {
            "seeds": seeds,
            "algorithms": list(comparison.algorithms),
            "runs": n * len(comparison.algorithms) + len(extra["tuning"]) + len(extra["defaults"]),
            "tuning_runs": len(extra["tuning"]),
            "default_runs": len(extra["defaults"]),
            "updates": updates,
            "budget_per_update": settings.budget,
            "budget_unit": settings.budget_unit,
            "evaluations_per_run": len(points),
            "eval_tasks": setup.eval_tasks,
            "eval_episodes": settings.evaluation.episodes,
            "probe_seeds": probing,
            "compute_per_run": settings.horizon,
        }
        saved, source = (None, None) if pilot else recorded(comparison, plan_from, env)
        record = (saved or {}).get("per_env", {}).get(env) if saved else None
        if record and "vs_comparator" in record:  # (an older results.json has no paired spreads)
            run_seconds = _size_from_record(comparison, env, entry, n, updates, saved, source, record)
            differs = record_differences(saved, preset, env)
            if differs:
                entry["record_differs"] = differs
        elif comparison.gpus and env in ASSUMED_SPREAD and not pilot:
            run_seconds = _size_from_gpu_plan(comparison, env, entry, n)
        else:
            earlier, where = (None, None) if pilot else recorded_pilot(comparison, env)
            run_seconds = _size_from_pilot(comparison, env, entry, n, updates, seeds, points, probing, progress, earlier, where)
            if earlier is None:
                measured[env] = {"pilot": entry["pilot"], "settings": pilot_settings(comparison, env),
                                 "measured": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "uptime": _load()}
        translations = translation_cost(settings.setup)
        if translations:
            entry["translations"] = translations
            run_seconds += translations["cpu_seconds"]
        extra_seconds = sum(entry["seconds_per_run"].get(a, 0.0) for a in extra["tuning"] + extra["defaults"])
        entry["seconds_extra"] = extra_seconds
        run_seconds += extra_seconds
        entry["seconds_total"] = run_seconds
        total_seconds += run_seconds
        envs[env] = entry
    result = {
        "preset_algorithms": list(comparison.algorithms),
        "treatment": comparison.treatment,
        "comparator": comparison.comparator,
        "primary_metric": comparison.primary_metric,
        "jobs": jobs,
        "per_env": envs,
        "runs": sum(e["runs"] for e in envs.values()),
        "cpu_seconds": total_seconds,
        "wall_seconds": total_seconds / jobs,
    }
    if pilot:
        written = save_pilots(comparison, measured)
        result["pilots_saved"] = str(written) if written else None
    print(render(result))
    if pilot:
        print(f"\npilots written to {written}" if written else "\nthis preset names no recorded_pilots file: the pilots were not saved")
    return result


def _load() -> str:
    """The machine's load when a pilot was measured (its costs depend on it)."""
    one, five, fifteen = os.getloadavg()
    return f"load average {one:.2f}, {five:.2f}, {fifteen:.2f} on {os.cpu_count()} cores"


def translation_cost(setup: EnvSetup) -> dict[str, Any] | None:
    """The ALFWorld game translations the comparison will make before it starts on the env of
    ``setup`` (the games it plays that have none on disk, :mod:`bpo_envs.alfworld.translations`)
    and their CPU seconds; None for another env or when every one is made."""
    if setup.env_id != "BPO-ALFWorld-v0" or setup.servers:
        return None
    from bpo_envs.alfworld.translations import SECONDS_PER_TRANSLATION, untranslated

    train_tasks, eval_tasks = task_split(setup)
    missing = sum(len(untranslated(kwargs, tasks)) for kwargs, tasks in task_sets(setup, train_tasks, eval_tasks))
    if not missing:
        return None
    return {"games": missing, "cpu_seconds": missing * SECONDS_PER_TRANSLATION}


def _size_from_record(comparison: ComparisonConfig, env: str, entry: dict[str, Any], n: int, updates: int, saved: dict[str, Any],
                      source: str, record: dict[str, Any]) -> float:
    """Size ``env``'s runs from a recorded ``results.json`` (its costs and paired spreads) into
    ``entry``; returns their seconds."""
    entry["source"] = f"recorded: {source}"
    old_updates = (saved.get("preset") or {}).get("updates")
    old_updates = old_updates.get(env) if isinstance(old_updates, dict) else old_updates
    scale = updates / old_updates if old_updates else 1.0
    seconds, flops = {}, {}
    # a run's CPU seconds are what it takes on an idle core; its wall seconds carry the load of
    # the machine it was recorded on (a record written before runs kept their CPU has only those)
    by_cpu = all((record["algorithms"].get(a) or {}).get("seconds_cpu_per_run") is not None for a in record["algorithms"])
    entry["seconds_basis"] = "CPU seconds of the recorded runs" if by_cpu else "wall seconds of the recorded runs, at the load they ran under"
    for a in comparison.algorithms:
        r = record["algorithms"].get(a) or record["algorithms"].get(comparison.comparator) or next(iter(record["algorithms"].values()))
        seconds[a] = (r["seconds_cpu_per_run"] if by_cpu else r.get("seconds_per_run", 0.0)) * scale
        flops[a] = r["compute"].get("flops", float("nan")) * updates
    entry["seconds_per_run"] = seconds
    entry["flops_per_run"] = flops
    run_seconds = n * sum(seconds.values())
    timing = saved.get("timing") or {}
    pairs = max(1, sum(len(v.get("seeds", [])) for v in saved["per_env"].values()))
    run_seconds += n * timing.get("initial_seconds_total", 0.0) / pairs
    mde: dict[str, dict[str, float]] = {}
    for a, vs in record.get("vs_comparator", {}).items():
        if a not in comparison.algorithms:
            continue
        mde[a] = {m: minimal_detectable_effect(vs[m]["sd"], n) for m in METRICS if m in vs and vs[m].get("sd") is not None}
    entry["mde"] = mde
    entry["mde_basis"] = f"the per-seed spread of each paired difference in {source}, at {n} seeds"
    entry["calibration_power"] = calibration_power(comparison, record, n)
    return run_seconds


def calibration_power(comparison: ComparisonConfig, record: dict[str, Any], n: int) -> dict[str, Any] | None:
    """The power of the headline (the treatment − the comparator on the primary metric, paired
    over ``n`` seeds) to detect an effect the size of the recorded calibration (``rloo-2x`` −
    the comparator: what halving the gradient variance buys), at the recorded headline spread
    (:func:`~bpo_experiments.significance.power`); None when the record has no calibration or spread."""
    metric, calibration = comparison.primary_metric, comparison.calibration_control
    vs = record.get("vs_comparator", {})
    head, cal = (vs.get(comparison.treatment) or {}).get(metric), (vs.get(calibration) or {}).get(metric)
    if not head or not cal or head.get("sd") is None:
        return None
    return {"metric": metric, "calibration": calibration, "effect": cal["diff"], "sd": head["sd"], "seeds": n,
            "power": power(cal["diff"], head["sd"], n), "mde": minimal_detectable_effect(head["sd"], n)}


def _size_from_gpu_plan(comparison: ComparisonConfig, env: str, entry: dict[str, Any], n: int) -> float:
    """Size a GPU preset's runs of ``env`` from named assumptions (:mod:`bpo_experiments.gpu_plan`:
    no CPU pilot can run its model) into ``entry``; returns their seconds."""
    # a GPU preset: no CPU pilot can run its model; sized from named assumptions
    row = gpu_plan(comparison)[env]
    entry["source"] = (
        f"assumed (bpo_experiments.gpu_plan): flops from the preset's budget and episode shape, "
        f"{ASSUMED_MFU:.0%} of {PEAK_BF16_FLOPS['H100'] / 1e12:.0f} TFLOPS per GPU"
    )
    seconds_per_run = row["gpu_hours"] * 3600 / row["runs"] / comparison.gpus  # on the preset's GPUs
    entry["seconds_per_run"] = {a: seconds_per_run for a in comparison.algorithms}
    entry["flops_per_run"] = {a: row["flops_per_run"]["total"] for a in comparison.algorithms}
    entry["gpu_hours"] = row["gpu_hours"]
    entry["days_on_1xH200"] = row["days_on_1xH200"]
    entry["days_on_8xH100"] = row["days_on_8xH100"]
    run_seconds = row["gpu_hours"] * 3600 / comparison.gpus
    entry["mde"] = {a: {"final": row["mde"]} for a in comparison.algorithms if a != comparison.comparator}
    entry["mde_basis"] = f"sd {row['sd_assumed']:.3f} per seed: {row['sd_source']} ({n} seeds)"
    return run_seconds


def _size_from_pilot(comparison: ComparisonConfig, env: str, entry: dict[str, Any], n: int, updates: int, seeds: list[int],
                     points: list[int], probing: list[int], progress: bool, earlier: dict[str, Any] | None = None,
                     where: str | None = None) -> float:
    """Size ``env``'s runs from a short pilot of the comparator (:func:`_pilot`; ``earlier``: one
    recorded at ``where`` instead) into ``entry``; returns their seconds."""
    if earlier is not None:
        pilot = earlier["pilot"]
        entry["source"] = f"recorded pilot: {where}: {comparison.comparator}, {PILOT_UPDATES} updates (every algorithm assumed to cost what it does)"
    else:
        if progress:
            print(f"pilot on {env}: the comparator {comparison.comparator} for {PILOT_UPDATES} updates ...", flush=True)
        pilot = _pilot(comparison, env)
        entry["source"] = f"pilot: {comparison.comparator}, {PILOT_UPDATES} updates, seed {seeds[0]} (every algorithm assumed to cost what it does)"
    entry["pilot"] = pilot
    probe_batches = 2 * (comparison.envs[env].probes.batches + 1)
    per_run = updates * pilot["seconds_per_update"] + (len(points) - 1) * pilot["seconds_per_eval"]
    probe = probe_batches * pilot["seconds_per_update"]
    seconds = {a: per_run for a in comparison.algorithms}
    entry["seconds_per_run"] = seconds
    entry["flops_per_run"] = {a: pilot["flops_per_update"] * updates for a in comparison.algorithms}
    run_seconds = n * sum(seconds.values()) + len(probing) * len(comparison.algorithms) * probe + n * pilot["seconds_initial"]
    episodes = max(pilot["eval_episodes_total"], 1)
    # (wins + 1/2) / (episodes + 1): a success of exactly 0 or 1 in the pilot still has noise
    p = (pilot["warm_success"] * episodes + 0.5) / (episodes + 1)
    sd = math.sqrt(2 * p * (1 - p) / episodes)
    entry["mde"] = {a: {"final": minimal_detectable_effect(sd, n)} for a in comparison.algorithms if a != comparison.comparator}
    entry["mde_basis"] = (
        f"evaluation noise alone (warm start success {pilot['warm_success']:.3f}, {episodes} episodes per evaluation, {n} seeds): "
        "a lower bound, training adds its own spread"
    )
    return run_seconds


def _short(value: Any, width: int = 60) -> str:
    text = json.dumps(value, default=str)
    return text if len(text) <= width else text[: width - 3] + "..."


def render(result: dict[str, Any]) -> str:
    """The plan as text."""
    lines = [
        f"Plan: {result['runs']} runs ({', '.join(result['preset_algorithms'])}); headline {result['treatment']} − "
        f"{result['comparator']} on {result['primary_metric']}.",
        f"Expected wall time with --jobs {result['jobs']}: {result['wall_seconds'] / 60:.1f} min "
        f"({result['cpu_seconds'] / 60:.1f} min of runs in all).",
    ]
    for env, e in result["per_env"].items():
        lines += [
            "",
            f"{env}: {len(e['seeds'])} seeds x {len(e['algorithms'])} algorithms = {e['runs']} runs; {e['updates']} updates of "
            f"{e['budget_per_update']} {e['budget_unit']} ({e['compute_per_run']:,.0f} per run); {e['evaluations_per_run']} evaluations "
            f"of {e['eval_tasks']} tasks x {e['eval_episodes']} episodes; gradient probes on seeds {e['probe_seeds']}.",
            f"  costs from {e['source']}: {e['seconds_total'] / 60:.1f} min of runs"
            + (f" ({e['seconds_basis']})" if e.get("seconds_basis") else ""),
        ]
        if e.get("record_differs"):
            changes = "; ".join(f"{k} {_short(old)} -> {_short(new)}" for k, (old, new) in e["record_differs"].items())
            lines.append(f"  warning: the recorded run had another setting ({changes}): its seconds and spreads are that "
                         "setting's, not this one's")
        if e.get("translations"):
            lines.append(f"  ALFWorld game translations first: {e['translations']['games']} games not translated yet, "
                         f"{e['translations']['cpu_seconds'] / 60:.1f} min of CPU (included; made in the --jobs workers)")
        if e.get("tuning_runs") or e.get("default_runs"):
            lines.append(f"  tuning: {e['tuning_runs']} candidate runs on the tuning seeds and {e['default_runs']} runs of the "
                         f"treatment and comparator at their defaults ({e['seconds_extra'] / 60:.1f} min, included)")
        if "gpu_hours" in e:
            lines.append(f"  {e['gpu_hours']:,.0f} GPU-hours: {e['days_on_1xH200']:,.0f} days on one H200, {e['days_on_8xH100']:,.0f} days on 8 x H100")
        for a in e["algorithms"]:
            lines.append(f"    {a}: {e['seconds_per_run'][a]:.0f} s and {e['flops_per_run'][a]:.3g} flops per run")
        lines.append(f"  detectable effect (80% power, two-sided 5%) against {result['comparator']}, from {e['mde_basis']}:")
        for a, by_metric in e["mde"].items():
            lines.append(f"    {a}: " + ", ".join(f"{m} {v:.3g}" for m, v in by_metric.items()))
        cal = e.get("calibration_power")
        if cal:
            lines.append(f"  power to detect the calibration effect ({cal['calibration']} − {result['comparator']} "
                         f"{cal['effect']:+.4f} {cal['metric']}) with {result['treatment']} − {result['comparator']}'s spread "
                         f"at {cal['seeds']} seeds: {cal['power']:.2f} (MDE {cal['mde']:.4f})")
        else:
            lines.append("  power to detect the calibration effect: unknown (no recorded calibration control to size it from)")
    return "\n".join(lines)

