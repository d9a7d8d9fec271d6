"""The spec's keys, once: each key's kind, default, allowed values and one line of help.

From :data:`KEYS` come the key names every block allows (:mod:`.model`), the generic checks of
:mod:`.check` (kind, allowed values, pattern, bounds, with their messages), the README's key
reference and ``slurmkit schema``'s JSON Schema (:mod:`.schema`). What one key's value alone
cannot say (a value checked against another key's, a command line split, a Slurm time) stays in
:mod:`.validate`; a block with a validator of its own names it in ``checked``. What a key
record holds, and the kinds of value: :mod:`.key`.

Stdlib only (and core's and the override parser's constants): every submit imports it.
"""

from __future__ import annotations

from ..core.contract import DEFAULT_SIGNAL, LEFT_TO_CLUSTER, SIGNALS
from ..core.jobcontract import DEFAULT_BUDGETS, DEFAULT_EXCLUDE_AFTER, DEFAULT_LEAD
from ..core.profiles import PROFILES
from ..core.search import METHODS, MODES
from ..overrides import MAX_SWEEP_SIZE
from .key import Key

SLURM_WORD = r"^[A-Za-z0-9_.,:|&!*()\[\]+=@/-]+$"  # what goes into #SBATCH / srun unquoted
ENV_NAME = r"^[A-Za-z_][A-Za-z0-9_]*$"
ARG_STYLES = ("hydra", "argparse", "none")
LAUNCHERS = ("torchrun", "srun", "none")  # none: the command itself, but under srun
LOG_STDERR = ("merged", "separate")
# The file-name tokens of sbatch a log name may use: ones slurmkit can fill in again to find
# the file (`slurmkit logs --slurm`); %a or %j makes every array task's file its own.
LOG_TOKENS = {
    "A": "array job id",
    "a": "array task id",
    "j": "job id",
    "x": "job name",
    "u": "user",
}
DATA_CACHE = ("none", "node")  # node: each node also copies the dataset to its local disk
CAUSES = tuple(DEFAULT_BUDGETS)  # every cause has a default budget
BUDGETS = dict(DEFAULT_BUDGETS)  # the job contract's: each default is written once, in core


def _word(path: str, help: str, kind: str = "str", *, srun: bool = False) -> Key:
    """A key whose value goes into ``#SBATCH`` (or onto srun's command line) unquoted."""
    return Key(
        path,
        kind,
        help,
        pattern=SLURM_WORD,
        mismatch="{value!r} has characters %s does not accept here" % ("srun" if srun else "Slurm"),
        hint="no whitespace, quotes or '$'" if srun else "no whitespace or quotes",
        checked="validate._srun" if srun else None,
    )


_ALLOWED = "allowed values: {allowed}"
_NOT_ENV = "not a valid environment variable name"
_REQUIRED = "required: a string, got {value!r}"
_SRC_DST = "src: s3://bucket/ds (or gs://, https://, a path); dst: /mnt/data/ds"
_TOKENS = ", ".join(f"%{t} ({what})" for t, what in LOG_TOKENS.items())

