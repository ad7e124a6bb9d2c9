#!/usr/bin/env python3
"""Write a deterministic Lambda SQS event for the batch benchmarks.

usage: make_sqs_event.py --records R --body-bytes B --out FILE

Record i (0-based) has messageId 00000000-0000-4000-8000-<i as 12 digits> and a body that is a
compact JSON object with exactly the Order fields (order_id, customer, sequence, amount_cents,
currency, note); sequence = i, and note is padded so that the body is B bytes long (or as short
as the other fields allow). Standard library only, no randomness: the same arguments always give
the same bytes.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys

FILLER = "lorem ipsum dolor sit amet consectetur adipiscing elit sed do eiusmod tempor "
QUEUE_ARN = "arn:aws:sqs:us-east-1:123456789012:orders"
BASE_TS_MS = 1_700_000_000_000


def body_for(i: int, body_bytes: int) -> str:
    fields = {
        "order_id": f"ord-{i:08d}",
        "customer": f"cust-{i % 997:05d}",
        "sequence": i,
        "amount_cents": 100 + (i * 7919) % 100_000,
        "currency": ("USD", "EUR", "GBP")[i % 3],
        "note": "",
    }
    base = json.dumps(fields, separators=(",", ":"))
    pad = max(0, body_bytes - len(base.encode()))
    fields["note"] = (FILLER * (pad // len(FILLER) + 1))[:pad]
    return json.dumps(fields, separators=(",", ":"))


def record_for(i: int, body_bytes: int) -> dict:
    body = body_for(i, body_bytes)
    sent = str(BASE_TS_MS + i)
    return {
        "messageId": f"00000000-0000-4000-8000-{i:012d}",
        "receiptHandle": "AQEB" + hashlib.sha256(f"receipt-{i}".encode()).hexdigest(),
        "body": body,
        "attributes": {
            "ApproximateReceiveCount": "1",
            "SentTimestamp": sent,
            "SenderId": "AIDAIENQZJOLO23YVJ4VO",
            "ApproximateFirstReceiveTimestamp": str(BASE_TS_MS + i + 5),
        },
        "messageAttributes": {},
        "md5OfBody": hashlib.md5(body.encode()).hexdigest(),
        "eventSource": "aws:sqs",
        "eventSourceARN": QUEUE_ARN,
        "awsRegion": "us-east-1",
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--records", type=int, required=True)
    ap.add_argument("--body-bytes", type=int, required=True)
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    if args.records < 1 or args.body_bytes < 1:
        ap.error("--records and --body-bytes must be positive")

    event = {"Records": [record_for(i, args.body_bytes) for i in range(args.records)]}
    data = json.dumps(event, separators=(",", ":")).encode()
    with open(args.out, "wb") as f:
        f.write(data)
    print(f"wrote {args.out}: {args.records} records, {len(data)} bytes", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
