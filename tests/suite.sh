#!/usr/bin/env bash
# make test's pytest run (make lint runs before it). It starts the real Slurm test clusters
# (tests/cluster/up.sh) and an S3 server (tests/s3/up.sh), and stops them after.
#
# Pytest processes run side by side:
# - the tests marked `cluster`, split by file between SLURMKIT_TEST_SHARDS (default 2) processes
#   (tests/cluster_shards.py), each on a test cluster of its own, one test at a time: a cluster's
#   four nodes, GPUs and queue are its tests' alone, and some reconfigure it. Cluster K lives in
#   $SLURMKIT_TEST_CLUSTER_DIR (default /tmp/slurmkit-cluster; K > 1: that path and -K) with its
#   ports moved by $SLURMKIT_TEST_CLUSTER_PORT_OFFSET + 100 * (K - 1). These tests mostly wait on
#   Slurm's timers, not on the CPU. The first gets make test's S3 server, the others one each of
#   their own (tests/s3server.py starts it: request counts are per server).
# - all the other tests, with no cluster (SLURM_CONF unset: a test that submits is marked
#   `cluster`) and an S3 server of their own, at a lower priority (nice): the cluster tests' jobs
#   need CPU at set times (Slurm's signals come with a lead).
# The first cluster process prints as it goes; the others' output follows. Exit 0 when all passed.
# Usage: tests/suite.sh [PYTEST ARGS...]   (every process gets them)
set -uo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
PY=${PY:-$ROOT/.venv/bin/python}
SHARDS=${SLURMKIT_TEST_SHARDS:-2}
BASE_DIR=${SLURMKIT_TEST_CLUSTER_DIR:-/tmp/slurmkit-cluster}
BASE_OFFSET=${SLURMKIT_TEST_CLUSTER_PORT_OFFSET:-0}
cd "$ROOT" || exit 1
[[ $SHARDS =~ ^[1-9]$ ]] || { echo "SLURMKIT_TEST_SHARDS: want 1-9, got '$SHARDS'" >&2; exit 2; }

WORK=$(mktemp -d /tmp/slurmkit-suite.XXXXXX)
export SLURMKIT_TEST_S3_DIR=$WORK/s3 SLURMKIT_TEST_S3_WATCH=$$ SLURMKIT_TEST_S3_PYTHON=$PY
mkdir -p "$SLURMKIT_TEST_S3_DIR"
dirs=() offsets=() confs=() started=() pids=()
for ((k = 1; k <= SHARDS; k++)); do
  dirs[k]=$BASE_DIR$( ((k == 1)) || echo "-$k")
  offsets[k]=$((BASE_OFFSET + 100 * (k - 1)))
done

# cluster K: the environment of cluster K's tools (up.sh, down.sh, the fixture's own up.sh).
cluster() { env SLURMKIT_TEST_CLUSTER_DIR="${dirs[$1]}" SLURMKIT_TEST_CLUSTER_PORT_OFFSET="${offsets[$1]}" "${@:2}"; }

# shellcheck disable=SC2317  # run by the EXIT trap
cleanup() {
  local k p
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null; done
  bash tests/s3/down.sh --purge >/dev/null 2>&1
  for k in "${started[@]}"; do cluster "$k" bash tests/cluster/down.sh >/dev/null 2>&1; done
}
trap cleanup EXIT

# One after the other: the first may install Slurm's packages (apt-get takes one at a time).
for ((k = 1; k <= SHARDS; k++)); do
  if cluster "$k" bash tests/cluster/up.sh --accounting >"$WORK/cluster-$k-up.log" 2>"$WORK/cluster-$k-up.err"; then
    started+=("$k")
    confs[k]=$(tail -n 1 "$WORK/cluster-$k-up.log")
  else
    # The process's slurm_cluster fixture tries up.sh again, and skips where it cannot run here.
    echo "test cluster ${dirs[k]} did not start (code $?): $(tail -n 3 "$WORK/cluster-$k-up.err")"
  fi
  ((k == 1)) || continue
  # The tests without a cluster start now: Slurm's commands, if up.sh installed them, are
  # there from their start on; they need neither the other clusters nor make test's S3 server.
  env -u SLURM_CONF -u SLURMKIT_TEST_S3_URL -u SLURMKIT_TEST_S3_LOG nice -n 10 \
    "$PY" -m pytest -q -ra --durations=10 -m "not cluster" --basetemp="$WORK/rest" "$@" \
    >"$WORK/rest.log" 2>&1 &
  pids[0]=$!
done
if bash tests/s3/up.sh >"$SLURMKIT_TEST_S3_DIR/up.log" 2>&1; then
  # shellcheck source=/dev/null
  . "$SLURMKIT_TEST_S3_DIR/env.sh"
else
  echo "test S3 server did not start: $(tail -n 3 "$SLURMKIT_TEST_S3_DIR/up.log")"
fi

# shard K [PYTEST ARGS...]: cluster K's share of the cluster tests, on cluster K, with its own
# basetemp (pytest's cleanup of old numbered temp directories must not meet another process's).
# It execs pytest: run it in the background, where its pid is pytest's.
shard() {
  local k=$1 vars=(SLURMKIT_TEST_SHARD="$1/$SHARDS") own=()
  [ -z "${confs[k]:-}" ] || vars+=(SLURM_CONF="${confs[k]}")
  ((k == 1)) || own=(-u SLURMKIT_TEST_S3_URL -u SLURMKIT_TEST_S3_LOG)  # its own S3 server
  exec env "${own[@]}" SLURMKIT_TEST_CLUSTER_DIR="${dirs[k]}" \
    SLURMKIT_TEST_CLUSTER_PORT_OFFSET="${offsets[k]}" "${vars[@]}" \
    "$PY" -m pytest -q -ra --durations=10 -m cluster --basetemp="$WORK/cluster-$k" "${@:2}"
}
shard 1 "$@" &
pids[1]=$!
for ((k = 2; k <= SHARDS; k++)); do
  shard "$k" "$@" >"$WORK/cluster-$k.log" 2>&1 &
  pids[k]=$!
done
rcs=()
for ((k = 1; k <= SHARDS; k++)); do
  wait "${pids[k]}"
  rcs[k]=$?
  ((k > 1)) || continue
  echo
  echo "== the cluster tests of shard $k/$SHARDS, on ${dirs[k]} (run beside the ones above) =="
  cat "$WORK/cluster-$k.log"
done
wait "${pids[0]}"
rcs[0]=$?
pids=()
echo
echo "== the tests without a cluster (run beside the ones above) =="
cat "$WORK/rest.log"

# 5 is pytest's "no tests collected": fine for a process whose tests the arguments left out,
# as long as one process collected some.
rc=0 all5=1
for r in "${rcs[@]}"; do ((r == 5)) || all5=0; done
for r in "${rcs[@]}"; do
  ((r == 5 && !all5)) && r=0
  ((r > rc)) && rc=$r
done
if [ "$rc" -eq 0 ]; then rm -rf "$WORK/rest" "$WORK"/cluster-?; fi
exit "$rc"
