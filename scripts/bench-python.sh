#!/usr/bin/env bash
# Python peers of the benchmarks: Powertools for AWS Lambda (Python).
#
#   scripts/bench-python.sh --event FILE --iterations N --response-out FILE [--warmup K]
#       the batch-engine CPU benchmark (bench/powertools_bench.py, BatchProcessor)
#   scripts/bench-python.sh worker sync|async|idempotent
#       the end-to-end cost benchmark's Python worker (bench/powertools_worker.py) run by AWS's
#       Python runtime interface client (awslambdaric) against $AWS_LAMBDA_RUNTIME_API, as the
#       managed Python runtime runs it: BatchProcessor, AsyncBatchProcessor with aiohttp, or
#       BatchProcessor with Powertools' idempotency on DynamoDB (boto3, as Lambda provides it)
#
# Creates .venv-bench/ in the repo root with the pinned packages (a no-op when they are already
# there at those versions), then runs the peer with all arguments passed through. Prints one JSON line of results on stdout; install messages go to stderr.
# Make a test event with: .venv-bench/bin/python bench/make_sqs_event.py --records R --body-bytes B --out FILE
set -euo pipefail

POWERTOOLS_VERSION="3.37.0"
RIC_VERSION="4.2.2"
AIOHTTP_VERSION="3.14.5"
BOTO3_VERSION="1.44.8"
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
VENV="$ROOT/.venv-bench"
PY="$VENV/bin/python"

installed() {
  [ -x "$PY" ] &&
    [ "$("$PY" -c 'import importlib.metadata as m; print(m.version("aws-lambda-powertools"), m.version("awslambdaric"), m.version("aiohttp"), m.version("boto3"))' 2>/dev/null)" = "$POWERTOOLS_VERSION $RIC_VERSION $AIOHTTP_VERSION $BOTO3_VERSION" ]
}

if ! installed; then
  echo "installing aws-lambda-powertools==$POWERTOOLS_VERSION awslambdaric==$RIC_VERSION aiohttp==$AIOHTTP_VERSION boto3==$BOTO3_VERSION into $VENV" >&2
  [ -x "$PY" ] || python3 -m venv "$VENV"
  "$VENV/bin/pip" install --quiet --disable-pip-version-check \
    "aws-lambda-powertools==$POWERTOOLS_VERSION" "awslambdaric==$RIC_VERSION" "aiohttp==$AIOHTTP_VERSION" \
    "boto3==$BOTO3_VERSION" >&2
fi

if [ "${1:-}" = "worker" ]; then
  case "${2:-}" in
    sync | async | idempotent) ;;
    *) echo "usage: $0 worker sync|async|idempotent" >&2; exit 2 ;;
  esac
  # As in Lambda: the handler's folder is the task root and the working directory.
  cd "$ROOT/bench"
  export LAMBDA_TASK_ROOT="$ROOT/bench"
  exec "$PY" -m awslambdaric "powertools_worker.handler_$2"
fi

exec "$PY" "$ROOT/bench/powertools_bench.py" "$@"
