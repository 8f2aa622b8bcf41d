"""``bpo-compare``: the main job. BPO and the baselines at matched compute, over envs and seeds.

For every env and seed, one initial policy (warm-started by behaviour cloning on the env's
expert trajectories where the preset says so) is copied to each algorithm, which then trains
with ``bpo_algos.Trainer`` under the same optimizer, learning rate, task sequence and per-update
budget in one compute unit (``--budget-unit``; the others, flops included, are reported). Every
run's policy is evaluated at update 0 (the warm start) and every ``eval_every`` updates on the
same evaluation episodes (common random numbers). The headline per env is the treatment minus
the comparator fixed before the run (``--comparator``, default rloo), paired by seed, on three
metrics fixed before the run (area under the evaluated-success curve against compute, final
evaluated success, compute to a threshold), each with its 95% interval and minimal detectable
effect; a positive control (``frozen``: a learner with a zero loss) must be detected, and a
handicapped learner (``reinforce``: no baseline) is ranked. Gradient signal-to-noise ratios with
bootstrap intervals are measured at the warm start and mid-training. The formulas:
docs/main-job.md.

Algorithms are looked up by name in ``bpo_algos``'s registry (``--algorithms``; a user's own
with ``--import MODULE`` after ``bpo_algos.register_algorithm``). Writes to ``--out``:
``results.json``, ``results.md`` (controls first, then the headline), PNG plots and one
example rollout tree per env and algorithm (``trees/ENV-ALGORITHM.png``, linked from
``results.md``). ``--jobs N`` runs the independent runs in N processes and ``--ray ADDRESS`` on a
Ray cluster, with the results of ``--jobs 1``; ``--resume`` continues an interrupted run (finished
runs are kept, unfinished ones resume from their last checkpoint); ``--plan`` prints the runs,
their cost and wall time and the effect the preset can detect, without training.

    bpo-compare --plan                           # size the CPU default first
    bpo-compare --out results/compare --jobs 2   # CPU default (see docs/main-job.md for its wall time)
    bpo-compare --smoke --out /tmp/compare       # < 2 min (CI)
    bpo-compare --preset cpu-swe --out /tmp/swe  # SWE-bench end to end on a CPU (tiny LLM)
    bpo-compare --preset gpu --out results/gpu \
        --swe-instances princeton-nlp/SWE-bench_Verified --swe-backend docker   # the paper's setting

Data sources: ``--swe-instances`` (a Verified parquet/jsonl/json, a task-repo folder, or a dataset
name read from the local Hugging Face cache), ``--swe-backend``, ``--swe-images-dir`` (image
tarballs), ``--webshop-data`` and ``--alfworld-data`` (data folders) set the envs' options; the
gpu preset needs the first two (SWE-bench Verified on the docker backend).
"""

from __future__ import annotations

import argparse
import copy
import gc
import importlib
import importlib.util
import inspect
import os
import re
import sys
import time
import uuid
from dataclasses import replace
from functools import partial
from pathlib import Path
from typing import Any

import torch

from bpo_algos import data_parallel as dp
from bpo_algos.registry import registered_algorithms
from bpo_envs.console import ends_on_ctrl_c
from bpo_envs.files import (
    FolderLock,
    FolderLockedError,
    atomic_write,
    read_json_or_redo,
    write_json,
)
from bpo_experiments.build import make_policy
from bpo_experiments.command_line import add_config_flags, check_launch_fits
from bpo_experiments.config import CONFIG_FILE, build_preset, config_of, config_yaml, file_imports
from bpo_experiments.output import (
    check_same_data,
    check_same_settings,
    code_versions,
    initial_dir,
    load_initial,
    note_session,
    run_dir,
    save_initial,
    start_session,
)
from bpo_experiments.parallel import Ready, check_ray_address, execute_as_ready
from bpo_experiments.presets import (
    PRESETS,
    Preset,
    preset_dict,
)
from bpo_experiments.report import PLOTS_WITHOUT_DATA, empty_plots, example_trees, markdown, plots
from bpo_experiments.run_config import (
    ComparisonConfig,
    EnvConfig,
    RunConfig,
    algorithm_spec,
    base_options,
    check_same_config,
    comparison_config,
    env_config,
    run_config,
    tuning_preset,
    with_options,
)
from bpo_experiments.runner import collector_for_jobs, initial_job, run_one
from bpo_experiments.stats import aggregate, run_metrics
from bpo_experiments.tasks import task_order, task_sets, task_split_with_provenance
from bpo_experiments.tuning import DEFAULTS_SUFFIX, decide, tuning_tasks
from bpo_experiments.tuning import label as tuning_label

