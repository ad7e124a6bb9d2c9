#!/usr/bin/env bash
# Python peer of the batch-engine CPU benchmark: Powertools for AWS Lambda (Python) BatchProcessor.
#
#   scripts/bench-python.sh --event FILE --iterations N --response-out FILE [--warmup K]
#
# Creates .venv-bench/ in the repo root with the pinned aws-lambda-powertools (a no-op when it is
# already there with that version), then runs bench/powertools_bench.py with all arguments passed
# through. Prints one JSON line of results on stdout; install messages go to stderr.
# Make a test event with: .venv-bench/bin/python bench/make_sqs_event.py --records R --body-bytes B --out FILE
set -euo pipefail

POWERTOOLS_VERSION="3.37.0"
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
VENV="$ROOT/.venv-bench"
PY="$VENV/bin/python"

installed() {
  [ -x "$PY" ] &&
    [ "$("$PY" -c 'import importlib.metadata as m; print(m.version("aws-lambda-powertools"))' 2>/dev/null)" = "$POWERTOOLS_VERSION" ]
}

if ! installed; then
  echo "installing aws-lambda-powertools==$POWERTOOLS_VERSION into $VENV" >&2
  [ -x "$PY" ] || python3 -m venv "$VENV"
  "$VENV/bin/pip" install --quiet --disable-pip-version-check "aws-lambda-powertools==$POWERTOOLS_VERSION" >&2
fi

exec "$PY" "$ROOT/bench/powertools_bench.py" "$@"
