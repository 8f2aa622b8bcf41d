"""ALFWorld's positive control per setting: which setting makes RLOO rise above its warm start
within the CPU default's 12 updates, so that ``frozen`` − ``rloo`` is detected with few seeds.

Reads the pilots' ``bpo-compare`` folders (``--runs``: each variant's folder under it; outputs stay
outside the repository) and the committed default run, and writes
``docs/results/alfworld-control-pilots/pilots.json`` and ``pilots.md`` (docs/alfworld.md, "A control
the default can see", reads them). Per seed, from the RLOO run's ``evals.json`` and the initial
job's ``initial.json``: the AUC of ``valid_seen`` success (``bpo_experiments.stats.curve_metrics``
over ``updates x budget`` env steps), ``frozen``'s AUC (its curve is the warm start's at every
point, docs/main-job.md "`frozen`'s evaluations"; measured where its run finished), the control
``frozen − rloo``, RLOO's final − warm; per setting ``paired_difference`` of the controls and
``power`` / ``minimal_detectable_effect`` at 3-6 seeds at the measured spread and effect
(``bpo_experiments.significance``). Where a variant names the logs of its invocations (one seed
added per invocation, under ``/usr/bin/time -v``), its CPU seconds per seed; the load average over
each session from ``sessions.json`` and, where given, a once-a-minute ``/proc/loadavg`` log.

    python studies/alfworld_control_pilots.py --runs /work/runs
"""

from __future__ import annotations

import argparse
import json
import re
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

from bpo_experiments.significance import minimal_detectable_effect, power
from bpo_experiments.stats import curve_metrics, paired_difference

OUT = Path("docs/results/alfworld-control-pilots")
BASELINE = Path("docs/results/compare-cpu-alfworld/results.json")
SEED_COUNTS = (3, 4, 5, 6)
PRINT_CONFIG = ("`bpo-compare --envs alfworld --algorithms rloo frozen --treatment rloo --comparator frozen --print-config`")

VARIANTS: dict[str, dict[str, Any]] = {
    "e2": {
        "folder": "alfctl/e2", "sft_epochs": 2, "learning_rate": 1e-3, "epochs": 1, "budget": 800,
        "command": f"bpo-compare --config e2.yaml --seeds 0 --jobs 1 --out e2   (e2.yaml: {PRINT_CONFIG} with envs.alfworld.sft_epochs 2)",
    },
    "e2lr10": {
        "folder": "alfctl/e2lr10", "sft_epochs": 2, "learning_rate": 1e-2, "epochs": 1, "budget": 800,
        "command": ("bpo-compare --config e2lr10.yaml --seeds 0 1 --jobs 1 --out e2lr10   (e2.yaml with envs.alfworld.trainer.learning_rate "
                    "0.01; seed 0's initial job copied from e2: it does not depend on the RL learning rate; seed 1's frozen run was stopped "
                    "unfinished: frozen's curve is the warm start's by construction, as seed 0's finished frozen run shows)"),
    },
    "lr3": {
        "folder": "alfctl-lr3", "sft_epochs": 10, "learning_rate": 3e-3, "epochs": 1, "budget": 800,
        "command": (f"nice -n 15 bpo-compare --config lr3.yaml --seeds 0 [1 [2]] --jobs 1 --no-progress --out alfctl-lr3 [--resume]   "
                    f"(lr3.yaml: {PRINT_CONFIG} with envs.alfworld.trainer.learning_rate 0.003; one invocation per seed added, "
                    "each under /usr/bin/time -v; seed 2's initial job copied from the committed default run's folder: seeds 0 and 1's, "
                    "made here, are byte-identical to that run's (policy.pt and every evaluation episode), so the initial job does not "
                    "depend on the RL learning rate)"),
        "logs": "alfctl2/lr3.*.log", "loadavg": "alfctl2/loadavg.log", "initial_copied": [2],
    },
    "lr3b1600": {
        "folder": "alfctl-lr3b1600", "sft_epochs": 10, "learning_rate": 3e-3, "epochs": 1, "budget": 1600,
        "command": (f"nice -n 15 bpo-compare --config lr3b1600.yaml --seeds 0 [1 [2]] --jobs 1 --no-progress --out alfctl-lr3b1600 --resume   "
                    f"(lr3b1600.yaml: {PRINT_CONFIG} with envs.alfworld.trainer.learning_rate 0.003 and envs.alfworld.budget 1600; "
                    "one invocation per seed added, each under /usr/bin/time -v; the initial jobs of seeds 0-2 copied from alfctl-lr3: "
                    "the initial job does not depend on the RL learning rate or the budget (no probes on ALFWorld))"),
        "logs": "alfctl2/lr3b1600.*.log", "loadavg": "alfctl2/loadavg.log", "initial_copied": [0, 1, 2],
    },
}


