#!/usr/bin/env bash
# Stop the tests' S3 server started by up.sh (found by its pid file): SIGTERM, then SIGKILL.
# Usage: down.sh [--purge]   --purge also removes $SLURMKIT_TEST_S3_DIR.
set -euo pipefail
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source-path=SCRIPTDIR source=common.sh
source "$HERE/common.sh"

PURGE=0
for arg in "$@"; do
  case $arg in
    --purge) PURGE=1 ;;
    *) echo "usage: $0 [--purge]" >&2; exit 2 ;;
  esac
done

if pid=$(server_pid); then
  kill -TERM "$pid" 2>/dev/null || true
  for _ in $(seq 50); do server_pid >/dev/null || break; sleep 0.1; done
  if server_pid >/dev/null; then
    kill -KILL "$pid" 2>/dev/null || true
    for _ in $(seq 50); do server_pid >/dev/null || break; sleep 0.1; done
    server_pid >/dev/null && { echo "down.sh: S3 server $pid still running after SIGKILL" >&2; exit 1; }
  fi
fi
rm -f "$PIDFILE" "$DIR/url" "$DIR/env.sh"

if ((PURGE)) && [[ -d $DIR ]]; then
  [[ -e $DIR/.slurmkit-test-s3 ]] || { echo "down.sh: $DIR is not a test S3 dir; not removed" >&2; exit 1; }
  rm -rf "$DIR"
fi
