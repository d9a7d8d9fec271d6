#!/usr/bin/env bash
# Start the tests' S3 server (moto's standalone server, moto[server], through serve.py) on a free
# port of 127.0.0.1, or confirm that it already runs. Jobs on the test cluster reach it there
# (its nodes share this machine's network).
# Usage: up.sh   State lives in $SLURMKIT_TEST_S3_DIR (default /tmp/slurmkit-s3): pid, url,
# requests.log (the server's request log, one line per request) and env.sh. Progress goes to
# stderr; the last stdout line (also in env.sh) exports SLURMKIT_TEST_S3_URL and
# SLURMKIT_TEST_S3_LOG, for `eval "$(tests/s3/up.sh)"`. Exit 3: it cannot start here (no
# python with moto[server]); the reason is the last line on stderr.
# Environment: SLURMKIT_TEST_S3_PYTHON (default .venv/bin/python), SLURMKIT_TEST_S3_WATCH=PID
# (the server exits once PID has ended).
set -euo pipefail
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source-path=SCRIPTDIR source=common.sh
source "$HERE/common.sh"
(($# == 0)) || { echo "usage: $0" >&2; exit 2; }
PY=${SLURMKIT_TEST_S3_PYTHON:-$HERE/../../.venv/bin/python}
LOG=$DIR/requests.log

say() { echo "up.sh: $*" >&2; }
cannot() { echo "test S3 server cannot start: $*" >&2; exit 3; }

# answers URL: something answers HTTP at URL (a connection first, without a python to start;
# the query marks the request as not the tests', see tests/s3server.py).
answers() {
  local hostport=${1#http://}
  (exec 3<>"/dev/tcp/${hostport%:*}/${hostport##*:}") 2>/dev/null || return 1
  "$PY" - "$1" <<'PYEOF' >/dev/null 2>&1
import sys, urllib.error, urllib.request
try:
    urllib.request.urlopen(sys.argv[1] + "/?slurmkit-test", timeout=5).read()  # not counted
except urllib.error.HTTPError:
    pass  # an S3 error is an answer
PYEOF
}

free_port() { "$PY" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }

exports() { echo "export SLURMKIT_TEST_S3_URL=$(<"$DIR/url") SLURMKIT_TEST_S3_LOG=$LOG"; }

[[ -x $PY ]] || PY=$(command -v python3) || cannot "no python (set SLURMKIT_TEST_S3_PYTHON)"
mkdir -p "$DIR"
exec 9>"$DIR/up.lock"
flock 9

if pid=$(server_pid) && [[ -s $DIR/url ]] && answers "$(<"$DIR/url")"; then
  say "S3 server already up (pid $pid)"
  exports
  exit 0
fi
"$PY" -c 'import flask, moto.server; moto.server.MotoRequestHandler' 2>/dev/null ||
  cannot "$PY has no moto[server] with moto.server.MotoRequestHandler (pip install 'moto[server]>=5')"
"$HERE/down.sh" >&2
touch "$DIR/.slurmkit-test-s3"
start=${EPOCHREALTIME/./}
for _ in 1 2 3; do  # another process may take the free port first: try another
  port=$(free_port)
  : >"$LOG"
  "$PY" "$HERE/serve.py" -H 127.0.0.1 -p "$port" </dev/null >/dev/null 2>>"$LOG" 9>&- &
  echo $! >"$PIDFILE"
  echo "http://127.0.0.1:$port" >"$DIR/url"
  for _ in $(seq 300); do  # 30 s
    server_pid >/dev/null || break
    if answers "$(<"$DIR/url")"; then
      exports >"$DIR/env.sh"
      say "S3 server up in $(((${EPOCHREALTIME/./} - start) / 1000)) ms on $(<"$DIR/url") (pid $!)"
      exports
      exit 0
    fi
    sleep 0.1
  done
  server_pid >/dev/null && { say "no answer from the S3 server after 30 s"; tail -n 15 "$LOG" >&2; "$HERE/down.sh" >&2; exit 1; }
done
tail -n 15 "$LOG" >&2
say "the S3 server did not start"
exit 1
