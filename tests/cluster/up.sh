#!/usr/bin/env bash
# Start the private 4-node Slurm test cluster, or confirm that it already runs.
# Usage: up.sh [--accounting]   (or SLURMKIT_TEST_ACCOUNTING=1)
# State lives in $SLURMKIT_TEST_CLUSTER_DIR (default /tmp/slurmkit-cluster), ports move by
# $SLURMKIT_TEST_CLUSTER_PORT_OFFSET (common.sh). Progress goes to
# stderr; the last stdout line is the path for SLURM_CONF. Exit 3: the cluster cannot be
# started here (not root, packages missing and not installable, no namespaces); the reason is
# the last line on stderr.
set -euo pipefail
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source=tests/cluster/common.sh
source "$HERE/common.sh"

ACCT=${SLURMKIT_TEST_ACCOUNTING:-0}
for arg in "$@"; do
  case $arg in
    --accounting) ACCT=1 ;;
    *) echo "usage: $0 [--accounting]" >&2; exit 2 ;;
  esac
done
TIMEOUT=${SLURMKIT_TEST_CLUSTER_TIMEOUT:-60}
HOST=$(hostname -s)
MUNGE_SOCKET=$DIR/munge/munged.sock
DB_SOCKET=$DIR/mysql.sock

say() { echo "up.sh: $*" >&2; }
cannot() { echo "slurm test cluster cannot start: $*" >&2; exit 3; }

# wait_for SECONDS WHAT CMD...: poll CMD every 0.1 s until it succeeds.
wait_for() {
  local end=$((SECONDS + $1)) what=$2
  shift 2
  until "$@" >/dev/null 2>&1; do
    if ((SECONDS >= end)); then
      say "timed out waiting for $what"
      show_logs
      exit 1
    fi
    sleep 0.1
  done
}

show_logs() {
  local f
  for f in "$DIR"/munge/munged.log "$DIR"/log/*; do
    [[ -s $f ]] && { echo "==> $f <==" && tail -n 15 "$f"; } >&2
  done
  return 0
}

render_conf() {
  local t acct="AccountingStorageType=accounting_storage/none"
  if ((ACCT)); then
    acct="AccountingStorageType=accounting_storage/slurmdbd
AccountingStorageHost=127.0.0.1
AccountingStoragePort=$DBD_PORT
AccountingStoragePass=$MUNGE_SOCKET
AccountingStorageTRES=gres/gpu
AccountingStoreFlags=job_comment"
  fi
  t=$(<"$HERE/slurm.conf.in")
  t=${t//@DIR@/"$DIR"}
  t=${t//@HOST@/"$HOST"}
  t=${t//@CTLD_PORT@/"$CTLD_PORT"}
  t=${t//@SLURMD_PORTS@/"$SLURMD_PORTS"}
  printf '%s\n' "${t//@ACCOUNTING@/"$acct"}"
}

render_gres() {
  printf 'AutoDetect=off\nNodeName=n[1-4] Name=gpu File=%s/dev/gpu[0-3]\n' "$DIR"
}

# slurmd wants character devices: the harmless ones of /dev/null's driver (null, zero, full,
# urandom) stand in; task/none puts no device cgroup around them.
make_fake_gpus() {
  local i minors=(3 5 7 9)
  mkdir -p "$DIR/dev"
  for i in 0 1 2 3; do
    [[ -c $DIR/dev/gpu$i ]] || { rm -f "$DIR/dev/gpu$i" && mknod -m 0666 "$DIR/dev/gpu$i" c 1 "${minors[i]}"; }
  done
}

node_states() { timeout 10 sinfo -h -N -o '%N %t' | sort -u; }

# Every daemon of ours runs and every node is usable (jobs may be running).
healthy() {
  local d states
  [[ -f $CONF && "$(<"$CONF")" == "$(render_conf)" ]] || return 1
  [[ -f $DIR/gres.conf && "$(<"$DIR/gres.conf")" == "$(render_gres)" && -f $DIR/mpi.conf ]] || return 1
  pid_of "$MUNGE_PID" munged >/dev/null && pid_of "$RUN/slurmctld.pid" slurmctld >/dev/null || return 1
  for d in "${NODES[@]}"; do pid_of "$RUN/slurmd-$d.pid" slurmd >/dev/null || return 1; done
  if ((ACCT)); then
    pid_of "$RUN/mariadbd.pid" mariadbd >/dev/null && pid_of "$RUN/slurmdbd.pid" slurmdbd >/dev/null || return 1
  fi
  states=$(node_states 2>/dev/null) || return 1
  [[ $(grep -cE '^n[1-4] (idle|alloc|mix|comp)$' <<<"$states") == "${#NODES[@]}" ]]
}

all_idle() { [[ $(node_states | grep -c ' idle$') == "${#NODES[@]}" ]]; }

install_packages() {
  local cmds=(munged slurmctld slurmd sinfo squeue sbatch scontrol) pkgs=(munge slurmctld slurmd slurm-client) c
  ((ACCT)) && cmds+=(mariadbd mariadb-install-db mariadb slurmdbd sacctmgr) && pkgs+=(mariadb-server slurmdbd)
  for c in "${cmds[@]}"; do
    command -v "$c" >/dev/null || {
      command -v apt-get >/dev/null || cannot "$c is missing and there is no apt-get to install ${pkgs[*]}"
      say "installing ${pkgs[*]}"
      { apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "${pkgs[@]}"; } >&2 ||
        cannot "apt-get install ${pkgs[*]} failed"
      return
    }
  done
}

# srun --mpi=pmix: Slurm's pmix plugin dlopens pmix2/lib/libpmix.so, which only Debian's
# libpmix-dev ships (libpmix2 has the versioned library alone).
install_pmix() {
  compgen -G "/usr/lib/*/pmix2/lib/libpmix.so" >/dev/null && return
  command -v apt-get >/dev/null || cannot "libpmix-dev is missing and there is no apt-get to install it"
  say "installing libpmix2 libpmix-dev"
  { apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends libpmix2 libpmix-dev; } >&2 ||
    cannot "apt-get install libpmix2 libpmix-dev failed"
}