ALFWORLD_ID = "BPO-ALFWorld-v0"


def _jobs(value: str) -> int:
    try:
        n = int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"--jobs takes a whole number >= 1, got {value!r}") from None
    if n < 1:
        raise argparse.ArgumentTypeError(f"--jobs must be >= 1 (the number of worker processes), got {n}")
    return n


def algorithm_lines(width: int = 120) -> list[str]:
    """``--list-algorithms``: one line per registered algorithm: its name, what it is (the first
    sentence of its docstring, at most ``width`` characters), the flags of its options and the
    options it fixes."""
    from bpo_algos.registry import algorithm_factory

    names = registered_algorithms()
    pad = max(map(len, names), default=0)
    lines = []
    for name in names:
        factory = algorithm_factory(name)
        documented = getattr(factory, "cls", None) or getattr(factory, "build", None) or type(factory)  # Variant / Declared / own class
        text = " ".join((inspect.getdoc(documented) or "").split("\n\n")[0].split())
        wrapped = factory.wraps(factory.Options())
        if wrapped is not None:  # a control: "``frozen``: the algorithm registered as ``of``, ..."
            text = "control: " + text.removeprefix(f"``{name}``: ").replace("the algorithm registered as ``of``", wrapped)
        text = re.sub(r":\w+:`~?([^`]+)`", r"\1", text).replace("``", "")
        text = re.split(r"(?<=[a-z)])\. |: options ", text, maxsplit=1)[0].rstrip(".")
        if len(text) > width:
            text = text[: width - 1].rstrip() + "…"
        extras = [f"--{factory.kind}.OPTION"] if factory.kind and factory.Options.field_names() else []
        extras += [f"{k}={v}" for k, v in factory.fixed.items()]
        lines.append(f"{name:<{pad}}  {text}" + (f" ({'; '.join(extras)})" if extras else ""))
    return lines