def _cpu_seconds(log: Path) -> float | None:
    """User + system CPU seconds of one invocation, from ``/usr/bin/time -v``'s lines."""
    text = log.read_text(errors="replace")
    user = re.search(r"User time \(seconds\): ([0-9.]+)", text)
    system = re.search(r"System time \(seconds\): ([0-9.]+)", text)
    return float(user.group(1)) + float(system.group(1)) if user and system else None


def _load_range(samples: list[tuple[datetime, float]], start: datetime, seconds: float) -> list[float] | None:
    inside = [v for t, v in samples if start <= t <= start + timedelta(seconds=seconds)]
    return [min(inside), max(inside)] if inside else None


def sessions(folder: Path, logs: list[Path], loadavg: Path | None) -> list[dict[str, Any]]:
    """Each invocation on ``folder``: its start, wall seconds, CPU seconds (its log, by order) and
    the 1-minute load average over it (at start and end; min and max of the minute samples)."""
    saved = json.loads((folder / "sessions.json").read_text())
    samples: list[tuple[datetime, float]] = []
    if loadavg is not None and loadavg.exists():
        for line in loadavg.read_text().splitlines():
            parts = line.split()
            if len(parts) >= 2:
                samples.append((datetime.fromisoformat(parts[0].replace("Z", "+00:00")), float(parts[1])))
    out = []
    for i, s in enumerate(saved):
        start = datetime.fromisoformat(s["started"].replace("Z", "+00:00"))
        row = {"started": s["started"], "wall_seconds": s["wall_seconds"], "load_start": s["load_start"][0], "load_end": s.get("load_now", [None])[0],
               "load_1min_range": _load_range(samples, start, s["wall_seconds"]),
               "cpu_seconds": _cpu_seconds(logs[i]) if i < len(logs) else None}
        out.append(row)
    return out


def per_seed(folder: Path, horizon: float) -> list[dict[str, Any]]:
    rows = []
    base = folder / "runs" / "alfworld"
    for run in sorted((base / "rloo").glob("seed*"), key=lambda p: int(p.name[4:])):
        if not (run / "run.json").exists():
            continue
        seed = int(run.name[4:])
        ev = json.loads((run / "evals.json").read_text())
        x = [e["compute"]["env_steps"] for e in ev]
        y = [e["success"] for e in ev]
        m = curve_metrics(x, y, horizon, 0.5)
        r = json.loads((run / "run.json").read_text())
        init = json.loads((base / "_initial" / f"seed{seed}" / "initial.json").read_text())
        unseen_final = (r.get("extra_eval") or {}).get("valid_unseen", {}).get("final")
        unseen_warm = (init.get("extra") or {}).get("valid_unseen", {}).get("success")
        frozen = base / "frozen" / f"seed{seed}" / "run.json"
        frozen_run = json.loads(frozen.read_text()) if frozen.exists() else None
        frozen_auc = None
        if frozen_run is not None:
            fev = frozen_run["evals"]
            frozen_auc = curve_metrics([e["compute"]["env_steps"] for e in fev], [e["success"] for e in fev], horizon, 0.5)["auc"]
        rows.append({
            "seed": seed, "warm_valid_seen": y[0], "warm_valid_unseen": unseen_warm,
            "rloo_curve_valid_seen": y, "eval_updates": [e["update"] for e in ev],
            "rloo_auc": m["auc"], "frozen_auc": frozen_auc if frozen_auc is not None else y[0],
            "frozen_auc_measured": frozen_auc is not None,
            "control_frozen_minus_rloo_auc": (frozen_auc if frozen_auc is not None else y[0]) - m["auc"],
            "rloo_final_minus_warm": m["final"] - y[0],
            "rloo_valid_unseen_final_minus_warm": None if unseen_final is None or unseen_warm is None else unseen_final - unseen_warm,
            "seconds_initial_build": init.get("seconds_build"), "seconds_initial_eval": init.get("seconds_eval"),
            "seconds_rloo_run": r.get("seconds"), "seconds_rloo_eval": r.get("seconds_eval"),
            "seconds_frozen_run": frozen_run.get("seconds") if frozen_run is not None else None,
        })
    return rows