KEYS: tuple[Key, ...] = (
    Key(
        "name",
        "str",
        "sweep and job name",
        shown="the file's stem",
        pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,99}$",
        mismatch="{value!r} is not a valid name",
        hint="letters, digits, '_', '.', '-'; starting with a letter or digit",
    ),
    Key(
        "command",
        "command",
        "the trial's program and arguments: a list, or a string split like a shell would "
        "(no shell runs)",
        required=True,
    ),
    Key(
        "args",
        "str",
        "how parameters are appended to `command`: `hydra` (`key=value`, values in Hydra "
        "syntax), `argparse` (`--key value`), `none`",
        default="hydra",
        choices=ARG_STYLES,
        hint=_ALLOWED,
    ),
    Key(
        "params",
        "params",
        "the search space (above): a list is a grid of values, a string is read with Hydra's "
        "sweep syntax (`0.1,0.01`, `range(1,5)`, `choice(a,b)`, `uniform(a,b)`, "
        "`loguniform(a,b)`, `randint(a,b)`), another value is fixed; mappings nest "
        "(`optim: {lr: ...}` is `optim.lr`). A job has none",
        checked="validate.param_space",
    ),
    Key(
        "num_samples",
        "positive",
        "random search: how many draws of the random parameters",
        default=1,
        maximum=MAX_SWEEP_SIZE,
        mismatch="must be at most {maximum:,}, got {value:,}",
        hint="split the search into sweeps of fewer samples (each with its own seed)",
    ),
    Key("seed", "int", "random search: the seed of the draws", default=0),
    Key(
        "resources",
        "block",
        "what every trial asks Slurm for (per array task). Only what is asked for is rendered",
        config=True,
        resumable=True,
    ),
    _word("resources.partition", "`--partition`"),
    Key(
        "resources.time",
        "time",
        "the time limit in Slurm's syntax: `2:00:00`, `2-00:00:00`, `90` (minutes)",
        checked="validate._resources",
    ),
    Key("resources.nodes", "positive", "nodes per trial", default=1),
    Key(
        "resources.cpus",
        "positive",
        "`--cpus-per-task`; not rendered unless set (srun steps inherit it since Slurm 23.11)",
    ),
    Key(
        "resources.gpus",
        "gpus",
        "GPUs per node: `8` or `h100:8`",
        pattern=r"^(\d+|[A-Za-z0-9_.-]+:\d+)$",
        mismatch="{value!r} is not a GPU count",
        hint="a count per node (8) or TYPE:COUNT (h100:8)",
        checked="validate._resources",
    ),
    Key(
        "resources.mem",
        "text",
        "memory per node in Slurm's forms: `16384` (megabytes), `16G`, `128GB`",
        pattern=r"^\d+([KMGTkmgt][Bb]?)?$",
        mismatch="{value!r} is not a memory size",
        hint="a number (megabytes) with a unit K, M, G or T (or KB..TB), e.g. 16G",
    ),
    _word("resources.account", "`--account`"),
    _word("resources.qos", "`--qos`"),
    _word("resources.constraint", "`--constraint`"),
    Key(
        "resources.extra",
        "map",
        "any other sbatch option: `{comment: x}` (`--comment=x`; `true` renders a flag)",
        pattern=r"^-*[a-z][a-z0-9-]*$",
        what="sbatch option names to values",
        items="option",
        mismatch="not an sbatch long option name",
        example="extra: {exclusive: true, comment: run42}",
        checked="validate._extra",
    ),
    Key(
        "resources.tasks_per_node",
        "positive",
        "tasks per node (with `launcher: srun` it defaults to the GPUs per node)",
        default=1,
    ),
    Key("resources.exclusive", "bool", "`--exclusive`: whole nodes", default=False),
    _word(
        "resources.switches",
        "`--switches`: `1` or `1@10:00` (count, and how long to wait for it)",
        "word",
    ),
    Key("resources.cpus_per_task", "alias", "the same as `cpus`", alias="cpus"),
    Key("resources.gpus_per_node", "alias", "the same as `gpus`", alias="gpus"),
    Key(
        "max_parallel",
        "positive",
        "how many trials run at once (no default: as many as Slurm starts)",
        resumable=True,
    ),
    Key(
        "search",
        "block",
        "early stopping, judged in each trial's `report()` ([above](#early-stopping-search-asha))",
        example="search: {metric: val_loss, max_resource: 27}",
        checked="spec.searchblock.search_block",
    ),
    Key("search.method", "choice", "the rule", default="asha", choices=METHODS, hint=_ALLOWED),
    Key("search.metric", "str", "the reported key it judges", required=True, mismatch=_REQUIRED),
    Key("search.mode", "choice", "which is better", default="min", choices=MODES, hint=_ALLOWED),
    Key("search.resource", "str", "`step` or another reported key", default="step"),
    Key("search.min_resource", "number", "the first rung", default=1),
    Key("search.max_resource", "number", "a whole trial's; no rung from there on", required=True),
    Key("search.reduction_factor", "positive", "rungs' ratio; 1 in it goes on (>= 2)", default=3),
    Key(
        "output_root",
        "str",
        "where sweep directories go (use the shared filesystem)",
        default="runs",
        pattern=r"^[^\s\"'%\\]+$",
        mismatch="{value!r} is not a usable directory",
        hint="a path without whitespace, quotes, '%' or backslashes",
        config=True,
    ),
    Key(
        "env",
        "map",
        "extra environment variables for every trial, byte-exact (`$X` stays `$X`); in a "
        "container they win over the image's values. A value YAML reads as a float is refused: "
        "quote it",
        pattern=ENV_NAME,
        what="variable names to values",
        config=True,
        items="scalar",
        mismatch=_NOT_ENV,
        resumable=True,
        checked="validate._env",
    ),
    Key(
        "env_default",
        "map",
        "variables set only where nothing else sets them: in a container the image's value "
        "wins (the name is not forced through `--container-env`), else the job's environment's "
        "(`${VAR:-value}`); byte-exact as `env`. A name may not be in `env` too",
        pattern=ENV_NAME,
        what="variable names to values",
        items="scalar",
        mismatch=_NOT_ENV,
        resumable=True,
        checked="validate._env",
    ),
    Key(
        "env_prepend",
        "map",
        "path-like values joined with `:` before the value the task sees (in a container, the "
        "image's own): `{LD_LIBRARY_PATH: [/opt/hpcx/lib, /usr/local/lib]}`. A fixed "
        "`sh -c 'export ...; exec \"$@\"'` inside the container applies them; the values reach "
        "it as arguments, never as script text",
        pattern=ENV_NAME,
        what="variable names to paths",
        items="paths",
        mismatch=_NOT_ENV,
        example="env_prepend: {LD_LIBRARY_PATH: /opt/hpcx/lib} (or a list of paths)",
        resumable=True,
        checked="validate._env_paths",
    ),
    Key(
        "env_append",
        "map",
        "as `env_prepend`, after the value the task sees",
        pattern=ENV_NAME,
        what="variable names to paths",
        items="paths",
        mismatch=_NOT_ENV,
        example="env_append: {LD_LIBRARY_PATH: /opt/hpcx/lib} (or a list of paths)",
        resumable=True,
        checked="validate._env_paths",
    ),
    Key(
        "env_runtime",
        "map",
        "values the runtime fills in, in each task: `{TMPDIR: '/scratch/{job_id}'}`. "
        "Placeholders (core.placeholders): `{job_id}` (`SLURM_JOB_ID`; `local-PID-INDEX` on the "
        "local backend), `{array_task_id}` (the trial index on local), `{node}` (the batch "
        "shell's node: the first of a multi-node job), `{trial_dir}`; `{{` and `}}` are literal "
        "braces. Unknown placeholders are refused at submit; a variable is set in `env` or here, "
        "not both",
        pattern=ENV_NAME,
        what="variable names to values",
        items="str",
        mismatch=_NOT_ENV,
        example="env_runtime: {TMPDIR: '/scratch/{job_id}'}",
        resumable=True,
        checked="validate._env_runtime",
    ),
    Key("workdir", "str", "the trials' working directory", shown="where `slurmkit sweep` ran"),
    Key(
        "requeue",
        "block",
        "how a trial survives preemption, time limits and node failures "
        "([below](#requeue-and-resume-the-contract))",
        config=True,
        resumable=True,
    ),
    Key(
        "requeue.enabled",
        "switch",
        "`true`: slurmkit's requeue (`--requeue`, the signal before the time limit, the batch "
        "shell's trap, budgets); `false`: never (`--no-requeue`); `cluster`: neither option "
        "rendered and no signal asked (the cluster's `JobRequeue` decides)",
        default=True,
        choices=(LEFT_TO_CLUSTER,),
        mismatch="expected bool (true, false) or {allowed}, got {type} {value!r}",
    ),
    Key(
        "requeue.signal",
        "str",
        "the signal a trial is asked to checkpoint with (`SIGUSR2`, `usr2` are `USR2` too)",
        default=DEFAULT_SIGNAL,
        choices=SIGNALS,
        hint=_ALLOWED,
        checked="spec.requeueblock.requeue_block",
    ),
    Key(
        "requeue.lead",
        "positive",
        "seconds between the signal and the time limit (shorter than `resources.time`)",
        default=DEFAULT_LEAD,
    ),
    Key(
        "requeue.hang_timeout",
        "time",
        "seconds without progress (`report()`, `heartbeat()`, a committed checkpoint) before "
        "a trial is declared hung, its stacks written and its attempt requeued (cause `hang`): "
        "an integer is seconds, a string a Slurm time (`'10:00'`; `'20'` is 20 minutes, as in "
        "`resources.time`); `0`: off; at least 5 s",
        shown="auto: max(10 × the median interval, 5 min) once a trial has reported 5 times",
        checked="spec.requeueblock.requeue_block",
    ),
    Key(
        "requeue.budgets",
        "map",
        "requeues allowed per cause (`null`: unlimited); `node`: a failure attributed to its "
        "node, `hang`: the hang watchdog ended it",
        default=BUDGETS,
        choices=CAUSES,
        what="cause to count",
        items="count",
        mismatch="unknown cause {value!r}",
        hint="allowed causes: {allowed}",
        example="causes: {allowed}; null = unlimited",
        checked="spec.requeueblock.requeue_block",
        falsy=True,
    ),
    Key(
        "requeue.exclude_after",
        "int",
        "a node blamed for this many failures of a sweep's trials is excluded from the sweep "
        "(`--exclude`; at most a quarter of the partition); `0`: never",
        default=DEFAULT_EXCLUDE_AFTER,
        checked="spec.requeueblock.requeue_block",
    ),
    Key(
        "requeue.node_fault",
        "block",
        "your own signs of a bad node, beside the built-in ones (CUDA ECC errors, NCCL's "
        "`unhandled system error`, `No CUDA GPUs are available`, a read-only mount, a container "
        "or self-check that did not start): a failure showing one is requeued under the `node` "
        "budget and counts against its node",
        example="node_fault: {patterns: ['Xid 79'], exit_codes: [139]}",
    ),
    Key(
        "requeue.node_fault.patterns",
        "list",
        "regular expressions (Python's) matched against each line of the failed attempt's output",
        items="str",
        falsy=True,
        checked="spec.requeueblock.requeue_block",
    ),
    Key(
        "requeue.node_fault.exit_codes",
        "list",
        "exit codes that mean the node failed",
        items="int",
        falsy=True,
        checked="spec.requeueblock.requeue_block",
    ),
    Key(
        "container",
        "block",
        "run each task in this container: pyxis and enroot "
        "([above](#jobs-multi-node-containers-launchers))",
        config=True,
        resumable=True,
        mismatch="must be a mapping, got {type} {value!r}",
        example="container: {image: nvcr.io/nvidia/pytorch:24.01-py3}",
        checked="pyxis.parse",
    ),
    Key(
        "container.image",
        "str",
        "a registry reference (`nvcr.io/nvidia/pytorch:24.01-py3`) or a squashfs path",
        required=True,
    ),
    Key(
        "container.mounts",
        "list",
        "`SRC[:DST[:FLAGS]]` or `{src, dst, flags}`; SRC an absolute path, `tmpfs` or `umount`",
        items="mount",
        falsy=True,
    ),
    Key(
        "container.workdir",
        "str",
        "the working directory inside the container; `image` keeps the image's WORKDIR",
        shown="the submit directory (mounted)",
    ),
    Key(
        "container.env_keep",
        "list",
        "variables whose host values win over the image's (a name or a list of names)",
        pattern=ENV_NAME,
        items="str",
        falsy=True,
    ),
    Key("container.writable", "bool", "`--container-writable` (`false`: `--container-readonly`)"),
    Key("container.remap_root", "bool", "`--[no-]container-remap-root`"),
    Key("container.mount_home", "bool", "`--[no-]container-mount-home`", default=False),
    Key(
        "container.name",
        "str",
        "`--container-name=NAME-<image digest>-<attempt>[:FLAG]`, FLAG one of `auto`, `create`, "
        "`exec`, `no_exec`: one container per attempt, removed from its nodes when it ends",
    ),
    Key(
        "launcher",
        "choice",
        "what starts the command on the nodes: `torchrun`, `srun` (a task per GPU), `none` (the "
        "command itself under `srun`, even on one task of one node)",
        choices=LAUNCHERS,
        shown="the command itself",
        hint=_ALLOWED + " (or leave it out)",
    ),
    Key(
        "profile",
        "str",
        "a built-in cluster profile: its environment and container habits",
        choices=("none", *PROFILES),
        config=True,
        checked="layers.profile",
        falsy=True,
    ),
    Key(
        "self_check",
        "bool",
        "check the trials' Python and paths on the nodes before the sweep",
        default=True,
        resumable=True,
    ),
    Key(
        "srun",
        "block",
        "options of the job step, rendered as argv (`true` renders a flag). The same effect "
        "from the environment: `SLURM_MPI_TYPE`, `SLURM_LABELIO`, `SLURM_CPU_BIND`",
        what="srun options",
        example="srun: {mpi: pmix, label: true, cpu_bind: cores}",
        checked="validate._srun",
    ),
    _word("srun.mpi", "`--mpi` (`pmix` for MPI programs like `all_reduce_perf`)", srun=True),
    Key("srun.label", "bool", "`--label`", checked="validate._srun"),
    _word("srun.cpu_bind", "`--cpu-bind` (`cores`)", srun=True),
    _word("srun.gpu_bind", "`--gpu-bind` (`closest`)", srun=True),
    _word("srun.mem_bind", "`--mem-bind`", srun=True),
    _word("srun.distribution", "`--distribution` (`block:block`)", srun=True),
    _word("srun.hint", "`--hint`", srun=True),
    Key("srun.exact", "bool", "`--exact`", checked="validate._srun"),
    Key("srun.overlap", "bool", "`--overlap`", checked="validate._srun"),
    Key("srun.unbuffered", "bool", "`--unbuffered`", checked="validate._srun"),
    _word("srun.network", "`--network`", srun=True),
    Key("srun.cpus_per_task", "positive", "`--cpus-per-task` of the step"),
    Key("srun.gpus_per_task", "positive", "`--gpus-per-task`"),
    Key(
        "mpi",
        "str",
        "short for `srun: {mpi: ...}`",
        pattern=SLURM_WORD,
        checked="validate._srun",
    ),
    Key("logs", "block", "where output goes", example="logs: {name: '%x-%A_%a'}"),
    Key(
        "logs.name",
        "str",
        "Slurm's own log of each array task, `SWEEP_DIR/logs/NAME.out`: sbatch's `%A` `%a` `%j` "
        "`%x` `%u` `%%`, with `%a` or `%j` so that every task has its own; no `/`",
        default="%A_%a",
        pattern=r"^(?=.{1,200}$)(?!\.)(?:[A-Za-z0-9_.-]|%[%Aajxu])+$",
        mismatch="{value!r} is not a log file name slurmkit can find again",
        hint=f"letters, digits, '_', '.', '-' and the tokens {_TOKENS}, %% for '%'; "
        "no '/': the logs stay in the sweep directory",
        checked="validate._logs",
    ),
    Key(
        "logs.stderr",
        "str",
        "`separate` keeps stderr apart: the trial's in `trials/ID/output.err` (`slurmkit logs "
        "DIR T --stderr`), Slurm's in `NAME.err` (`--slurm --stderr`)",
        default="merged",
        choices=LOG_STDERR,
        mismatch="{value!r} is not a way to keep stderr",
        hint=_ALLOWED,
    ),
    Key(
        "torchrun",
        "block",
        "torchrun's own options (only with `launcher: torchrun`)",
        example="{nproc_per_node: 8}",
    ),
    Key(
        "torchrun.nproc_per_node",
        "positive",
        "workers per node when they are not the GPUs per node (a script that asks Slurm for no "
        "GPUs under `exclusive` and passes `--nproc_per_node` itself)",
        shown="the GPUs (or tasks) per node",
    ),
    Key(
        "data",
        "blocks",
        "datasets staged to the shared filesystem before the trials start "
        "([above](#data-in-specs-the-data-block)); each path in `SLURMKIT_DATA_<NAME>`",
        what="datasets",
        example="data: [{src: s3://bucket/ds, dst: /mnt/data/ds, cache: node}]",
        checked="validate._data",
    ),
    Key(
        "data.src",
        "str",
        "where from: `s3://bucket/ds`, `gs://`, `https://`, a path (no credentials)",
        required=True,
        mismatch=_REQUIRED,
        hint=_SRC_DST,
    ),
    Key(
        "data.dst",
        "str",
        "where to, on the shared filesystem (an absolute path)",
        required=True,
        mismatch=_REQUIRED,
        hint=_SRC_DST,
    ),
    Key(
        "data.cache",
        "choice",
        "`node`: each node also copies it to its local disk",
        default="none",
        choices=DATA_CACHE,
        hint=_ALLOWED,
    ),
    Key(
        "data.name",
        "str",
        "its variable: `SLURMKIT_DATA_<NAME>`, upper-cased",
        shown="the last part of `dst`",
        pattern=r"^[A-Za-z0-9_]{1,64}$",
        mismatch="{value!r} cannot name an environment variable",
        hint="letters, digits and '_' (it becomes SLURMKIT_DATA_<NAME>, upper-cased)",
    ),
    Key("data.cache_dir", "str", "with `cache: node`: where on the node", shown="`$TMPDIR`"),
    Key(
        "labels",
        "map",
        "names to short texts for attribution: `{team: nlp, project: llm}`; kept in `sweep.json` "
        "for `slurmkit report --by label` (the sweep's jobs carry the comment "
        "`slurmkit:SWEEP_DIR`, so `resources.extra.comment` is refused beside labels). Names: "
        "letters, digits, `_`",
        pattern=r"^[A-Za-z_][A-Za-z0-9_]{0,62}$",
        what="label names to texts",
        items="label",
        mismatch="not a label name",
        hint="letters, digits and '_', not starting with a digit (at most 63)",
        example="labels: {team: nlp, project: llm}",
        checked="validate._labels",
    ),
)

KEY: dict[str, Key] = {k.path: k for k in KEYS}


def below(path: str) -> tuple[Key, ...]:
    """The keys directly in the block at ``path`` (``""``: the top level), in table order."""
    depth = path.count(".") + 1 if path else 0
    prefix = f"{path}." if path else ""
    return tuple(k for k in KEYS if k.path.startswith(prefix) and k.path.count(".") == depth)


def names(path: str) -> tuple[str, ...]:
    """The names of the keys allowed in the block at ``path``."""
    return _NAMES.get(path, ())


def _by_block() -> dict[str, tuple[str, ...]]:
    """Each block's path (``""``: the top level) -> its keys' names, in table order."""
    out: dict[str, tuple[str, ...]] = {}
    for key in KEYS:
        block = key.path.rpartition(".")[0]
        out[block] = (*out.get(block, ()), key.name)
    return out


_NAMES = _by_block()