def command_parser() -> argparse.ArgumentParser:
    """``bpo-compare``'s own flags (the config dataclasses' flags are added to it by
    :func:`add_config_flags`)."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default="results/compare", help="output folder")
    parser.add_argument("--config", metavar="FILE.yaml", help="every setting from this file (a results folder's config.yaml "
                        "runs that comparison again); the flags override it (docs/main-job.md, 'The configuration file')")
    parser.add_argument("--print-config", action="store_true", help="print the configuration (config.yaml) and exit")
    parser.add_argument("--preset", default=None, choices=sorted(PRESETS), help="the preset the settings start from (default: cpu)")
    parser.add_argument("--smoke", action="store_true", help="the smoke preset (< 2 min; CI: checks the pipeline, not BPO)")
    parser.add_argument("--envs", nargs="+", help="env names (default: the preset's)")
    parser.add_argument("--algorithms", nargs="+", help="registered algorithm names (default: the preset's; see --list-algorithms)")
    parser.add_argument("--import", dest="import_modules", nargs="+", metavar="MODULE",
                        help="modules to import first (they register algorithms with bpo_algos.register_algorithm)")
    parser.add_argument("--treatment", help="the algorithm of the headline, compared with --comparator (default: the preset's, bpo)")
    parser.add_argument("--list-algorithms", action="store_true", help="print the registered algorithms, one line each, and exit")
    parser.add_argument("--swe-instances", help="SWE-bench rows: a .parquet/.jsonl/.json, a task-repo folder, or a "
                        "dataset name in the local Hugging Face cache (default: the bundled repos)")
    parser.add_argument("--swe-train-instances", help="SWE-bench training rows (SWE-Gym, SWE-smith or other SWE-bench-format "
                        "rows: a file, a folder or a cached dataset name); --swe-instances then gives the evaluation rows, "
                        "which must share no instance id")
    parser.add_argument("--swe-disjoint-repos", action="store_true", help="also forbid a repo with both training and evaluation rows")
    parser.add_argument("--swe-backend", choices=("local", "docker"), help="SWE-bench sandbox (the gpu preset: docker)")
    parser.add_argument("--swe-images-dir", help="folder of `docker save` tarballs of the SWE-bench instance images")
    parser.add_argument("--webshop-data", help="WebShop data folder (default: the bundled catalog)")
    parser.add_argument("--alfworld-data", help="ALFWorld data folder (default: $ALFWORLD_DATA, the cache, or generated games)")
    parser.add_argument("--tune", action=argparse.BooleanOptionalAction, default=None,
                        help="tune every algorithm's shape options by the fixed protocol first (docs/main-job.md, 'Tuning'); "
                        "default: the preset's (the cpu preset tunes WebShop)")
    parser.add_argument("--tuning-seeds", type=int, nargs="+", help="tuning seeds (disjoint from the evaluation seeds)")
    parser.add_argument("--tuning-grid", action="append", metavar="KIND=JSON",
                        help='one kind\'s candidates, e.g. rloo=\'[{"group_size": 2}, {"group_size": 4}]\'; repeatable')
    parser.add_argument("--allow-unequal-grids", action="store_true", help="allow tuning grids of different sizes")
    parser.add_argument("--env-server", action="append", metavar="URL",
                        help="step the env that a bpo-serve server at URL serves there (docs/serving.md); repeatable")
    parser.add_argument("--resume", action="store_true", help="continue an interrupted run in --out")
    parser.add_argument("--report-only", action="store_true", help="with --resume: run nothing, report the seeds whose runs "
                        "have all finished (an interrupted comparison; results.json names the unfinished seeds)")
    parser.add_argument("--jobs", type=_jobs, default=None,
                        help="independent runs in this many worker processes (default: the number of cores); the results of --jobs 1")
    parser.add_argument("--ray", metavar="ADDRESS", help="run the runs as Ray tasks on the cluster at ADDRESS (HOST:PORT, "
                        "ray://HOST:PORT, auto, or local to start one here)")
    parser.add_argument("--plan", action="store_true", help="print the runs, their expected compute and wall time and the "
                        "effect the preset can detect, without training")
    parser.add_argument("--plan-from", metavar="RESULTS_JSON", help="--plan: size the run from this saved results.json "
                        "(default: the preset's recorded results, else its recorded pilots, else a short pilot)")
    parser.add_argument("--pilot", action="store_true", help="--plan: size every env by a pilot run now and save the pilots as "
                        "the preset's recorded pilots (what --plan reads where no results are recorded)")
    parser.add_argument("--collect-frozen", action="store_true", help="every update of the positive control frozen collects "
                        "(default: after one checked update it collects nothing and reports its budget as spent; its evaluations, "
                        "budget and final state are the same either way; docs/main-job.md, Scheduling)")
    parser.add_argument("--no-progress", action="store_true")
    return parser


def main(argv: list[str] | None = None) -> dict[str, Any]:
    """Run ``bpo-compare`` holding the lock on ``--out`` (``--out/.lock``): a second comparison
    into the same folder refuses at once, naming the holder's pid (docs/main-job.md)."""
    early = argparse.ArgumentParser(add_help=False)
    early.add_argument("--out", default=command_parser().get_default("out"))
    for flag in ("--plan", "--list-algorithms", "--print-config", "-h", "--help"):
        early.add_argument(flag, action="store_true")
    known = early.parse_known_args(argv)[0]
    reads_only = known.plan or known.list_algorithms or known.print_config or known.h or known.help
    with collector_for_jobs(freeze=False):  # the report's and the schedule's allocations too
        if reads_only or int(os.environ.get("RANK", "0")) != 0:  # under torchrun rank 0 holds it
            return _main(argv)
        try:
            lock = FolderLock(known.out, "another bpo-compare")
            lock.acquire()
        except FolderLockedError as exc:
            raise SystemExit(str(exc)) from None
        try:
            return _main(argv)
        finally:
            lock.release()


