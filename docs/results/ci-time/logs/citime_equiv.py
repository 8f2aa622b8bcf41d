# prints z-scores of the changed samplers with few batches; run from the base copy and from the worktree, then diff
import sys, json
sys.path.insert(0, "tests"); sys.path.insert(0, "studies")
import test_reliability as r
from reasoning_unbiasedness import z_scores
out = {}
f = r.Faults(seed=11, rates={"step": 0.04, "restore": 0.04, "snapshot": 0.04})
try:
    out["reliability"] = [float(z) for z in r._gradient_z_scores(r._unbiased_bpo(12), f, 120)]
except AssertionError as e:
    out["reliability"] = str(e)
out["raised"] = f.raised
row = z_scores("sampled-reasoning", 120)
out["reasoning"] = {k: row[k] for k in ("z", "branch_points_per_tree")}
print(json.dumps(out, sort_keys=True))
