"""Where the main job's time goes: a small ``bpo-compare`` job per env, timed and profiled, on
one or more checkouts of the code, alternated in one run (docs/main-job.md, "Where the time goes").

For each round (``--rounds``), each env and each checkout (``--code``, default this one) it runs
the small job twice in a fresh process whose ``PYTHONPATH`` is that checkout: once plain (the
wall time, decisions and env steps per second) and once under cProfile (the shares of wall time).
Checkouts alternate inside a round, so a change in the machine's load hits both alike; the
``uptime`` line is recorded beside every timing, and the job process's CPU seconds (user + system,
its threads included), which a loaded machine disturbs far less than its wall time. Writes ``results.json`` and, per checkout and
env, the profile's top functions (``profile-LABEL-ENV.txt``) into ``--out``::

    python benchmarks/bench_main_job.py --code /work/main --code . --labels before after \\
        --envs webshop alfworld --out docs/results/bench-main-job

The small job: ``bpo-compare --envs ENV --algorithms rloo bpo --treatment bpo --seeds 0 --no-tune
--updates 4 --eval-every 4 --positive-control none --calibration-control none --jobs 1`` (plus
``--job-args``' extra flags per env; ``--alfworld-default``: ALFWorld's job is instead the CPU
default's initial job with its behaviour cloning and a short RLOO run, :data:`ALFWORLD_DEFAULT_JOB`,
each job with its own empty expert-demo cache unless ``--demos-cache`` names one folder for all;
``--alfworld-run``: the initial job and the default's full RLOO and frozen runs, :data:`ALFWORLD_RUN_JOB`).
``--py-spy BINARY`` samples every plain run with py-spy (all threads: an env stepped on a pool
thread is on-CPU there, which cProfile, main thread only, does not see) and adds the shares of
the on-CPU samples by part (:data:`SPY_PARTS`).
Each row also holds the job's CPU seconds by phase (the initial job, and in it the expert demos,
the cloning and the evaluations; the runs, and in them their evaluations) and every run's
results, so that before and after can be compared result for result, and (ALFWorld) every game load in order with whether
the process held the game's translation (``alfworld_game_loads``; ``bench_translation_eviction.py`` replays it) and
the transition memo's hits and misses (``alfworld_transitions``). Counted in the job's own process: *env steps*, every
``SnapshotEnv.step``; *decisions*, every action a choice policy sampled
(``ChoicePolicy.sample`` / ``sample_distinct``), in training, probes and evaluation alike.

Shares of the profiled wall time (cProfile sees the main thread only: an env stepped in a pool
thread shows as the time the engine waits for it, which is what it costs the job):

* by phase: ``start-up`` (imports, tasks, data: everything before the first job and after the
  last but the report), ``initial job`` (the initial policy and its evaluation and reference
  pool), ``training`` (collection and learner), ``evaluation``, ``probes`` (the gradient probes
  and every reference pool), ``report``;
* by component: ``env`` (calls into the envs and the env pool), ``policy forward`` (calls into
  ``bpo_algos.policy`` but the backward passes they make), ``backward`` (autograd's backward
  pass), ``engine bookkeeping`` (the own time of the rollout engine, its paths, trees and meters,
  with the built-ins they call directly), ``other`` (the rest: the algorithms' advantages and
  losses outside the policy, optimizer steps, files, imports).
"""

from __future__ import annotations

import argparse
import json
import os
import pstats
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

SMALL_JOB = ["--algorithms", "rloo", "bpo", "--treatment", "bpo", "--seeds", "0", "--no-tune", "--updates", "4",
             "--eval-every", "4", "--positive-control", "none", "--calibration-control", "none", "--jobs", "1", "--no-progress"]
ALFWORLD_DEFAULT_JOB = ["--algorithms", "rloo", "frozen", "--treatment", "rloo", "--comparator", "frozen", "--seeds", "0", "--no-tune", "--updates", "2",
                        "--eval-every", "2", "--positive-control", "none", "--calibration-control", "none", "--jobs", "1", "--no-progress"]