def summary(rows: list[dict[str, Any]]) -> dict[str, Any]:
    c = [r["control_frozen_minus_rloo_auc"] for r in rows]
    g = [r["rloo_final_minus_warm"] for r in rows]
    out: dict[str, Any] = {"control": paired_difference(c), "rloo_final_minus_warm": paired_difference(g)}
    d = out["control"]
    if len(c) >= 2 and d["sd"] > 0:
        out["control_power_at"] = {n: power(abs(d["diff"]), d["sd"], n) for n in SEED_COUNTS}
        out["control_mde_at"] = {n: minimal_detectable_effect(d["sd"], n) for n in SEED_COUNTS}
    return out


def baseline() -> dict[str, Any]:
    r = json.loads(BASELINE.read_text())
    pe = r["per_env"]["alfworld"]
    pc = pe["positive_control"]
    g = pe["splits"]["valid_seen"]["algorithms"]["rloo"]["vs_warm_start"]
    rows = [{"seed": s, "warm_valid_seen": w, "control_frozen_minus_rloo_auc": c, "rloo_final_minus_warm": gg, "seconds_rloo_run": None}
            for s, w, c, gg in zip(pe["seeds"], pe["warm_start"]["per_seed"], pc["diff_per_seed"], g["diff_per_seed"], strict=True)]
    return {"sft_epochs": 10, "learning_rate": 1e-3, "epochs": 1, "budget": 800,
            "source": f"{BASELINE} (the committed default, 4 algorithms, --jobs 2, load 3-10)",
            "rloo_seconds_per_run_mean": pe["algorithms"]["rloo"]["seconds_per_run"], "per_seed": rows, **summary(rows)}


def label(v: dict[str, Any], default: bool = False) -> str:
    parts = [f"sft_epochs {v['sft_epochs']}", f"lr {v['learning_rate']:g}" if not default else "lr 1e-3"]
    if v.get("epochs", 1) != 1:
        parts.append(f"epochs {v['epochs']}")
    if v.get("budget", 800) != 800:
        parts.append(f"budget {v['budget']}")
    return ", ".join(parts) + (" (committed default)" if default else "")


def _fmt(x: float | None, f: str = "{:+.3f}") -> str:
    return "" if x is None else f.format(x)


