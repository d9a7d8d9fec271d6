#!/usr/bin/env bash
# Stop the test cluster started by up.sh: its daemons, found by their own pid files, and every
# process left in its nodes' namespaces (slurmstepd and job processes). SIGTERM, then SIGKILL.
# Usage: down.sh [--purge]   --purge also removes $SLURMKIT_TEST_CLUSTER_DIR.
set -euo pipefail
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
source "$HERE/common.sh"

PURGE=0
for arg in "$@"; do
  case $arg in
    --purge) PURGE=1 ;;
    *) echo "usage: $0 [--purge]" >&2; exit 2 ;;
  esac
done

# state_ppid PID: the process state letter and parent pid.
state_ppid() {
  local stat
  stat=$(cat "/proc/$1/stat" 2>/dev/null) || return 1
  stat=${stat##*) }
  echo "${stat% "${stat#* * }"}"
}

running() {
  local s
  s=$(state_ppid "$1") && [[ ${s%% *} != [ZX] ]]
}

# stop GRACE PID...: SIGTERM, then after GRACE seconds SIGKILL; return once all are gone.
stop() {
  local grace=$1 p signal end left=()
  shift
  (($#)) || return 0
  kill -TERM "$@" 2>/dev/null || true
  end=$((SECONDS + grace))
  for signal in KILL ""; do
    while :; do
      left=()
      for p in "$@"; do running "$p" && left+=("$p"); done
      ((${#left[@]})) || return 0
      ((SECONDS < end)) || break
      sleep 0.1
    done
    [[ -n $signal ]] || { echo "down.sh: still running: ${left[*]}" >&2; return 1; }
    kill "-$signal" "${left[@]}" 2>/dev/null || true
    end=$((SECONDS + 5))
  done
}

# pids PIDFILE COMM: the daemon's pid and its children (slurmctld forks slurmscriptd).
pids() {
  local pid p
  pid=$(pid_of "$1" "$2") || return 0
  echo "$pid"
  for p in /proc/[0-9]*; do
    [[ $(state_ppid "${p#/proc/}") == *" $pid" ]] && echo "${p#/proc/}"
  done
  return 0
}

# Processes in the namespaces recorded for the nodes: slurmd, slurmstepd, jobs.
node_pids() {
  local f p
  local -A ns=()
  for f in "$RUN"/slurmd-*.ns; do [[ -s $f ]] && ns["$(<"$f")"]=1; done
  ((${#ns[@]})) || return 0
  for p in /proc/[0-9]*; do
    p=${p#/proc/}
    [[ -n ${ns["$(node_ns "$p" 2>/dev/null)"]-} ]] && echo "$p"
  done
  return 0
}

slurm=($(pids "$RUN/slurmctld.pid" slurmctld) $(node_pids))
for n in "${NODES[@]}"; do slurm+=($(pids "$RUN/slurmd-$n.pid" slurmd)); done
stop 5 "${slurm[@]}"
stop 5 $(pids "$RUN/slurmdbd.pid" slurmdbd)
stop 15 $(pids "$RUN/mariadbd.pid" mariadbd)
stop 5 $(pids "$MUNGE_PID" munged)
rm -f "$RUN"/*.pid "$RUN"/*.ns "$MUNGE_PID"

if ((PURGE)) && [[ -d $DIR ]]; then
  [[ -e $DIR/.slurmkit-test-cluster ]] || { echo "down.sh: $DIR is not a test cluster dir; not removed" >&2; exit 1; }
  rm -rf "$DIR"
fi
