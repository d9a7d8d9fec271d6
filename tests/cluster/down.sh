#!/usr/bin/env bash
# Stop the test cluster started by up.sh: its daemons, found by their own pid files, and every
# process left in its nodes' namespaces (slurmstepd and job processes). SIGTERM, then SIGKILL.
# Usage: down.sh [--purge]   --purge also removes $SLURMKIT_TEST_CLUSTER_DIR.
set -euo pipefail
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source=tests/cluster/common.sh
source "$HERE/common.sh"

PURGE=0
for arg in "$@"; do
  case $arg in
    --purge) PURGE=1 ;;
    *) echo "usage: $0 [--purge]" >&2; exit 2 ;;
  esac
done

# read_stat PID: set st_state and st_ppid from /proc/PID/stat (without forking: it runs per process).
read_stat() {
  local stat
  read -r stat 2>/dev/null <"/proc/$1/stat" || return 1
  read -r st_state st_ppid _ <<<"${stat##*) }"
}

running() { read_stat "$1" && [[ $st_state != [ZX] ]]; }

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
    [[ -n $signal ]] || { echo "down.sh: still running after SIGKILL: ${left[*]}" >&2; return 1; }
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
    read_stat "${p#/proc/}" && [[ $st_ppid == "$pid" ]] && echo "${p#/proc/}"
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

rc=0
mapfile -t slurm < <(pids "$RUN/slurmctld.pid" slurmctld)
for n in "${NODES[@]}"; do mapfile -t -O "${#slurm[@]}" slurm < <(pids "$RUN/slurmd-$n.pid" slurmd); done
# stop SECONDS LISTER ARGS...: stop the processes that LISTER ARGS prints, one pid a line.
stop_listed() { local -a found; mapfile -t found < <("${@:2}"); stop "$1" "${found[@]}"; }
stop 5 "${slurm[@]}" || rc=1
stop_listed 0 node_pids || rc=1
stop_listed 5 pids "$RUN/slurmdbd.pid" slurmdbd || rc=1
stop_listed 15 pids "$RUN/mariadbd.pid" mariadbd || rc=1
stop_listed 5 pids "$MUNGE_PID" munged || rc=1
((rc)) && exit "$rc"
rm -f "$RUN"/*.pid "$RUN"/*.ns "$MUNGE_PID"

if ((PURGE)) && [[ -d $DIR ]]; then
  [[ -e $DIR/.slurmkit-test-cluster ]] || { echo "down.sh: $DIR is not a test cluster dir; not removed" >&2; exit 1; }
  rm -rf "$DIR"
fi
