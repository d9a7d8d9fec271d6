# Sourced by up.sh and down.sh: where the test cluster lives and how to find its daemons.
export PATH=/usr/sbin:/usr/bin:/sbin:/bin:$PATH
DIR=${SLURMKIT_TEST_CLUSTER_DIR:-/tmp/slurmkit-cluster}
CONF=$DIR/slurm.conf
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