"""``--alfworld-default``: the CPU default's ALFWorld initial job as it is (the handcoded expert's
demos of 1,000 games, 10 cloning epochs, the warm start on 140 valid_seen + 134 valid_unseen
games), one RLOO run of 2 updates evaluated after update 2 (140 games) and at its end (134), and
``frozen`` (2 updates of collection; its evaluations are the warm start's) as the comparator the command
line asks for."""
ALFWORLD_RUN_JOB = ["--algorithms", "rloo", "frozen", "--treatment", "rloo", "--comparator", "frozen", "--seeds", "0", "--no-tune",
                    "--positive-control", "none", "--calibration-control", "none", "--jobs", "1", "--no-progress"]
"""``--alfworld-run``: the CPU default's ALFWorld runs as they are (12 updates of 800 env steps,
evaluated on the 140 valid_seen games at updates 0, 2, ..., 12 and on the 134 valid_unseen games at
the end): one RLOO run and one ``frozen`` run after the initial job (``--job-args "--config
FILE"`` changes the setting, e.g. fewer training games for a cheaper warm start)."""
JOB_ARGS = {
    # ALFWorld's initial policy without behaviour cloning (its expert trajectories on 1,000
    # games take longer than the whole job): the runs, probes and evaluations are the default's
    "alfworld": ["--sft-epochs", "0"],
}


def _uptime() -> str:
    try:
        return subprocess.run(["uptime"], capture_output=True, text=True, check=False).stdout.strip()
    except OSError:
        return "load average: " + ", ".join(f"{v:.2f}" for v in os.getloadavg())


def _git(code: Path) -> str:
    out = subprocess.run(["git", "-C", str(code), "rev-parse", "--short=12", "HEAD"], capture_output=True, text=True, check=False)
    return out.stdout.strip() or "unknown"


# ---- the job's own process ---------------------------------------------------------------------
def _child(argv: list[str], result_path: Path, profile_path: Path | None) -> None:
    """Run the small job in this process (its code from ``PYTHONPATH``) with counters, under
    cProfile when ``profile_path`` is given; write the counts and timings to ``result_path``."""
    started = time.perf_counter()
    import cProfile
    import itertools

    counts = {"env_steps": itertools.count(), "decisions": 0}
    cpu: dict[str, float] = {}
    phase = ["start-up"]

    def timed(module: Any, name: str, bucket: str | None = None, enters: str | None = None) -> None:
        """``module.name`` wrapped to add its process CPU seconds to ``cpu[bucket]`` (None: to
        ``cpu["evaluation in " + the current phase]``); ``enters``: the phase inside it."""
        original = getattr(module, name)

        def wrapper(*args: Any, **kwargs: Any) -> Any:
            outer, t0 = phase[0], time.process_time()
            if enters is not None:
                phase[0] = enters
            try:
                return original(*args, **kwargs)
            finally:
                phase[0] = outer
                key = bucket or f"evaluation in {outer}"
                cpu[key] = cpu.get(key, 0.0) + time.process_time() - t0

        wrapper.__wrapped__ = original  # type: ignore[attr-defined]
        setattr(module, name, wrapper)

    profiler = cProfile.Profile() if profile_path is not None else None
    if profiler is not None:
        profiler.enable()
    from bpo_algos.policy.choice import ChoicePolicy
    from bpo_envs.core import SnapshotEnv

    step = SnapshotEnv.step

    def counted_step(self: Any, action: Any) -> Any:
        next(counts["env_steps"])  # atomic under the GIL: pool threads step too
        return step(self, action)

    SnapshotEnv.step = counted_step  # type: ignore[method-assign]
    for name in ("sample", "sample_distinct"):
        original = getattr(ChoicePolicy, name)

        def counted(self: Any, *args: Any, _original: Any = original, **kwargs: Any) -> Any:
            out = _original(self, *args, **kwargs)
            counts["decisions"] += sum(len(row) for row in out)
            return out

        setattr(ChoicePolicy, name, counted)
    # CPU seconds by phase (the job's functions wrapped before compare binds them): the initial
    # job, and inside it the expert demos, the cloning and the warm start's evaluation; the runs,
    # and inside them their evaluations
    # (evaluation first: runner binds evaluate_episodes when it is imported)
    import bpo_experiments.evaluation as evaluation

    timed(evaluation, "evaluate_episodes")
    import bpo_algos.policy.sft as sft
    import bpo_experiments.build as build
    import bpo_experiments.runner as runner

    timed(runner, "initial_job", "initial job", enters="initial job")
    timed(runner, "run_one", "runs", enters="runs")
    timed(build, "_expert_demos", "demos")
    timed(sft, "behaviour_cloning", "cloning")
    loads = _trace_alfworld_loads()
    from bpo_experiments import compare

    job_start = time.perf_counter()
    compare.main(argv)
    job_seconds = time.perf_counter() - job_start
    if profiler is not None:
        profiler.disable()
        profiler.dump_stats(str(profile_path))
    result = {"wall_seconds": time.perf_counter() - started, "job_seconds": job_seconds, "cpu_seconds": time.process_time(),
              "env_steps": next(counts["env_steps"]), "decisions": counts["decisions"], "cpu_seconds_by_phase": cpu}
    derived = sys.modules.get("bpo_envs.alfworld.derived")  # ALFWorld's cache of derived texts, where the code has one
    if derived is not None:
        cache = derived.DERIVED
        result["alfworld_derived_texts"] = {"hits": cache.hits, "misses": cache.misses, "kept": len(cache), "bound": cache.max_texts}
        if hasattr(cache, "game_hits"):  # the code keeps game texts (keyed without the state)
            result["alfworld_derived_texts"].update(game_hits=cache.game_hits, game_texts_kept=cache.game_texts)
    transitions = sys.modules.get("bpo_envs.alfworld.transitions")  # ALFWorld's transition memo, where the code has one
    if transitions is not None:
        memo = transitions.MEMO
        result["alfworld_transitions"] = {"hits": memo.hits, "misses": memo.misses, "kept": len(memo), "bytes": memo.bytes, "bound": memo.max_bytes}
    if loads is not None and loads["sequence"]:
        result["alfworld_game_loads"] = loads
    result_path.write_text(json.dumps(result))


