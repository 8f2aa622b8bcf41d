"""The main job's report reads right at a glance: the smoke report says it is a pipeline check,
no interval or MDE below 3 seeds, success intervals inside [0, 1], plots without data skipped
with the reason, ``--list-algorithms`` one line each, Ctrl-C one line with a ``--resume`` hint."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from bpo_envs.console import INTERRUPTED_EXIT, ends_on_ctrl_c, interrupted_line
from bpo_experiments import compare
from bpo_experiments.report import MIN_SEEDS, _diff, _mde, unit_interval
from bpo_experiments.stats import mean_ci

ROOT = Path(__file__).resolve().parents[1]


def _bounds(text: str) -> tuple[float, float]:
    lo, hi = re.search(r"\[(-?[\d.]+), (-?[\d.]+)\]", text).groups()
    return float(lo), float(hi)


def test_below_3_seeds_no_interval_or_mde_is_printed():
    assert MIN_SEEDS == 3
    assert unit_interval([0.25, 0.5], mean_ci([0.25, 0.5])[1]) == "0.375 (n/a: 2 seeds)"
    two = {"diff": 0.0, "diff_ci95": 0.0, "diff_per_seed": [0.0, 0.0], "mde": 0.0, "n": 2}
    assert _diff(two) == "+0.000 (n/a: 2 seeds)" and _mde(two) == "MDE n/a: 2 seeds"
    three = {**two, "diff_per_seed": [0.1, 0.2, 0.3], "n": 3, "diff": 0.2, "diff_ci95": 0.25, "mde": 0.3}
    assert _diff(three) == "+0.200 ± 0.250" and _mde(three) == "MDE 0.300"


def test_success_intervals_never_leave_0_1():
    # the broken case: the t-interval of these seeds' success runs past 1
    seeds = [1.0, 1.0, 0.0, 1.0]
    mean, half = mean_ci(seeds)
    assert mean + half > 1
    text = unit_interval(seeds, half)
    lo, hi = _bounds(text)
    assert 0.0 <= lo <= mean <= hi <= 1.0 and text.endswith("(bootstrap)")
    # inside [0, 1] the t-interval stays
    inside = [0.4, 0.5, 0.6]
    mean, half = mean_ci(inside)
    assert unit_interval(inside, half) == f"{mean:.3f} [{mean - half:.3f}, {mean + half:.3f}]"


def test_list_algorithms_gives_one_line_each(capsys):
    compare.main(["--list-algorithms"])
    lines = capsys.readouterr().out.splitlines()
    by_name = {line.split()[0]: line for line in lines}
    assert {"bpo", "rloo", "frozen", "rloo-2x"} <= set(by_name)
    assert len(lines) == len(by_name)  # one line per algorithm
    assert "Branching Policy Optimization" in by_name["bpo"] and "--bpo.OPTION" in by_name["bpo"]
    assert "baseline=anchored" in by_name["bpo-anchored"] and by_name["frozen"].split(None, 1)[1].startswith("control:")


def test_ctrl_c_ends_a_command_with_one_line_and_a_resume_hint(capsys):
    @ends_on_ctrl_c("bpo-compare", resumable=True)
    def interrupted() -> None:
        raise KeyboardInterrupt

    with pytest.raises(SystemExit) as exc:
        interrupted()
    assert exc.value.code == INTERRUPTED_EXIT
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and err.startswith("bpo-compare: interrupted (Ctrl-C)") and "--resume" in err
    assert interrupted_line("bpo-compare", True, ["--smoke", "--out", "x y"]).endswith("bpo-compare --smoke --out 'x y' --resume")
    assert "nothing to --resume" in interrupted_line("bpo-trees", False, [])


@pytest.mark.slow
def test_ctrl_c_of_bpo_compare_with_worker_processes_prints_one_line(tmp_path):
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    out = tmp_path / "out"
    proc = subprocess.Popen([sys.executable, "-c", "from bpo_experiments.compare import cli; cli()", "--smoke", "--envs", "treemdp",
                             "--no-tune", "--jobs", "2", "--no-progress", "--out", str(out)],
                            cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, start_new_session=True,
                            # as from a terminal: a shell's background job (a CI script started with &) inherits SIGINT
                            # ignored, and Python then installs no KeyboardInterrupt handler
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    deadline = time.monotonic() + 90
    while not list(out.glob("runs/treemdp/_initial/seed*/initial.json")) and time.monotonic() < deadline:
        time.sleep(0.5)  # the worker processes have started and finished a job
    os.killpg(proc.pid, signal.SIGINT)  # Ctrl-C reaches the whole process group, workers too
    err = proc.communicate(timeout=60)[1]
    assert proc.returncode == INTERRUPTED_EXIT, err
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 and "--resume" in lines[0] and "Traceback" not in err, err


@pytest.mark.slow
def test_the_smoke_report_says_what_it_is_and_skips_plots_without_data(tmp_path):
    out = tmp_path / "smoke"
    compare.main(["--smoke", "--envs", "treemdp", "--no-tune", "--updates", "2", "--grad-seeds", "0", "--no-progress", "--jobs", "1",
                  "--out", str(out)])
    text = (out / "results.md").read_text()
    assert text.splitlines()[2].startswith("> **Pipeline check, not a result.**")
    assert "n/a: 2 seeds" in text and " ± " not in text.split("## treemdp")[1].split("Compute per update")[0]
    results = json.loads((out / "results.json").read_text())
    assert set(results["plots_without_data"]) == {"gradient_snr.png", "grad_norm_variance.png"}
    assert not (out / "gradient_snr.png").exists() and (out / "success.png").exists()
    assert "(gradient_snr.png): not drawn, no run probed its gradient" in text and "](gradient_snr.png)" not in text


def test_the_gradient_plots_draw_only_the_envs_that_probed(tmp_path):
    # the committed default probes WebShop (its first 3 seeds) and not ALFWorld (grad_seeds 0):
    # the gradient plots have one panel, and the report says which env has none
    from pathlib import Path

    import matplotlib.image

    from bpo_experiments import report

    results = json.loads((Path(__file__).parents[1] / "docs/results/compare-cpu-default/results.json").read_text())
    assert report.probed_envs(results) == ["webshop"]
    report.plots(results, tmp_path)
    snr = matplotlib.image.imread(tmp_path / "gradient_snr.png")
    success = matplotlib.image.imread(tmp_path / "final_success.png")  # both envs, the same panel width
    assert snr.shape[1] < 0.6 * success.shape[1]
    assert "No gradient probes on alfworld (grad_seeds 0 there)" in report.markdown(results)
    # the broken case: with every env probed, no such line
    del results["per_env"]["alfworld"]
    assert "No gradient probes" not in report.markdown(results)