def _main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = command_parser()
    # modules named by --import register algorithms (and so flags of their options) first
    imports = argparse.ArgumentParser(add_help=False)
    imports.add_argument("--import", dest="import_modules", nargs="+", default=())
    for module in (*file_imports(argv), *imports.parse_known_args(argv)[0].import_modules):
        importlib.import_module(module)
    holders = add_config_flags(parser)
    args = parser.parse_args(argv)
    if args.list_algorithms:
        print("\n".join(algorithm_lines()))
        return {}
    preset = build_preset(args, holders)
    if args.print_config:
        print(config_yaml(config_of(args, preset)), end="")
        return {}
    # under torchrun every rank runs every run together (data-parallel or FSDP training,
    # evaluations split over the ranks); rank 0 writes the files
    ranks = dp.world_size() if dp.init_from_env() else 1
    if ranks > 1 and ((args.jobs or 1) != 1 or args.ray is not None):
        raise SystemExit(f"under torchrun ({ranks} ranks) every rank takes part in every run: leave --jobs at 1 and --ray unset")
    jobs = 1 if ranks > 1 else (args.jobs or os.cpu_count() or 1)
    if args.ray is not None:
        check_ray_address(args.ray)  # before any run starts
    if args.plan:
        from bpo_experiments.plan import plan

        return plan(preset, jobs, Path(args.plan_from) if args.plan_from else None, progress=not args.no_progress, pilot=args.pilot)
    check_launch_fits(preset, args.preset)
    comparison = _Comparison(args, preset, jobs)
    comparison.prepare_envs()
    comparison.run_jobs()
    return comparison.compare(ranks)