def _trace_alfworld_loads() -> dict[str, Any] | None:
    """Wrap ``AlfredEngine.load`` (where the code has ALFWorld) to record every game load: the
    game (its index in ``games``, with its translations' estimated bytes), whether the process
    held its translation already (``has_translation`` before the load: an in-process hit; else
    it was read from disk or translated), in order, so that eviction policies can be compared on
    the job's own sequence. None where ALFWorld cannot be imported."""
    try:
        from bpo_envs.alfworld import _upstream
        from bpo_envs.alfworld.engine import AlfredEngine
    except ImportError:
        return None
    record: dict[str, Any] = {"loads": 0, "in_process": 0, "games": [], "sequence": []}
    index: dict[str, int] = {}
    load = AlfredEngine.load

    def traced(self: Any, game: dict[str, Any], *args: Any, **kwargs: Any) -> Any:
        held = _upstream.has_translation(game)
        out = load(self, game, *args, **kwargs)
        name = _upstream._key(game["pddl_domain"], game["pddl_problem"], False)[0]
        if name not in index:
            size = sum(_upstream._estimated_bytes(entry[0]) for optimize in (False, True)
                       if (entry := _upstream._TRANSLATIONS.get(_upstream._key(game["pddl_domain"], game["pddl_problem"], optimize))) is not None)
            index[name] = len(record["games"])
            record["games"].append([name[:12], size])
        record["loads"] += 1
        record["in_process"] += int(held)
        record["sequence"].append(index[name])
        return out

    AlfredEngine.load = traced  # type: ignore[method-assign]
    return record


# ---- reading a profile ---------------------------------------------------------------------------
def _where(func: tuple[str, int, str]) -> str:
    return func[0].replace(os.sep, "/")


def _in(func: tuple[str, int, str], *parts: str) -> bool:
    """Whether ``func`` is a function (not a module's import) of a file whose path holds one of ``parts``."""
    path = _where(func)
    return func[2] != "<module>" and any(p in path for p in parts)


ENV = ("/bpo_envs/pool.py", "/bpo_envs/core.py", "/bpo_envs/replay.py", "/bpo_envs/text.py", "/bpo_envs/tree_mdp.py",
       "/bpo_envs/webshop/", "/bpo_envs/alfworld/", "/bpo_envs/swebench/")
POLICY = ("/bpo_algos/policy/",)
ENGINE = ("/bpo_algos/rollout.py", "/bpo_algos/paths.py", "/bpo_algos/tree.py", "/bpo_algos/budget", "/bpo_algos/compute.py")


