"""Specs and values that several test modules use: a good sweep, a container job, bad input
with the key and message it must be reported with, and hostile values."""

GOOD = """
name: demo
command: python train.py --epochs 3
params:
  lr: [0.1, 0.01]
  optim:
    momentum: 0.9,0.95
  layers: range(1,4)
  act: choice(relu,gelu)
  wd: loguniform(1e-5, 1e-2)
  tag: base
num_samples: 2
seed: 3
max_parallel: 4
resources:
  partition: low
  time: "1:00:00"
  cpus: 2
  gpus: 1
  mem: 4G
  extra: {exclusive: true, comment: run42}
env: {OMP_NUM_THREADS: 1}
"""

JOB = """
name: ddp
command: python train.py --config cfg.yaml
profile: sunk
launcher: torchrun
container:
  image: nvcr.io/nvidia/pytorch:24.01-py3
  mounts: [/mnt/data:/data:ro, /mnt/home]
  env_keep: [WANDB_API_KEY]
resources: {nodes: 16, gpus_per_node: 8, time: "2-00:00:00", exclusive: true, partition: h100}
"""

# (spec body, overrides, the key the error names, a part of its message)
BAD_INPUT = [
    ("command: x\nparams: {a: [1]}\nbogus: 1\n", [], "bogus", "allowed keys"),
    ("command: x\nparams: {a: [1]}\nresources: {gpu: 1}\n", [], "resources.gpu", "allowed keys"),
    ("command: x\nparams: {a: [1]}\nmax_parallel: many\n", [], "max_parallel", "expected int"),
    ("command: x\nparams: {a: []}\n", [], "params.a", "empty search space"),
    ("command: x\nparams: {}\n", [], "params", "empty search space"),
    ("command: x\nparams: {a: 'range(3,3)'}\n", [], "params.a", "empty search space"),
    (
        "command: x\nparams: {a: [1]}\nresources: {time: '1:2:3:4'}\n",
        [],
        "resources.time",
        "D-HH:MM:SS",
    ),
    ("command: x\nparams: {a: [1]}\n", ["resources.time=soon"], "resources.time", "D-HH:MM:SS"),
    ("command: x\nparams: {a: [1]}\nargs: posix\n", [], "args", "hydra, argparse, none"),
    ("params: {a: [1]}\n", [], "command", "required"),
    ("command: x\nparams: {a: [1]}\nname: 'bad name'\n", [], "name", "not a valid name"),
    (
        "command: x\nparams: {a: [1]}\nresources: {partition: 'a b'}\n",
        [],
        "resources.partition",
        "whitespace",
    ),
    (
        "command: x\nparams: {a: [1]}\nresources: {extra: {array: 1-3}}\n",
        [],
        "resources.extra.array",
        "sets this option",
    ),
    ("command: x\nparams: {a: [1]}\nresources: {mem: lots}\n", [], "resources.mem", "memory size"),
    ("command: x\nparams: {a: 'uniform(2, 1)'}\n", [], "params.a", "cannot read"),
    ("command: x\nparams: {a: [1]}\nnum_samples: 3\n", [], "num_samples", "random parameter"),
    (
        "command: x\nparams: {a: [1]}\n",
        ["resources.time=1:00,2:00"],
        "resources.time",
        "only params",
    ),
    ("command: x\nparams: {a: [1]}\nrequeue: {signal: KILL}\n", [], "requeue.signal", "USR2, USR1"),
    (
        "command: x\nparams: {a: [1]}\nresources: {time: 2}\nrequeue: {lead: 120}\n",
        [],
        "requeue.lead",
        "shorter",
    ),
    (
        "command: x\nparams: {a: [1]}\nrequeue: {budgets: {oom: 1}}\n",
        [],
        "requeue.budgets.oom",
        "preemption, timeout",
    ),
    (
        "command: x\nparams: {a: [1]}\nrequeue: {budgets: {timeout: -1}}\n",
        [],
        "requeue.budgets.timeout",
        "count >= 0",
    ),
]

# Values that a shell would mangle or run: they must reach trials byte-exact.
TRICKY = [
    "it's",
    'say "hi"',
    "$(touch /tmp/pwned-slurmkit)",
    "`id`",
    "two\nlines",
    "  spaced  ",
    "naïve ünïcødé ✓",
    "a,b;c|d&e>f",
    "$HOME $$ %s %%",
    "back\\slash",
]
