"""Test payload: records what it received, reports metrics, exits with params['exit'] (if any)."""

import json
import os
import sys

import slurmkit

params = slurmkit.params()
record = {
    "argv": sys.argv[1:],
    "params_env": os.environ["SLURMKIT_PARAMS"],
    "trial_id": os.environ["SLURMKIT_TRIAL_ID"],
    "trial_dir": os.environ["SLURMKIT_TRIAL_DIR"],
    "attempt": os.environ["SLURMKIT_ATTEMPT"],
    "cwd": os.getcwd(),
    "host": os.uname().nodename,
}
with open(
    os.path.join(os.environ["SLURMKIT_TRIAL_DIR"], "received.json"), "w", encoding="utf-8"
) as fh:
    json.dump(record, fh, ensure_ascii=False)
print("hello from trial", os.environ["SLURMKIT_TRIAL_INDEX"])
x = params.get("x", 0)
slurmkit.report(score=float(x) * 2 if isinstance(x, (int, float)) else 0.0)
if "report" in params:  # more metrics: a JSON object (NaN and Infinity allowed)
    slurmkit.report(json.loads(params["report"]))
code = int(params.get("exit", 0))
if params.get("flaky") and os.environ["SLURMKIT_ATTEMPT"] == "1":
    code = 3  # fails on its first attempt only
sys.exit(code)
