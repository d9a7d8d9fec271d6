# Sourced by up.sh and down.sh: where the tests' S3 server keeps its state.
DIR=${SLURMKIT_TEST_S3_DIR:-/tmp/slurmkit-s3}
PIDFILE=$DIR/pid

# server_pid: print the server's pid if it runs (a zombie does not count) as serve.py.
server_pid() {
  local pid stat
  pid=$(cat "$PIDFILE" 2>/dev/null) || return 1
  [[ $pid =~ ^[0-9]+$ ]] || return 1
  stat=$(cat "/proc/$pid/stat" 2>/dev/null) || return 1
  stat=${stat##*) }
  [[ ${stat%% *} != [ZX] ]] || return 1
  tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null | grep -q 'tests/s3/serve\.py' || return 1
  echo "$pid"
}