def _is_backward(func: tuple[str, int, str]) -> bool:
    return func[2] == "<method 'run_backward' of 'torch._C._EngineBase' objects>" or (
        func[2] in ("backward", "grad") and _in(func, "torch/_tensor.py", "torch/autograd/__init__.py"))


def _entries(stats: dict[Any, Any], inside: Any) -> float:
    """Seconds spent in calls into the functions ``inside`` accepts from functions it does not
    (the outermost entries: nested calls inside are not counted twice)."""
    total = 0.0
    for func, (_, _, _, _, callers) in stats.items():
        if not inside(func):
            continue
        for caller, edge in callers.items():
            if not inside(caller):
                total += edge[3]
    return total


def _edges(stats: dict[Any, Any], caller_in: Any, callee_in: Any) -> float:
    """Seconds of the calls from functions ``caller_in`` accepts into functions ``callee_in``
    accepts (the callee outside the caller's set)."""
    total = 0.0
    for func, (_, _, _, _, callers) in stats.items():
        if not callee_in(func) or caller_in(func):
            continue
        for caller, edge in callers.items():
            if caller_in(caller):
                total += edge[3]
    return total


def _self_time(stats: dict[Any, Any], inside: Any) -> float:
    """Seconds spent in the functions ``inside`` accepts themselves, and in the built-ins they
    call directly (``len``, ``list.append``): their own work, none of the Python they call."""
    total = 0.0
    for func, (_, _, tottime, _, callers) in stats.items():
        if inside(func):
            total += tottime
        elif func[0] == "~":
            total += sum(edge[2] for caller, edge in callers.items() if inside(caller))
    return total


def _cum(stats: dict[Any, Any], path_part: str, name: str) -> float:
    return sum(v[3] for f, v in stats.items() if path_part in _where(f) and f[2] == name)


def shares(profile: Path) -> dict[str, Any]:
    """The profile's phases and components (module docstring), in seconds and shares of its total."""
    loaded = pstats.Stats(str(profile))
    raw = loaded.stats  # type: ignore[attr-defined]
    total = float(loaded.total_tt)  # type: ignore[attr-defined]
    probes = _cum(raw, "bpo_experiments/runner.py", "probe") + sum(
        edge[3] for f, v in raw.items() if f[2] == "reference_gradient" for c, edge in v[4].items() if c[2] == "initial_job")
    evaluation = _entries(raw, lambda f: "bpo_experiments/evaluation.py" in _where(f))
    initial = _cum(raw, "bpo_experiments/runner.py", "initial_job")
    runs = _cum(raw, "bpo_experiments/runner.py", "run_one")
    report = _cum(raw, "bpo_experiments/compare.py", "write_report")
    eval_in_initial = sum(edge[3] for f, v in raw.items() if f[2] == "evaluate_episodes" for c, edge in v[4].items() if c[2] == "initial_job")
    ref_in_initial = sum(edge[3] for f, v in raw.items() if f[2] == "reference_gradient" for c, edge in v[4].items() if c[2] == "initial_job")
    phases = {
        "start-up": total - initial - runs - report,
        "initial job": initial - eval_in_initial - ref_in_initial,
        "training": runs - (probes - ref_in_initial) - (evaluation - eval_in_initial),
        "evaluation": evaluation,
        "probes": probes,
        "report": report,
    }
    env = _entries(raw, lambda f: _in(f, *ENV))
    backward = _entries(raw, _is_backward)
    policy = _entries(raw, lambda f: _in(f, *POLICY)) - _edges(raw, lambda f: _in(f, *POLICY), _is_backward)
    engine = _self_time(raw, lambda f: _in(f, *ENGINE))
    components = {"env": env, "policy forward": policy, "backward": backward, "engine bookkeeping": engine}
    components["other"] = total - sum(components.values())
    # inside ALFWorld's env (cumulative seconds; they nest: the derivations are inside resets and steps)
    alfworld = {
        "env reset (ALFWorldEnv._reset_task)": _cum(raw, "bpo_envs/alfworld/env.py", "_reset_task"),
        "env step (ALFWorldEnv._step)": _cum(raw, "bpo_envs/alfworld/env.py", "_step"),
        "game loads (AlfredEngine.load)": _cum(raw, "bpo_envs/alfworld/engine.py", "load"),
        "translations read from disk (load_translation)": _cum(raw, "bpo_envs/alfworld/_upstream.py", "load_translation"),
        "admissible commands (PddlEnv._gather_infos)": _cum(raw, "textworld/envs/pddl/pddl.py", "_gather_infos"),
        "grammar derivations (ContextSensitiveGrammar.derive)": max(
            [v[3] for f, v in raw.items() if "textworld/envs/pddl/textgen/__init__.py" in _where(f) and f[2] == "derive"], default=0.0),
        "derivations asked of the cache (StateDerivations)": _cum(raw, "bpo_envs/alfworld/derived.py", "__call__"),
        "handcoded expert (HandcodedExpert)": sum(v[3] for f, v in raw.items() if "bpo_envs/alfworld/expert.py" in _where(f)
                                                  and f[2] in ("update", "__init__", "from_state")),
    }
    return {
        "profiled_seconds": total,
        "phases_seconds": phases,
        "phases_share": {k: v / total for k, v in phases.items()},
        "components_seconds": components,
        "components_share": {k: v / total for k, v in components.items()},
        "alfworld_seconds": {k: v for k, v in alfworld.items() if v},
        "alfworld_share": {k: v / total for k, v in alfworld.items() if v},
    }