def markdown(data: dict[str, Any]) -> str:
    lines = ["# ALFWorld positive-control pilots", "",
             "frozen − rloo on the primary metric (AUC of `valid_seen` success over 7 evaluation points), per seed; "
             "RLOO's final `valid_seen` success − its warm start; seconds are wall time on the shared 2-core machine "
             "(`--jobs 1`; `e2` and `e2lr10` at nice 10 under load average 5-14, the later pilots at nice 15 with their load in the cost table). Made by `studies/alfworld_control_pilots.py` from the pilots' folders "
             "(their commands in `pilots.json`; outputs outside the repository); "
             "each seed's AUC is `bpo_experiments.stats.curve_metrics` of its RLOO run's `evals.json` (horizon updates x budget env steps: "
             "9,600 at the default's 800 a update), frozen's the warm start's (measured where its run finished). docs/alfworld.md reads them.", "",
             "| setting | seed | warm start valid_seen | frozen − rloo AUC | rloo final − warm | rloo curve (updates 0, 2, ..., 12) | initial job s | rloo run s |",
             "|---|---:|---:|---:|---:|---|---:|---:|"]
    b = data["baseline"]
    for r in b["per_seed"]:
        lines.append(f"| {label(b, True)} | {r['seed']} | {r['warm_valid_seen']:.3f} | {_fmt(r['control_frozen_minus_rloo_auc'])} | "
                     f"{_fmt(r['rloo_final_minus_warm'])} | | | |")
    for v in data["variants"].values():
        for r in v["per_seed"]:
            curve = ", ".join(f"{y:.3f}" for y in r["rloo_curve_valid_seen"])
            lines.append(f"| {label(v)} | {r['seed']} | {r['warm_valid_seen']:.3f} | "
                         f"{_fmt(r['control_frozen_minus_rloo_auc'])} | {_fmt(r['rloo_final_minus_warm'])} | {curve} | "
                         f"{_fmt((r['seconds_initial_build'] or 0) + (r['seconds_initial_eval'] or 0), '{:.0f}')} | {_fmt(r['seconds_rloo_run'], '{:.0f}')} |")
    lines += ["", "| setting | seeds | frozen − rloo AUC (95% CI) | sd | rloo final − warm (95% CI) | power at 3 / 4 / 5 / 6 seeds (at this spread and effect) |",
              "|---|---:|---:|---:|---:|---|"]
    for name, v in [("", b)] + list(data["variants"].items()):
        c, g = v["control"], v["rloo_final_minus_warm"]
        ci = "n/a (1 seed)" if c["n"] < 2 else f"± {c['diff_ci95']:.3f}"
        gci = "n/a" if g["n"] < 2 else f"± {g['diff_ci95']:.3f}"
        pw = " / ".join(f"{v['control_power_at'][n]:.2f}" for n in SEED_COUNTS) if "control_power_at" in v else "n/a"
        sd = "n/a" if c["n"] < 2 else f"{c['sd']:.4f}"
        lines.append(f"| {label(v, not name)} | {c['n']} | {c['diff']:+.4f} {ci} | {sd} | {g['diff']:+.3f} {gci} | {pw} |")
    costed = {n: v for n, v in data["variants"].items() if v.get("sessions")}
    if costed:
        lines += ["", "Cost per seed where it was measured (one invocation per seed added: its initial job, RLOO run and frozen run; "
                  "CPU seconds from `/usr/bin/time -v`, user + system; load: the 1-minute load average over the invocation, "
                  "at start and end, and its range sampled once a minute):", "",
                  "| setting | invocation | seed added | its initial job | CPU s | wall s | load start / end | load range |", "|---|---:|---:|---|---:|---:|---|---|"]
        for v in costed.values():
            for i, s in enumerate(v["sessions"]):
                rng = "" if s["load_1min_range"] is None else f"{s['load_1min_range'][0]:.1f}-{s['load_1min_range'][1]:.1f}"
                end = "" if s["load_end"] is None else f"{s['load_end']:.1f}"
                made = "copied" if s.get("initial_job_copied") else "made"
                lines.append(f"| {label(v)} | {i} | {s.get('seed_added', '')} | {made} | {_fmt(s['cpu_seconds'], '{:.0f}')} | {s['wall_seconds']:.0f} | "
                             f"{s['load_start']:.1f} / {end} | {rng} |")
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=Path, default=Path("/work/runs"), help="the folder holding the variants' folders and logs")
    parser.add_argument("--only", nargs="*", default=None, help="variants to write (default: every one whose folder exists)")
    args = parser.parse_args()
    data: dict[str, Any] = {
        "about": "ALFWorld positive-control pilots (docs/alfworld.md, 'A control the default can see'): frozen \u2212 rloo AUC "
                 "on valid_seen (140 games x 1 episode, 7 evaluation points, common random numbers), paired by seed",
        "baseline": baseline(), "variants": {}}
    for name, v in VARIANTS.items():
        folder = args.runs / v["folder"]
        if (args.only is not None and name not in args.only) or not (folder / "runs").exists():
            continue
        horizon = 12 * v["budget"]
        rows = per_seed(folder, horizon)
        entry = {k: v[k] for k in ("sft_epochs", "learning_rate", "epochs", "budget", "command")}
        entry.update(per_seed=rows, **summary(rows))
        if "logs" in v:
            logs = sorted(args.runs.glob(v["logs"]))
            entry["sessions"] = sessions(folder, logs, args.runs / v["loadavg"] if "loadavg" in v else None)
            for i, s in enumerate(entry["sessions"]):
                s["seed_added"] = rows[i]["seed"] if i < len(rows) else None
                s["initial_job_copied"] = s["seed_added"] in v.get("initial_copied", [])
        data["variants"][name] = entry
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / "pilots.json").write_text(json.dumps(data, indent=1) + "\n")
    text = markdown(data)
    (OUT / "pilots.md").write_text(text)
    print(text)


if __name__ == "__main__":
    main()
