#!/usr/bin/env python3
"""Python peer of the batch-engine CPU benchmark: Powertools for AWS Lambda BatchProcessor.

usage: powertools_bench.py --event FILE --iterations N --response-out FILE [--warmup K]

Run it through scripts/bench-python.sh, which provides the pinned aws-lambda-powertools.

Each timed iteration goes from the raw event bytes to the response bytes:

    event = json.loads(raw)
    response = process_partial_response(event=event, record_handler=record_handler,
                                        processor=BatchProcessor(event_type=EventType.SQS),
                                        context=ctx)
    out = json.dumps(response, separators=(",", ":")).encode()

record_handler parses the body into a typed Order, hashes the body with SHA-256 and fails
every record whose sequence is a multiple of 100. Prints one JSON line on stdout and writes the
last iteration's response bytes to --response-out. After timing, the response is checked
against the failures computed independently of Powertools (exit 1 on a mismatch).

Logging: Powertools 3.x does not log failed records at WARNING unless a logger is passed to the
processor (we pass none, the default). Each failure still costs a formatted f-string and a
logger.debug() call on the "aws_lambda_powertools" package logger, which by default has a
NullHandler and does not propagate. We keep that behaviour; if POWERTOOLS_DEBUG is set (the
package logger then writes to stdout) its handlers are replaced by a NullHandler so stdout stays
one JSON line while the log records are still created.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import logging
import platform
import statistics
import sys
import time
from dataclasses import dataclass
from importlib.metadata import version as dist_version

from aws_lambda_powertools.utilities.batch import (
    BatchProcessor,
    EventType,
    process_partial_response,
)
from aws_lambda_powertools.utilities.data_classes.sqs_event import SQSRecord

_pkg_logger = logging.getLogger("aws_lambda_powertools")
if any(not isinstance(h, logging.NullHandler) for h in _pkg_logger.handlers):
    for _h in list(_pkg_logger.handlers):
        _pkg_logger.removeHandler(_h)
    _pkg_logger.addHandler(logging.NullHandler())
_pkg_logger.propagate = False


@dataclass(slots=True)
class Order:
    order_id: str
    customer: str
    sequence: int
    amount_cents: int
    currency: str
    note: str


def _str(d: dict, key: str) -> str:
    v = d[key]  # KeyError on a missing field
    if type(v) is not str:
        raise TypeError(f"field {key!r}: expected string, got {type(v).__name__}")
    return v


def _int(d: dict, key: str) -> int:
    v = d[key]
    if type(v) is not int:  # rejects bool and float as well
        raise TypeError(f"field {key!r}: expected integer, got {type(v).__name__}")
    return v


def parse_order(body: str) -> Order:
    d = json.loads(body)
    if type(d) is not dict:
        raise TypeError(f"body: expected object, got {type(d).__name__}")
    return Order(
        order_id=_str(d, "order_id"),
        customer=_str(d, "customer"),
        sequence=_int(d, "sequence"),
        amount_cents=_int(d, "amount_cents"),
        currency=_str(d, "currency"),
        note=_str(d, "note"),
    )


def record_handler(record: SQSRecord):
    body = record.body
    order = parse_order(body)
    digest = hashlib.sha256(body.encode()).digest()
    if order.sequence % 100 == 0:
        raise ValueError("deterministic failure")
    return digest


class FakeLambdaContext:
    """The attributes and method of the Lambda runtime's context object, with fixed values."""

    function_name = "orders-worker"
    function_version = "$LATEST"
    invoked_function_arn = "arn:aws:lambda:us-east-1:123456789012:function:orders-worker"
    memory_limit_in_mb = 1024
    aws_request_id = "00000000-0000-4000-8000-000000000000"
    log_group_name = "/aws/lambda/orders-worker"
    log_stream_name = "2024/01/01/[$LATEST]00000000000000000000000000000000"
    tenant_id = None
    identity = None
    client_context = None

    def get_remaining_time_in_millis(self) -> int:
        return 900_000


def run_once(raw: bytes, ctx: FakeLambdaContext) -> bytes:
    event = json.loads(raw)
    response = process_partial_response(
        event=event,
        record_handler=record_handler,
        processor=BatchProcessor(event_type=EventType.SQS),
        context=ctx,
    )
    return json.dumps(response, separators=(",", ":")).encode()


def expected_response(raw: bytes) -> bytes:
    """The response computed without Powertools: failing records' messageIds in record order."""
    failures = []
    for rec in json.loads(raw)["Records"]:
        try:
            ok = parse_order(rec["body"]).sequence % 100 != 0
        except Exception:
            ok = False
        if not ok:
            failures.append({"itemIdentifier": rec["messageId"]})
    return json.dumps({"batchItemFailures": failures}, separators=(",", ":")).encode()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--event", required=True, help="Lambda SQS event JSON file")
    ap.add_argument("--iterations", type=int, required=True, help="timed iterations")
    ap.add_argument("--response-out", required=True, help="where to write the last response bytes")
    ap.add_argument("--warmup", type=int, default=1, help="untimed iterations first (default 1)")
    args = ap.parse_args()
    if args.iterations < 1 or args.warmup < 0:
        ap.error("--iterations must be >= 1 and --warmup >= 0")

    with open(args.event, "rb") as f:
        raw = f.read()
    records = len(json.loads(raw)["Records"])
    if records == 0:
        ap.error("the event has no records")
    ctx = FakeLambdaContext()

    for _ in range(args.warmup):
        run_once(raw, ctx)

    times: list[int] = []
    out = b""
    for _ in range(args.iterations):
        t0 = time.perf_counter_ns()
        out = run_once(raw, ctx)
        times.append(time.perf_counter_ns() - t0)

    with open(args.response_out, "wb") as f:
        f.write(out)

    want = expected_response(raw)
    if out != want:
        print(
            f"response mismatch: got {out[:200]!r}... want {want[:200]!r}...",
            file=sys.stderr,
        )
        return 1

    median_ns = statistics.median(times)
    print(
        json.dumps(
            {
                "peer": "powertools",
                "powertools_version": dist_version("aws-lambda-powertools"),
                "python_version": platform.python_version(),
                "records": records,
                "iterations": args.iterations,
                "median_ns_per_iteration": round(median_ns),
                "us_per_record": median_ns / records / 1000,
                "min_us_per_record": min(times) / records / 1000,
            },
            separators=(",", ":"),
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