SPY_PARTS = {
    # (function name or None for any, a part of its file's path): a sample is in the part when a frame of its stack matches;
    # the phases (initial job, runs, evaluation) hold the main thread's samples only: a pool thread's stack starts at its own loop
    "initial job": [("initial_job", "bpo_experiments/runner.py")],
    "runs": [("run_one", "bpo_experiments/runner.py")],
    "evaluation": [("evaluate_episodes", "bpo_experiments/evaluation.py")],
    "expert demos": [("_expert_demos", "bpo_experiments/build.py")],
    "behaviour cloning": [("behaviour_cloning", "bpo_algos/policy/sft.py")],
    "env (bpo_envs)": [(None, "bpo_envs/")],
    "ALFWorld reset (ALFWorldEnv._reset_task)": [("_reset_task", "bpo_envs/alfworld/env.py")],
    "ALFWorld game loads (AlfredEngine.load)": [("load", "bpo_envs/alfworld/engine.py")],
    "ALFWorld translations read from disk (load_translation)": [("load_translation", "bpo_envs/alfworld/_upstream.py")],
    "ALFWorld step (ALFWorldEnv._step)": [("_step", "bpo_envs/alfworld/env.py")],
    "ALFWorld admissible commands (PddlEnv._gather_infos)": [("_gather_infos", "textworld/envs/pddl/pddl.py")],
    "ALFWorld grammar derivations (textgen derive)": [("derive", "textworld/envs/pddl/textgen/")],
    "ALFWorld handcoded expert": [(None, "bpo_envs/alfworld/expert.py"), (None, "alfworld/agents/expert/")],
    "policy (bpo_algos/policy)": [(None, "bpo_algos/policy/")],
    "backward": [("backward", "torch/_tensor.py"), ("backward", "torch/autograd/__init__.py")],
    "optimizer step": [("step", "torch/optim/")],
}
"""The parts :func:`spy_shares` reports (they nest and overlap: the env inside evaluation inside a run)."""


def _frame(frame: str) -> tuple[str, str]:
    """``(function, file)`` of a py-spy raw frame, ``"Class.function (file:line)"`` (the function's qualified name)."""
    name, _, rest = frame.partition(" (")
    return name, rest.rpartition(":")[0].replace(os.sep, "/")


def spy_shares(raw: Path) -> dict[str, Any]:
    """Shares of the on-CPU samples of a py-spy ``--format raw`` profile (every thread; py-spy
    leaves idle threads out) whose stack holds a frame of each of :data:`SPY_PARTS`."""
    total = 0
    counts = dict.fromkeys(SPY_PARTS, 0)
    for line in raw.read_text().splitlines():
        stack, _, n = line.rpartition(" ")
        if not n.isdigit():
            continue
        frames = [_frame(f) for f in stack.split(";")]
        total += int(n)
        for part, matches in SPY_PARTS.items():
            if any((name is None or f[0] == name or f[0].endswith("." + name)) and where in f[1] for name, where in matches for f in frames):
                counts[part] += int(n)
    return {"samples": total, "share": {k: v / total for k, v in counts.items()} if total else {}}