start_munge() {
  local key=$DIR/munge/munge.key
  [[ -s $key ]] || dd if=/dev/urandom of="$key" bs=1024 count=1 status=none
  chmod 0400 "$key"
  munged --socket="$MUNGE_SOCKET" --pid-file="$MUNGE_PID" --log-file="$DIR/munge/munged.log" \
    --seed-file="$DIR/munge/munged.seed" --key-file="$key" </dev/null >/dev/null 2>&1 9>&- ||
    { show_logs; say "munged failed to start"; exit 1; }
  wait_for 10 munged munge --socket="$MUNGE_SOCKET" --string=ping
}

db() { mariadb --no-defaults --socket="$DB_SOCKET" "$@"; }

start_accounting() {
  [[ -d $DIR/mysql/mysql ]] || mariadb-install-db --no-defaults --datadir="$DIR/mysql" --user=root \
    --auth-root-authentication-method=socket --skip-test-db >"$DIR/log/mariadb-install.out" 2>&1 ||
    { show_logs; say "mariadb-install-db failed"; exit 1; }
  setsid mariadbd --no-defaults --datadir="$DIR/mysql" --socket="$DB_SOCKET" --port="$DB_PORT" \
    --bind-address=127.0.0.1 --skip-name-resolve --pid-file="$RUN/mariadbd.pid" \
    --log-error="$DIR/log/mariadbd.log" --user=root </dev/null >/dev/null 2>&1 9>&- &
  wait_for 60 mariadbd db -e 'SELECT 1'
  db -e "CREATE USER IF NOT EXISTS 'slurm'@'127.0.0.1' IDENTIFIED BY 'slurm';
         GRANT ALL ON slurm_acct_db.* TO 'slurm'@'127.0.0.1';"
  (umask 077 && cat >"$DIR/slurmdbd.conf" <<EOF
AuthType=auth/munge
AuthInfo=socket=$MUNGE_SOCKET
DbdHost=$HOST
DbdAddr=127.0.0.1
DbdPort=$DBD_PORT
SlurmUser=root
PidFile=$RUN/slurmdbd.pid
LogFile=$DIR/log/slurmdbd.log
StorageType=accounting_storage/mysql
StorageHost=127.0.0.1
StoragePort=$DB_PORT
StorageUser=slurm
StoragePass=slurm
StorageLoc=slurm_acct_db
EOF
  )
  slurmdbd </dev/null >/dev/null 2>&1 9>&- || { show_logs; say "slurmdbd failed to start"; exit 1; }
  wait_for 60 slurmdbd sacctmgr -n list cluster
  sacctmgr -n -P list cluster format=cluster | grep -qx slurmkit || sacctmgr -i add cluster slurmkit >&2
}

