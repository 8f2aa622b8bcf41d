"""How well the CPU default's ALFWorld scorer fits the handcoded expert it is cloned from.

For each number of behaviour-cloning epochs: the per-decision agreement (argmax = the expert's
action) and mean NLL on the 60 training games' demos, and sampled success (T=1, 2 episodes a
game) on 48 of those training games and on the 48 `valid_seen` evaluation games:

    python scripts/alfworld_bc_fit.py 10,30 docs/results/alfworld-rl-pilots/bc_fit.json
"""

import json
import sys
import time

import torch

from bpo_algos.experiments import runner
from bpo_algos.experiments.presets import PRESETS
from bpo_algos.policy.scorer import TextScorerPolicy
from bpo_algos.policy.sft import behaviour_cloning, demo_steps
from bpo_envs.pool import EnvPool

torch.set_num_threads(1)
setup = PRESETS["cpu"].envs["alfworld"]
train, ev = runner.task_split(setup)
demos = runner._expert_demos(setup, train, 0)
out = {"demos": len(demos)}
for epochs in [int(e) for e in sys.argv[1].split(",")]:
    torch.manual_seed(0)
    pol = TextScorerPolicy(temperature=1.0, seed=0, memory="alfworld")
    t0 = time.time()
    behaviour_cloning(pol, demos, epochs=epochs, lr=3e-3, seed=0)
    bc_s = time.time() - t0
    steps = demo_steps(pol, demos)
    with torch.no_grad():
        agree = 0
        nll = 0.0
        for s in steps:
            dist = pol.action_distribution(s.context) if hasattr(pol, "action_distribution") else None
            lp = float(pol.token_logprobs([s]).sum())
            nll -= lp
            if dist is not None:
                agree += int(max(dist, key=dist.get) == s.action.text)
    row = {"epochs": epochs, "bc_seconds": bc_s, "nll": nll / len(steps), "agree": agree / len(steps)}
    for split, tasks, make in (("train", train[:48], runner.env_factory(setup)), ("valid_seen", ev, runner.eval_env_factory(setup))):
        pool = EnvPool([make] * 4)
        w = runner.evaluate_episodes(pol, pool, tasks, 2, 0)
        pool.close()
        row[split] = sum(w) / len(w)
    out[str(epochs)] = row
    print(json.dumps(row), flush=True)
json.dump(out, open(sys.argv[2], "w"), indent=1)