class _Comparison:
    """One invocation of ``bpo-compare`` on its output folder, phase by phase: the initial jobs,
    the tuning runs, the comparison's runs, and the report. Every finished job's result is read
    back from the folder instead of run again (``--resume``)."""

    def __init__(self, args: argparse.Namespace, preset: Preset, jobs: int) -> None:
        self.args, self.preset = args, preset
        self.out = out = Path(args.out)
        if out.exists() and any(p.name != FolderLock.NAME for p in out.iterdir()) and not args.resume:
            raise SystemExit(f"{out} is not empty: pass --resume to continue it, or choose another --out")
        dp.barrier()  # every rank has looked at --out before rank 0 writes into it
        self.writer = dp.rank() == 0
        out.mkdir(parents=True, exist_ok=True)
        saved_preset = read_json_or_redo(out / "preset.json")
        if saved_preset is not None:
            wandb_group = preset.trainer.wandb_group or saved_preset.get("trainer", {}).get("wandb_group")
            preset.trainer = replace(preset.trainer, wandb_group=wandb_group)
        settings = check_same_settings(out, preset, saved_preset)
        if dp.rank() == 0:  # as the user asked for it (before a W&B group is made up for it)
            atomic_write(out / CONFIG_FILE, config_yaml(config_of(args, preset)))
        if preset.trainer.wandb_project and preset.trainer.wandb_group is None:
            # one W&B group per comparison, kept when it resumes
            preset.trainer = replace(preset.trainer, wandb_group=f"{out.resolve().name}-{uuid.uuid4().hex[:8]}")
        self.comparison = comparison = comparison_config(preset)
        """The comparison's settings, resolved (:mod:`bpo_experiments.run_config`)."""
        if preset.torch_threads:
            torch.set_num_threads(preset.torch_threads)
        self.started = time.perf_counter()
        # the tasks, and which data and split make these numbers (generator + version, or files +
        # hash): the same for every seed and algorithm, so drawn once per env
        self.splits = {env_name: task_split_with_provenance(setup) for env_name, setup in preset.envs.items()}
        self.data = {env_name: split[2] for env_name, split in self.splits.items()}
        check_same_data(out, self.data)
        if self.writer:
            write_json(out / "preset.json", preset_dict(preset), indent=2)
            for env_name, setting in settings.items():
                (out / "runs" / env_name).mkdir(parents=True, exist_ok=True)
                write_json(out / "runs" / env_name / "setting.json", setting, indent=2)
            write_json(out / "data.json", {**read_json_or_redo(out / "data.json", {}), **self.data}, indent=2)
        self.modules = tuple(args.import_modules or ())
        self.progress = not args.no_progress and sys.stderr.isatty()
        self.workers = 1 if args.ray is None and jobs == 1 else jobs
        self.session = start_session(out, self.workers, bool(args.resume)) if self.writer else None
        self.kinds = comparison.kinds
        tuning = preset.tuning
        self.tuned_envs = [e for e in preset.envs if tuning is not None and tuning.tunes(e)]
        # the tuning criterion's held-out training tasks (never an evaluation task) and its setting
        self.tune_tasks = {e: tuning_tasks(task_order(preset.envs[e]), self.splits[e][0], self.splits[e][1], tuning.tasks)
                           for e in self.tuned_envs}
        self.tune_preset = {e: tuning_preset(preset, e) for e in self.tuned_envs}
        self.tune_envs = {e: env_config(self.tune_preset[e], e) for e in self.tuned_envs}
        self.pairs = [(e, s) for e in preset.envs for s in comparison.envs[e].seeds]
        self.tune_pairs = [(e, s) for e in self.tuned_envs for s in tuning.seeds]
        self.initials: dict[tuple[str, int], dict[str, Any]] = {}
        self.runs: dict[tuple[str, str, int], dict[str, Any]] = {}

    def _bar(self, total: int, desc: str) -> Any:
        from tqdm.auto import tqdm

        return tqdm(total=total, desc=desc, disable=self.args.no_progress or not total)

    def prepare_envs(self) -> None:
        """What the envs need before their first episode and make slowly one at a time: ALFWorld's
        game translations (:mod:`bpo_envs.alfworld.translations`), made here for every game the
        comparison plays, in the ``--jobs`` workers, with a progress bar (docs/main-job.md,
        "Scheduling")."""
        if self.args.report_only:
            return
        from bpo_envs.alfworld.translations import make_translations

        for env_name, setup in self.preset.envs.items():
            if setup.env_id != ALFWORLD_ID:
                continue
            train_tasks, eval_tasks = self.splits[env_name][0], self.splits[env_name][1]
            tuning = list(dict.fromkeys(t for e, _ in self.tune_pairs if e == env_name for t in self.tune_tasks[e]))  # training env's
            for kwargs, tasks in task_sets(setup, [*train_tasks, *(t for t in tuning if t not in train_tasks)], eval_tasks):
                made = make_translations(kwargs, tasks, self.workers, progress=not self.args.no_progress)
                if made:
                    print(f"{env_name}: translated {made} ALFWorld games ({kwargs.get('split', 'train')})", file=sys.stderr)

    def run_jobs(self) -> None:
        """The initial jobs, the tuning runs and the comparison's runs in one schedule
        (docs/main-job.md, "Scheduling"): every job starts as soon as what it needs exists and a
        worker is free. A seed's runs start when its own initial job ends; a tuned env's
        comparison runs when its tuning has chosen (its tuning runs when their seed's initial job
        ends). Free workers take tuning first (it gates a whole env), then the seeds whose
        remaining work is longest (their initial job, then their runs, longest first), so with
        ``--jobs 1`` whole seeds finish one after the other. Jobs already in the folder are read
        back instead (``--resume``); under ``--report-only`` nothing new runs."""
        preset, tuning = self.preset, self.preset.tuning
        self.tuned = copy.deepcopy(preset)
        self.tuning_results: dict[str, dict[str, Any]] = {}
        self.same: set[tuple[str, str]] = set()
        self.tuned_kinds = [k for k in dict.fromkeys(self.kinds.values()) if tuning is not None and k in tuning.grids]
        # a kind's grid without the options the user pinned (TuningConfig.grid): a grid the pins
        # leave with one candidate has nothing to choose and runs none
        self.candidates = {(e, k): list(tuning.grid(k)) for e in self.tuned_envs for k in self.tuned_kinds}
        self.default_labels = [a + DEFAULTS_SUFFIX for a in (preset.treatment, preset.comparator)
                               if self.kinds.get(a) in self.tuned_kinds]
        self.default_seeds = {e: list(self.comparison.envs[e].seeds)[: tuning.default_seeds] for e in self.tuned_envs}
        tuning_runs: dict[tuple[str, int], list[tuple[tuple[str, str, int], Preset, list[Any]]]] = {}
        for (env_name, kind), grid in self.candidates.items():
            if len(grid) < 2:
                continue
            for i, candidate in enumerate(grid):
                run_preset = with_options(self.tune_preset[env_name], env_name, kind, candidate)
                for s in tuning.seeds:
                    tuning_runs.setdefault((env_name, s), []).append(((env_name, tuning_label(kind, i), s), run_preset, self.tune_tasks[env_name]))
        self.tuning_keys = [key for runs in tuning_runs.values() for key, _, _ in runs]
        waiting = {e: {key for key in self.tuning_keys if key[0] == e} for e in self.tuned_envs}
        chosen = {e for e in preset.envs if e not in self.tuned_envs}
        envs = self.comparison.envs
        chain = {pair: sum(_expected_cost(envs[pair[0]], a) for a in preset.algorithms) for pair in self.pairs}
        rank = {pair: i for i, pair in enumerate(sorted(self.pairs, key=lambda p: -chain[p]))}
        todo_bar = self._bar(0, "jobs")

        def priority(pair: tuple[str, int], cost: float = 0.0) -> tuple[Any, ...]:
            return (0, 0, -cost) if pair in self.tune_pairs else (1, rank[pair], -cost)

        def ready_runs(items: list[tuple[tuple[str, str, int], Preset, list[Any]]]) -> list[Ready]:
            out: list[Ready] = []
            loaded = []
            for key, run_preset, eval_tasks in items:
                config = run_config(run_preset, *key, len(self.splits[key[0]][0]))
                check_same_config(run_dir(self.out, *key), config)  # a saved run was made with this configuration
                saved_run = read_json_or_redo(run_dir(self.out, *key) / "run.json")
                if saved_run is not None:
                    self.runs[key] = saved_run
                    loaded.append(key)
                else:
                    out.append(Ready(priority((key[0], key[2]), _expected_cost(envs[key[0]], key[1])), ("run", key),
                                     self._run_call(config, eval_tasks)))
            for key in loaded:
                out += tuning_progress(key)
            return out

        def comparison_runs(pair: tuple[str, int]) -> list[tuple[tuple[str, str, int], Preset, list[Any]]]:
            e, s = pair
            work = [((e, a, s), self.tuned, self.splits[e][1]) for a in preset.algorithms]
            work += [((e, a, s), preset, self.splits[e][1]) for a in self.default_labels
                     if s in self.default_seeds.get(e, ()) and (e, a) not in self.same]
            return work

        def tuning_progress(key: tuple[str, str, int]) -> list[Ready]:
            """A finished tuning run: when it was its env's last, the env's choice and then
            the comparison runs of its seeds whose initial job has ended."""
            e = key[0]
            if e not in waiting or key not in waiting[e]:
                return []
            waiting[e].discard(key)
            if waiting[e]:
                return []
            self._choose(e)
            chosen.add(e)
            return [r for s in envs[e].seeds if (e, s) in self.initials for r in ready_runs(comparison_runs((e, s)))]

        def after_initial(pair: tuple[str, int]) -> list[Ready]:
            if pair in self.tune_pairs:
                return ready_runs(tuning_runs.get(pair, []))
            return ready_runs(comparison_runs(pair)) if pair[0] in chosen else []

        def finished(key: Any, value: dict[str, Any]) -> list[Ready]:
            kind, item = key
            if kind == "initial":
                if self.writer:
                    save_initial(initial_dir(self.out, *item), value)
                self.initials[item] = value
                made = after_initial(item)
            else:
                done = run_dir(self.out, *item) / "run.json"
                if self.writer and not done.exists():  # a run on another machine (Ray): its result comes back here
                    done.parent.mkdir(parents=True, exist_ok=True)
                    write_json(done, value)
                self.runs[item] = value
                todo_bar.set_postfix(env=item[0], algorithm=item[1], seed=item[2])
                made = tuning_progress(item)
            todo_bar.update(1)
            note_session(self.out, self.session)
            return grow(made)

        def grow(items: list[Ready]) -> list[Ready]:
            if items:
                todo_bar.total += len(items)
                todo_bar.refresh()
            return [] if self.args.report_only else items

        first: list[Ready] = []
        for env_name, seed in self.tune_pairs + self.pairs:
            loaded = load_initial(initial_dir(self.out, env_name, seed))
            if loaded is not None:
                self.initials[(env_name, seed)] = loaded
                continue
            tuning_seed = (env_name, seed) in self.tune_pairs
            train_tasks = self.splits[env_name][0]
            eval_tasks = self.tune_tasks[env_name] if tuning_seed else self.splits[env_name][1]
            job_env = self.tune_envs[env_name] if tuning_seed else envs[env_name]
            first.append(Ready(priority((env_name, seed)), ("initial", (env_name, seed)),
                               (initial_job, (job_env, seed, train_tasks, eval_tasks))))
        for e in self.tuned_envs:  # an env with no candidate to run chooses at once
            if not waiting[e]:
                self._choose(e)
                chosen.add(e)
        for pair in self.tune_pairs + self.pairs:
            if pair in self.initials:
                first += after_initial(pair)
        first = grow(first)
        execute_as_ready(first, self.workers, self.args.ray, self.modules, finished)
        todo_bar.close()
        missing = [key for key in self.tuning_keys if key not in self.runs]
        if missing:
            raise SystemExit(f"--report-only: the tuning has not finished ({len(missing)} tuning run(s) missing, e.g. {missing[0]})")

    def _choose(self, env_name: str) -> None:
        """Tuning's decision on ``env_name`` (every tuning run of it finished), per kind
        (:func:`~bpo_experiments.tuning.decide`): the best candidate by the criterion where the
        one-way F-test tells the candidates apart, else the defaults, into :attr:`tuned`;
        recorded in :attr:`tuning_results` with the options the user pinned."""
        preset, tuning = self.preset, self.preset.tuning
        for (e, kind), grid in self.candidates.items():
            if e != env_name:
                continue
            per_seed: list[list[float]] = [[]]
            if len(grid) > 1:
                per_seed = [[run_metrics(self.runs[(e, tuning_label(kind, i), s)], self.tune_envs[e])[tuning.criterion]
                             for s in tuning.seeds] for i in range(len(grid))]
                record = decide(per_seed, grid, base_options(preset, e, kind), tuning.alpha)
            else:  # every option of the grid pinned by the user: nothing to choose
                record = {"scores": [None], "chosen": grid[0], "chosen_index": 0, "best_index": 0, "kept_defaults": False,
                          "distinguishable": None, "f_test": None, "detectable_difference": None,
                          "decision": "every tuned option is fixed by the user: nothing to tune"}
            if not record["kept_defaults"]:  # a choice only where the tuning told the candidates apart
                self.tuned = with_options(self.tuned, e, kind, record["chosen"])
            record = self.tuning_results.setdefault(e, {})[kind] = {
                "algorithms": [a for a, k in self.kinds.items() if k == kind],
                "candidates": grid, "scores_per_seed": per_seed, **record,
                "seeds": list(tuning.seeds), "criterion": f"{tuning.criterion} of evaluated success on {len(self.tune_tasks[e])} "
                f"held-out training tasks x {tuning.episodes} episode(s)", "tasks": len(self.tune_tasks[e]),
            }
            if tuning.pinned.get(kind):
                record["fixed_by_user"] = dict(tuning.pinned[kind])
                record["grid"] = list(tuning.grids[kind])
        self.same |= {(env_name, a) for a in self.default_labels
                      if algorithm_spec(a.split("@")[0], preset, 0, env_name).build().config()
                      == algorithm_spec(a.split("@")[0], self.tuned, 0, env_name).build().config()}

    def _run_call(self, config: RunConfig, eval_tasks: list[Any]) -> Any:
        """The call of run ``config`` (its initial policy: the initial job's bytes, or rebuilt
        from the run's policy settings where it is an LLM's)."""
        init = self.initials[(config.env, config.seed)]
        train_tasks = self.splits[config.env][0]
        rebuild = partial(make_policy, config.policy, config.setup, config.seed, train_tasks)
        return (run_one, (self.out, config, init["policy"], init["warm"], init["reference"], train_tasks, eval_tasks,
                          self.progress and self.workers == 1, rebuild, not self.args.collect_frozen))

    def compare(self, ranks: int) -> dict[str, Any]:
        """The results and the report, from the runs: every algorithm at its tuned options (the
        controls at their algorithm's), and the treatment and the comparator at their defaults (a
        default equal to the tuned choice is the tuned run itself)."""
        preset, runs, tuned_envs, tuned = self.preset, self.runs, self.tuned_envs, self.tuned
        default_labels, default_seeds, same, tuning_results = self.default_labels, self.default_seeds, self.same, self.tuning_results
        for e, s in self.pairs:
            for a in default_labels:
                if (e, a) in same and s in default_seeds[e] and (e, a.split("@")[0], s) in runs:
                    runs[(e, a, s)] = {**runs[(e, a.split("@")[0], s)], "algorithm": a, "same_as_tuned": True}
        envs = self.comparison.envs
        finished = {e: [s for s in envs[e].seeds if all((e, a, s) in runs for a in preset.algorithms)] for e in preset.envs}
        reported: ComparisonConfig = comparison_config(tuned)  # the tuned options (the seeds as the comparison's)
        if self.args.report_only:  # the seeds whose every run has finished
            unfinished = {e: [s for s in envs[e].seeds if s not in finished[e]] for e in preset.envs}
            if not all(len(v) >= 2 for v in finished.values()):
                raise SystemExit(f"--report-only: fewer than 2 finished seeds per env ({finished})")
            reported = reported.with_seeds({e: tuple(v) for e, v in finished.items()})
        keys = [(e, a, s) for e in preset.envs for s in finished[e] for a in preset.algorithms]
        default_keys = [(e, a, s) for e in tuned_envs for a in default_labels for s in default_seeds[e] if (e, a, s) in runs and s in finished[e]]
        ordered = [runs[k] for k in keys] + [runs[k] for k in default_keys]
        results = aggregate(ordered, reported, list(preset.envs), [*preset.algorithms, *default_labels])
        if self.args.report_only:
            results["unfinished_seeds"] = unfinished
        if not self.writer:  # rank 0 reports
            return results
        results["preset"] = preset_dict(preset)  # as given (the tuned options are under per_env[env]["tuning"])
        results["base_preset"] = self.args.preset  # the preset config.yaml starts from (the smoke report says what it is)
        results["example_trees"] = example_trees([runs[k] for k in keys], self.out)
        for env_name in preset.envs:
            results["per_env"][env_name]["data"] = self.data[env_name]
            if env_name in tuning_results:
                results["per_env"][env_name]["tuning"] = tuning_results[env_name]
        tuning_runs = [r for k, r in runs.items() if "@tune" in k[1]]
        results["code_versions"] = code_versions(self.initials.values(), [*ordered, *tuning_runs], self.out)
        results["timing"] = self._timing(ordered, tuning_runs, ranks)
        write_report(results, self.out)
        return results

    def _timing(self, ordered: list[dict[str, Any]], tuning_runs: list[dict[str, Any]], ranks: int) -> dict[str, Any]:
        """``results["timing"]``: this session's and every session's wall time, and the jobs' own."""
        sessions = note_session(self.out, self.session)
        return {
            "wall_seconds": time.perf_counter() - self.started,
            "total_wall_seconds": float(sum(s["wall_seconds"] for s in sessions)),
            "sessions": sessions,
            "jobs": self.workers,
            "ranks": ranks,
            "ray": self.args.ray,
            "cpu_count": os.cpu_count(),
            "resumed": len(sessions) > 1,
            "run_seconds_total": float(sum(r["seconds"] for r in ordered)),
            "tuning_run_seconds_total": float(sum(r["seconds"] for r in tuning_runs)),
            "initial_seconds_total": float(sum(i["warm"].get("seconds_build", 0.0) + i["warm"].get("seconds_eval", 0.0)
                                               + i["warm"].get("seconds_reference", 0.0) for i in self.initials.values())),
        }


def write_report(results: dict[str, Any], out: Path) -> None:
    """``results.json``, ``results.md`` and the plots into ``out``; the Markdown is printed too."""
    results[PLOTS_WITHOUT_DATA] = empty_plots(results)
    write_json(out / "results.json", results, indent=2)
    atomic_write(out / "results.md", markdown(results))
    written = plots(results, out) + [out / p for pictures in results["example_trees"].values() for p in pictures.values()]
    print(markdown(results))
    print(f"wrote {out / 'results.json'}, {out / 'results.md'}, " + ", ".join(str(p) for p in written))


def _expected_cost(env: EnvConfig, algorithm: str) -> float:
    """A rough relative cost of a run, to start the longest first (order never changes results)."""
    tree_heavy = 3.0 if "tree" in algorithm else 1.0
    return env.horizon * tree_heavy * (3.0 if "alfworld" in env.name else 1.0)


@ends_on_ctrl_c("bpo-compare", resumable=True)
def cli() -> None:
    """Console entry point (``bpo-compare``)."""
    main()
    # the process ends here: what is left is freed with it, so the interpreter's final full
    # collection (about 0.7 s of CPU after a small WebShop job) has nothing to walk
    gc.freeze()


if __name__ == "__main__":
    cli()