start_slurmctld() {
  slurmctld -f "$CONF" </dev/null >/dev/null 2>&1 9>&- || { show_logs; say "slurmctld failed to start"; exit 1; }
  wait_for 30 slurmctld scontrol ping
  # Recovered state: cancel jobs of an earlier run (nodes are not up yet, so none can start)
  # and clear node states a test left behind (DRAIN and DOWN survive a restart).
  scancel --user=root >&2 || true
  local n
  for n in "${NODES[@]}"; do scontrol update nodename="$n" state=resume >/dev/null 2>&1 || true; done
}

# Each slurmd gets its own hostname and an /etc/hosts naming n1..n4 in private namespaces.
# PMIx's client directories are named by job step only: each node gets its own $DIR/pmix
# (mpi.conf's PMIxCliTmpDirBase), or two nodes of this one host collide there.
start_slurmd() {
  mkdir -p "$DIR/pmix" "$DIR/pmix-$1"
  # shellcheck disable=SC2016  # the script of sh -c, which expands its own arguments
  unshare --uts --mount --propagation private /bin/sh -c \
    'hostname "$1" && mount --bind "$2" /etc/hosts && mount --bind "$4-$1" "$4" && exec slurmd -f "$3" -N "$1"' \
    sh "$1" "$DIR/hosts" "$CONF" "$DIR/pmix" </dev/null >>"$DIR/log/slurmd-$1.out" 2>&1 9>&- ||
    { show_logs; say "slurmd $1 failed to start"; exit 1; }
}

if ((EUID == 0)); then
  mkdir -p "$DIR"
  exec 9>"$DIR/up.lock"  # daemons start with 9>&- so that they do not hold the lock
  flock 9
fi

# Keep accounting when it already runs, so a plain up.sh never takes it away.
if ((!ACCT)) && grep -q accounting_storage/slurmdbd "$CONF" 2>/dev/null &&
  pid_of "$RUN/slurmdbd.pid" slurmdbd >/dev/null; then
  ACCT=1
fi

if command -v sinfo >/dev/null && healthy; then
  say "cluster already up"
else
  start=${EPOCHREALTIME/./}
  ((EUID == 0)) || cannot "starting the cluster needs root (running as uid $EUID)"
  install_packages
  install_pmix
  unshare --uts --mount true 2>/dev/null || cannot "unshare --uts --mount is not permitted here"
  "$HERE/down.sh" >&2
  mkdir -p "$RUN" "$DIR/log" "$DIR/state"
  mkdir -p "$DIR/munge" && chmod 0711 "$DIR/munge"
  touch "$DIR/.slurmkit-test-cluster"
  for n in "${NODES[@]}"; do mkdir -p "$DIR/spool/slurmd-$n"; done
  render_conf >"$CONF"
  render_gres >"$DIR/gres.conf"
  echo "PMIxCliTmpDirBase=$DIR/pmix" >"$DIR/mpi.conf"
  make_fake_gpus
  { cat /etc/hosts && echo "127.0.0.1 ${NODES[*]} $HOST"; } >"$DIR/hosts"
  start_munge
  ((ACCT)) && start_accounting
  start_slurmctld
  for n in "${NODES[@]}"; do start_slurmd "$n"; done
  for n in "${NODES[@]}"; do
    wait_for 10 "slurmd $n pid file" pid_of "$RUN/slurmd-$n.pid" slurmd
    node_ns "$(pid_of "$RUN/slurmd-$n.pid" slurmd)" >"$RUN/slurmd-$n.ns"
  done
  wait_for "$TIMEOUT" "${#NODES[*]} idle nodes" all_idle
  echo "export SLURM_CONF=$CONF SLURMKIT_TEST_CLUSTER_DIR=$DIR SLURMKIT_TEST_CLUSTER_PORT_OFFSET=$OFFSET" >"$DIR/env.sh"
  say "cluster up in $(((${EPOCHREALTIME/./} - start) / 1000)) ms ($(slurmctld -V))"
fi
echo "$CONF"