def _top(profile: Path, path: Path, header: str) -> None:
    with path.open("w") as f:
        f.write(header + "\n\n")
        stats = pstats.Stats(str(profile), stream=f)
        stats.strip_dirs().sort_stats("cumulative").print_stats(60)
        stats.sort_stats("tottime").print_stats(30)


# ---- the parent --------------------------------------------------------------------------------
def _one(code: Path, env: str, extra: list[str], profile: Path | None, scratch: Path, alfworld_default: bool | str = False,
         demos_cache: Path | None = None, spy: tuple[str, Path] | None = None) -> dict[str, Any]:
    out = Path(tempfile.mkdtemp(prefix=f"bench-main-job-{env}-", dir=scratch))
    result_path = out.with_suffix(".json")
    if alfworld_default and env == "alfworld":
        job = ALFWORLD_RUN_JOB if alfworld_default == "run" else ALFWORLD_DEFAULT_JOB
    else:
        job = [*SMALL_JOB, *JOB_ARGS.get(env, [])]
    argv = ["--envs", env, *job, *extra, "--out", str(out / "job")]
    command = [sys.executable, str(Path(__file__).resolve()), "--child", json.dumps(argv), str(result_path), str(profile or "")]
    if spy is not None:  # sampled by py-spy (every thread, 25 a second, without stopping the process)
        command = [spy[0], "record", "--nonblocking", "--rate", "25", "--format", "raw", "-o", str(spy[1]), "--", *command]
    environ = {**os.environ, "PYTHONPATH": str(code)}
    if demos_cache is not None:  # the expert demos' file cache (a checkout without one ignores it)
        environ["BPO_DEMOS_CACHE"] = str(demos_cache)
    before = _uptime()
    t0 = time.perf_counter()
    done = subprocess.run(command, env=environ, cwd=str(code), capture_output=True, text=True, check=False)
    wall = time.perf_counter() - t0
    if done.returncode != 0:
        raise SystemExit(f"the small job failed on {code} ({env}):\n{done.stderr[-4000:]}")
    child = json.loads(result_path.read_text())
    results = json.loads((out / "job" / "results.json").read_text())
    runs = {}
    for run in sorted((out / "job" / "runs").glob("*/*/seed*/run.json")):
        saved = json.loads(run.read_text())
        runs[f"{saved['env']}/{saved['algorithm']}/seed{saved['seed']}"] = {
            k: saved.get(k) for k in ("seconds_cpu", "seconds_eval", "final_success", "warm_success", "evals", "curve", "extra_eval")}
    initial = {}
    for warm in sorted((out / "job" / "runs").glob("*/_initial/seed*/initial.json")):
        saved = json.loads(warm.read_text())
        initial[str(warm.parent.relative_to(out / "job" / "runs"))] = {k: saved.get(k) for k in ("success", "wins", "extra")}
    spied = {"py_spy": {"file": spy[1].name, **spy_shares(spy[1])}} if spy is not None else {}
    return {"process_wall_seconds": wall, **child, **spied, "uptime_before": before, "uptime_after": _uptime(), "runs": runs, "initial": initial,
            "decisions_per_second": child["decisions"] / child["job_seconds"],
            "decisions_per_cpu_second": child["decisions"] / child["cpu_seconds"],
            "env_steps_per_second": child["env_steps"] / child["job_seconds"],
            "job_wall_seconds_reported": results["timing"]["wall_seconds"]}


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        _child(json.loads(sys.argv[2]), Path(sys.argv[3]), Path(sys.argv[4]) if sys.argv[4] else None)
        return
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--code", action="append", help="a checkout whose code runs the job (repeat to alternate; default: this one)")
    parser.add_argument("--labels", nargs="+", help="a name per --code (default: each checkout's git commit)")
    parser.add_argument("--envs", nargs="+", default=["webshop", "alfworld"])
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--no-profile", action="store_true", help="the plain runs only")
    parser.add_argument("--warm-up", action="store_true",
                        help="first run each env's job once, untimed, on the first --code (fills the caches: ALFWorld's game translations)")
    parser.add_argument("--job-args", default="", help="extra bpo-compare flags for every job (one string)")
    parser.add_argument("--out", default="docs/results/bench-main-job")
    parser.add_argument("--alfworld-default", action="store_true",
                        help="ALFWorld's job is the CPU default's initial job (demos, 10 cloning epochs, warm start) and one short RLOO run "
                        "(ALFWORLD_DEFAULT_JOB) instead of the small job without cloning")
    parser.add_argument("--alfworld-run", action="store_true",
                        help="ALFWorld's job is the CPU default's initial job and its full RLOO and frozen runs (ALFWORLD_RUN_JOB)")
    parser.add_argument("--py-spy", metavar="PY_SPY", help="sample each plain run with this py-spy binary (every thread; "
                        "cProfile sees the main thread only): spy-LABEL-ENV-ROUND.txt beside results.json and shares in it")
    parser.add_argument("--demos-cache", help="the expert demos' file cache of every job (default: a new empty folder per job, so "
                        "each collects its demos; a folder kept across jobs measures the jobs after the first with them on disk)")
    args = parser.parse_args()
    alfworld_job: bool | str = "run" if args.alfworld_run else args.alfworld_default
    codes = [Path(c).resolve() for c in (args.code or [Path(__file__).resolve().parents[1]])]
    labels = args.labels or [_git(c) for c in codes]
    if len(labels) != len(codes):
        raise SystemExit(f"{len(codes)} --code but {len(labels)} --labels")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    scratch = Path(tempfile.mkdtemp(prefix="bench-main-job-"))
    extra = args.job_args.split()
    rows: list[dict[str, Any]] = []

    def demos() -> Path:
        return Path(args.demos_cache) if args.demos_cache else Path(tempfile.mkdtemp(prefix="demos-", dir=scratch))
    if args.warm_up:
        for env in args.envs:
            _one(codes[0], env, extra, None, scratch, alfworld_job, demos())
    for r in range(args.rounds):
        for env in args.envs:
            for code, label in zip(codes, labels, strict=True):
                row = {"round": r, "env": env, "label": label, "code": str(code), "commit": _git(code)}
                spy = (args.py_spy, out / f"spy-{label}-{env}-{r}.txt") if args.py_spy else None
                row["plain"] = _one(code, env, extra, None, scratch, alfworld_job, demos(), spy)
                print(f"{label} {env} plain: {row['plain']['job_seconds']:.1f} s ({row['plain']['uptime_before']})", flush=True)
                if not args.no_profile:
                    profile = scratch / f"{label}-{env}-{r}.prof"
                    row["profiled"] = _one(code, env, extra, profile, scratch, alfworld_job, demos())
                    row["profiled"].update(shares(profile))
                    _top(profile, out / f"profile-{label}-{env}.txt",
                         f"cProfile of the small {env} job on {label} ({code}, {row['commit']}), round {r}; {row['profiled']['uptime_before']}")
                    print(f"{label} {env} profiled: {row['profiled']['job_seconds']:.1f} s", flush=True)
                rows.append(row)
    summary: dict[str, Any] = {}
    for env in args.envs:
        walls = {label: [row["plain"]["job_seconds"] for row in rows if row["env"] == env and row["label"] == label] for label in labels}
        cpus = {label: [row["plain"]["cpu_seconds"] for row in rows if row["env"] == env and row["label"] == label] for label in labels}
        summary[env] = {label: {"job_seconds_mean": sum(w) / len(w), "cpu_seconds_mean": sum(cpus[label]) / len(cpus[label])}
                        for label, w in walls.items()}
        if len(labels) >= 2:
            first, last = labels[0], labels[-1]
            for name, values in (("wall", walls), ("cpu", cpus)):
                ratios = [a / b for a, b in zip(values[first], values[last], strict=True)]
                summary[env][f"{name} speed-up {last} over {first}"] = {"per_round": ratios, "mean": sum(ratios) / len(ratios)}
    result = {"small_job": ["bpo-compare", "--envs", "ENV", *SMALL_JOB], "job_args": {**JOB_ARGS, "all": extra}, "warm_up": args.warm_up,
              "alfworld_default_job": ["bpo-compare", "--envs", "alfworld", *ALFWORLD_DEFAULT_JOB] if args.alfworld_default else None,
              "alfworld_run_job": ["bpo-compare", "--envs", "alfworld", *ALFWORLD_RUN_JOB] if args.alfworld_run else None,
              "demos_cache": args.demos_cache or "a new empty folder per job",
              "cpu_count": os.cpu_count(), "rows": rows, "summary": summary}
    (out / "results.json").write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(summary, indent=2))


if __name__ == "__main__":
    main()
