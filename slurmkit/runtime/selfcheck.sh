# slurmkit's self-check: run by `sh -c` in each task of a container job, before the command.
# It needs only a POSIX shell (no slurmkit, no Python in the image) and no user value: the
# shared filesystem is mounted and writable, the GPUs the allocation gives are visible, an NCCL
# library is present, and, when the image has python3 with torch, what torch sees. A missing
# tool is a warning; exit 3 when a check fails; else one OK line (which checks ran) and exec.
host=$(hostname 2>/dev/null) || host=$(cat /proc/sys/kernel/hostname 2>/dev/null) || host=node
where="$host${SLURM_PROCID:+ rank $SLURM_PROCID}"
ran="" skipped="" failed=0
ok() { ran="$ran${ran:+, }$1"; }
skip() { skipped="$skipped${skipped:+, }${1%%:*}"; echo "selfcheck WARNING: $where: $1" >&2; }
fail() { echo "selfcheck FAILED: $where: $1" >&2; failed=1; }

# the shared filesystem: a file written, read back and removed
dir=${SLURMKIT_SWEEP_DIR:-${SLURM_SUBMIT_DIR:-}}
if [ -z "$dir" ]; then
  skip "path: no shared path given (SLURMKIT_SWEEP_DIR, SLURM_SUBMIT_DIR)"
elif [ ! -d "$dir" ]; then
  fail "path: $dir: not a directory here: is it mounted?"
else
  f="$dir/.slurmkit-selfcheck-$host-${SLURM_PROCID:-0}-$$"  # pids repeat across pid namespaces
  if ! { printf 'slurmkit %s\n' "$$" >"$f"; } 2>/dev/null; then
    fail "path: $dir: cannot create a file in it"
  else
    line=""
    read -r line <"$f" || true
    if [ "$line" != "slurmkit $$" ]; then
      fail "path: $dir: a file read back differs from the one written"
    else
      ok "path $dir writable"
    fi
    { rm -f "$f" || : >"$f"; } 2>/dev/null
  fi
fi

# the GPUs this task should see: CUDA_VISIBLE_DEVICES (set by Slurm per task), else
# SLURM_GPUS_ON_NODE; inside a Slurm job with neither, none
want="" why=""
if [ -n "${CUDA_VISIBLE_DEVICES+set}" ]; then
  want=0 why="CUDA_VISIBLE_DEVICES=$CUDA_VISIBLE_DEVICES" rest="$CUDA_VISIBLE_DEVICES,"
  while [ -n "$rest" ]; do
    item=${rest%%,*} rest=${rest#*,}
    case $item in "" | NoDevFiles | -*) break ;; esac
    want=$((want + 1))
  done
elif [ -n "${SLURM_GPUS_ON_NODE:-}" ] && [ "${SLURM_GPUS_ON_NODE#*[!0-9]}" = "$SLURM_GPUS_ON_NODE" ]; then
  want=$SLURM_GPUS_ON_NODE why="SLURM_GPUS_ON_NODE=$SLURM_GPUS_ON_NODE"
elif [ -n "${SLURM_JOB_ID:-}" ]; then
  want=0 why="a CPU-only allocation"
fi
if [ -n "$want" ]; then
  seen=0
  if command -v nvidia-smi >/dev/null 2>&1; then
    how=nvidia-smi
    out=$(nvidia-smi -L 2>/dev/null) || out=""
    while IFS= read -r line; do
      case $line in "GPU "*) seen=$((seen + 1)) ;; esac
    done <<LIST
$out
LIST
  else
    how="/dev/nvidia* device files"
    for d in /dev/nvidia[0-9]*; do [ -e "$d" ] && seen=$((seen + 1)); done
  fi
  if [ "$seen" -lt "$want" ]; then
    fail "gpus: $seen visible ($how), the allocation gives $want ($why): is the image started with enroot's GPU hook (NVIDIA_VISIBLE_DEVICES) and the driver on the node?"
  else
    ok "$want GPUs ($why; $seen seen by $how)"
  fi
fi

# an NCCL library, when the task has GPUs
if [ "${want:-0}" -gt 0 ]; then
  nccl=""
  if command -v ldconfig >/dev/null 2>&1; then
    out=$(ldconfig -p 2>/dev/null) || out=""
    case $out in *libnccl.so*) nccl="ldconfig" ;; esac
  fi
  if [ -z "$nccl" ]; then
    saved_ifs=$IFS
    IFS=:
    for d in ${LD_LIBRARY_PATH:-} /usr/lib/x86_64-linux-gnu /usr/lib/aarch64-linux-gnu /usr/lib64 /usr/lib /usr/local/lib /usr/local/nccl/lib /opt/nccl/lib; do
      for lib in "$d"/libnccl.so*; do [ -e "$lib" ] && nccl=$lib && break 2; done
    done
    IFS=$saved_ifs
  fi
  if [ -n "$nccl" ]; then ok "NCCL ($nccl)"; else skip "nccl: no libnccl.so found (ldconfig, LD_LIBRARY_PATH, /usr/lib*): programs that use NCCL will fail"; fi
fi

# torch, only when the image has python3 and torch
if command -v python3 >/dev/null 2>&1; then
  if t=$(python3 -c '
import warnings
warnings.filterwarnings("ignore")
import torch
c = torch.cuda
n = c.device_count() if c.is_available() else 0
v = c.nccl.version() if n else "-"
print(torch.__version__, n, ".".join(map(str, v)) if isinstance(v, tuple) else v)
' 2>/dev/null); then
    tv=${t%% *} rest=${t#* }
    tn=${rest%% *} tnccl=${rest#* }
    if [ "${want:-0}" -gt 0 ] && [ "$tn" -lt "$want" ]; then
      fail "torch: torch $tv sees $tn GPUs, the allocation gives $want ($why)"
    else
      ok "torch $tv ($tn GPUs, NCCL $tnccl)"
    fi
  else
    skip "torch: python3 cannot import torch"
  fi
else
  skip "torch: no python3 in the image"
fi

if [ "$failed" -ne 0 ]; then exit 3; fi
echo "selfcheck OK: $where: $ran${skipped:+ (not run: $skipped)}"
exec "$@"
