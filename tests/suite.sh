#!/usr/bin/env bash
# make test's pytest run (make lint runs before it). It starts the real Slurm test cluster
# (tests/cluster/up.sh) and an S3 server (tests/s3/up.sh), and stops both after.
#
# Two pytest processes run side by side, one a core:
# - the tests marked `cluster`, one at a time: they share the cluster's four nodes, its GPUs and its
#   queue, and some reconfigure it. They get make test's S3 server.
# - all the other tests, with no cluster (SLURM_CONF unset: a test that submits is marked
#   `cluster`) and an S3 server of their own (tests/s3server.py starts it: request counts are
#   per server).
# The second one's output follows the first one's. Exit 0 when both passed.
# Usage: tests/suite.sh [PYTEST ARGS...]   (both processes get them)
set -uo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
PY=${PY:-$ROOT/.venv/bin/python}
CLUSTER_DIR=${CLUSTER_DIR:-/tmp/slurmkit-cluster}
cd "$ROOT" || exit 1

WORK=$(mktemp -d /tmp/slurmkit-suite.XXXXXX)
export SLURMKIT_TEST_S3_DIR=$WORK/s3 SLURMKIT_TEST_S3_WATCH=$$ SLURMKIT_TEST_S3_PYTHON=$PY
mkdir -p "$SLURMKIT_TEST_S3_DIR"
up=1
# shellcheck disable=SC2317  # run by the EXIT trap
cleanup() {
  bash tests/s3/down.sh --purge >/dev/null 2>&1
  if [ "$up" -eq 0 ]; then bash tests/cluster/down.sh >/dev/null 2>&1; fi
  [ -z "${rest:-}" ] || kill "$rest" 2>/dev/null
}
trap cleanup EXIT

bash tests/cluster/up.sh --accounting >"$WORK/cluster-up.log" 2>&1
up=$?
if [ "$up" -eq 0 ]; then
  export SLURM_CONF=$CLUSTER_DIR/slurm.conf
else
  echo "test cluster did not start (code $up): $(tail -n 3 "$WORK/cluster-up.log")"
fi
if bash tests/s3/up.sh >"$SLURMKIT_TEST_S3_DIR/up.log" 2>&1; then
  # shellcheck source=/dev/null
  . "$SLURMKIT_TEST_S3_DIR/env.sh"
else
  echo "test S3 server did not start: $(tail -n 3 "$SLURMKIT_TEST_S3_DIR/up.log")"
fi

# Each process has its own basetemp: pytest's cleanup of old numbered temp directories must not
# meet the other process's. The cluster's tests are the longer run, and their jobs need CPU at
# set times (Slurm's signals come with a lead): the other process yields to them (nice).
env -u SLURM_CONF -u SLURMKIT_TEST_S3_URL -u SLURMKIT_TEST_S3_LOG nice -n 10 \
  "$PY" -m pytest -q -ra --durations=10 -m "not cluster" --basetemp="$WORK/rest" "$@" \
  >"$WORK/rest.log" 2>&1 &
rest=$!
"$PY" -m pytest -q -ra --durations=10 -m cluster --basetemp="$WORK/cluster" "$@"
rc_cluster=$?
wait "$rest"
rc_rest=$?
rest=
echo
echo "== the tests without the cluster (run beside the ones above) =="
cat "$WORK/rest.log"

# 5 is pytest's "no tests collected": fine for one of the two when arguments chose the other.
if [ "$rc_cluster" -eq 5 ] && [ "$rc_rest" -ne 5 ]; then rc_cluster=0; fi
if [ "$rc_rest" -eq 5 ] && [ "$rc_cluster" -ne 5 ]; then rc_rest=0; fi
rc=$((rc_cluster > rc_rest ? rc_cluster : rc_rest))
if [ "$rc" -eq 0 ]; then rm -rf "$WORK/rest" "$WORK/cluster"; fi
exit "$rc"
