#!/usr/bin/env bash
# Local AWS emulator (moto in server mode) for the demo and the tests.
#
#   scripts/emulator.sh install   create .venv and install the pinned moto (no-op when done)
#   scripts/emulator.sh start     install, start on 127.0.0.1 (EMULATOR_PORT or a free port),
#                                 wait until it answers, print its URL (no-op when running)
#   scripts/emulator.sh url       print the URL of the running emulator
#   scripts/emulator.sh stop      stop it
#   scripts/emulator.sh reset     clear all emulated state (POST /moto-api/reset)
#
# State lives in .emulator/ (pid, port, log); the virtualenv in .venv/. Both are ignored by git.
set -euo pipefail

MOTO_VERSION="5.2.5"
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
VENV="$ROOT/.venv"
STATE="$ROOT/.emulator"
PY="$VENV/bin/python"

installed() {
  [ -x "$VENV/bin/moto_server" ] &&
    [ "$("$PY" -c 'import importlib.metadata as m; print(m.version("moto"))' 2>/dev/null)" = "$MOTO_VERSION" ]
}

install() {
  if installed; then return 0; fi
  echo "installing moto[server]==$MOTO_VERSION into $VENV" >&2
  [ -x "$PY" ] || python3 -m venv "$VENV"
  "$VENV/bin/pip" install --quiet --disable-pip-version-check "moto[server]==$MOTO_VERSION"
}

answers() {
  "$PY" - "$1" <<'PY'
import sys, urllib.request
try:
    # /moto-api/config is cheap and always answers (data.json dumps every resource and
    # fails on some); generous timeout: a loaded machine must not call a live emulator dead.
    urllib.request.urlopen(sys.argv[1] + "/moto-api/config", timeout=10).read()
except Exception:
    sys.exit(1)
PY
}

running_url() {
  [ -f "$STATE/pid" ] && [ -f "$STATE/port" ] || return 1
  kill -0 "$(cat "$STATE/pid")" 2>/dev/null || return 1
  local url="http://127.0.0.1:$(cat "$STATE/port")"
  answers "$url" || return 1
  echo "$url"
}

free_port() {
  "$PY" -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'
}

start() {
  install
  if running_url >/dev/null; then running_url; return 0; fi
  mkdir -p "$STATE"
  local port="${EMULATOR_PORT:-$(free_port)}"
  # moto's server with DynamoDB conditional writes made atomic, as on AWS (see the script).
  nohup "$PY" "$ROOT/scripts/moto_server.py" -H 127.0.0.1 -p "$port" >"$STATE/log" 2>&1 &
  echo $! >"$STATE/pid"
  echo "$port" >"$STATE/port"
  local url="http://127.0.0.1:$port"
  for _ in $(seq 1 100); do
    if answers "$url"; then echo "$url"; return 0; fi
    sleep 0.1
  done
  echo "emulator did not answer on $url within 10 s; see $STATE/log" >&2
  return 1
}

stop() {
  if [ -f "$STATE/pid" ]; then
    kill "$(cat "$STATE/pid")" 2>/dev/null || true
    rm -f "$STATE/pid" "$STATE/port"
  fi
}

case "${1:-}" in
  install) install ;;
  start) start ;;
  url) running_url || { echo "emulator is not running; run: $0 start" >&2; exit 1; } ;;
  stop) stop ;;
  reset) url="$(running_url)" && "$PY" -c "import urllib.request,sys; urllib.request.urlopen(urllib.request.Request(sys.argv[1]+'/moto-api/reset', method='POST'))" "$url" ;;
  *) sed -n '2,12p' "$0" | sed 's/^# \{0,1\}//'; exit 2 ;;
esac
