# Sourced by up.sh and down.sh: where the test cluster lives and how to find its daemons.
export PATH=/usr/sbin:/usr/bin:/sbin:/bin:$PATH
DIR=${SLURMKIT_TEST_CLUSTER_DIR:-/tmp/slurmkit-cluster}
CONF=$DIR/slurm.conf
# A second cluster on the same host needs its own directory and ports: every port below moves by
# SLURMKIT_TEST_CLUSTER_PORT_OFFSET (default 0; e.g. 100 for a second one, 200 for a third).
OFFSET=${SLURMKIT_TEST_CLUSTER_PORT_OFFSET:-0}
[[ $OFFSET =~ ^[0-9]+$ ]] && ((OFFSET < 10000)) || { echo "SLURMKIT_TEST_CLUSTER_PORT_OFFSET: want 0-9999, got '$OFFSET'" >&2; exit 2; }
CTLD_PORT=$((16817 + OFFSET))
DBD_PORT=$((16819 + OFFSET))
DB_PORT=$((16306 + OFFSET))
SLURMD_PORTS="$((17001 + OFFSET))-$((17004 + OFFSET))"
export SLURM_CONF=$CONF
NODES=(n1 n2 n3 n4)
MUNGE_PID=$DIR/munge/munged.pid
RUN=$DIR/run

# pid_of PIDFILE COMM: print the pid in PIDFILE if that process runs (zombies do not count) as COMM.
pid_of() {
  local pid stat comm
  pid=$(cat "$1" 2>/dev/null) || return 1
  [[ $pid =~ ^[0-9]+$ ]] || return 1
  stat=$(cat "/proc/$pid/stat" 2>/dev/null) || return 1
  stat=${stat##*) }
  [[ ${stat%% *} != [ZX] ]] || return 1
  comm=$(cat "/proc/$pid/comm" 2>/dev/null) || return 1
  [[ $comm == "$2" ]] || return 1
  echo "$pid"
}

# node_ns PID: the mount and UTS namespaces of PID, which identify one node's processes.
node_ns() {
  echo "$(readlink "/proc/$1/ns/mnt") $(readlink "/proc/$1/ns/uts")"
}
