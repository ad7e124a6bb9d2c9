"""Powertools for AWS Lambda (Python) peer of the worker for the end-to-end cost benchmark.

The same work as the compiled worker with WORKER_DOWNSTREAM_URL set: every record's body is
POSTed to the downstream with the message id as its Idempotency-Key; a 2xx answer is success,
anything else fails the record, which goes into batchItemFailures. Run by AWS's own Python
runtime interface client (awslambdaric) against the local Runtime API, exactly as the Python
managed runtime runs a handler:

    python -m awslambdaric powertools_worker.handler_sync    # BatchProcessor, one record at a time
    python -m awslambdaric powertools_worker.handler_async   # AsyncBatchProcessor, all at once
    python -m awslambdaric powertools_worker.handler_idempotent
        # BatchProcessor, each record through Powertools' idempotency on DynamoDB
        # (IDEMPOTENCY_TABLE, keyed by the message id), as its documentation shows

scripts/bench-python.sh worker sync|async|idempotent does that with the pinned packages. The HTTP clients
live for the sandbox's life (one keep-alive connection for the sync handler, one aiohttp
session on the sandbox's one event loop for the async one), as a tuned Python handler keeps
them.
"""

from __future__ import annotations

import http.client
import os
import urllib.parse

from aws_lambda_powertools.utilities.batch import (
    AsyncBatchProcessor,
    BatchProcessor,
    EventType,
    async_process_partial_response,
    process_partial_response,
)
from aws_lambda_powertools.utilities.data_classes.sqs_event import SQSRecord

_URL = urllib.parse.urlsplit(os.environ["WORKER_DOWNSTREAM_URL"])
_PATH = _URL.path or "/"
_TIMEOUT_S = 10.0


class DownstreamError(Exception):
    """The downstream did not accept the record."""


# --- BatchProcessor: records one after another over one keep-alive connection ---------------

_connection: http.client.HTTPConnection | None = None


def _post(body: str, key: str) -> int:
    global _connection
    for attempt in (1, 2):
        if _connection is None:
            _connection = http.client.HTTPConnection(_URL.hostname, _URL.port, timeout=_TIMEOUT_S)
        try:
            _connection.request(
                "POST",
                _PATH,
                body=body.encode(),
                headers={"Content-Type": "application/json", "Idempotency-Key": key},
            )
            response = _connection.getresponse()
            response.read()
            return response.status
        except (http.client.HTTPException, OSError):
            # A keep-alive connection the server closed: open a new one, once.
            _connection.close()
            _connection = None
            if attempt == 2:
                raise
    raise DownstreamError("unreachable")


def record_handler(record: SQSRecord) -> None:
    status = _post(record.body, record.message_id)
    if not 200 <= status < 300:
        raise DownstreamError(f"downstream answered {status}")


_processor = BatchProcessor(event_type=EventType.SQS)


def handler_sync(event, context):
    return process_partial_response(
        event=event, record_handler=record_handler, processor=_processor, context=context
    )


# --- AsyncBatchProcessor: every record of the batch at once over one aiohttp session --------

_session = None


async def _session_for_loop():
    global _session
    if _session is None:
        import aiohttp  # imported by the async handler only

        _session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=_TIMEOUT_S))
    return _session


async def async_record_handler(record: SQSRecord) -> None:
    session = await _session_for_loop()
    async with session.post(
        _URL.geturl(),
        data=record.body.encode(),
        headers={"Content-Type": "application/json", "Idempotency-Key": record.message_id},
    ) as response:
        await response.read()
        if not 200 <= response.status < 300:
            raise DownstreamError(f"downstream answered {response.status}")


_async_processor = AsyncBatchProcessor(event_type=EventType.SQS)


def handler_async(event, context):
    # With LAMBDA_TASK_ROOT set, as in Lambda, Powertools runs every invocation on the one
    # event loop of the sandbox, so the session and its connections are reused.
    return async_process_partial_response(
        event=event, record_handler=async_record_handler, processor=_async_processor, context=context
    )


# --- BatchProcessor with Powertools' idempotency on DynamoDB ----------------------------------

_idempotent_handler = None


def _idempotent_record_handler():
    """The record handler wrapped by `idempotent_function`, built on first use: the table comes
    from IDEMPOTENCY_TABLE, and boto3 reads its endpoint from the environment."""
    global _idempotent_handler
    if _idempotent_handler is None:
        from aws_lambda_powertools.utilities.idempotency import (
            DynamoDBPersistenceLayer,
            IdempotencyConfig,
            idempotent_function,
        )

        persistence = DynamoDBPersistenceLayer(table_name=os.environ["IDEMPOTENCY_TABLE"])
        config = IdempotencyConfig(event_key_jmespath="messageId")

        @idempotent_function(
            data_keyword_argument="record", config=config, persistence_store=persistence
        )
        def handle(record: SQSRecord):
            record_handler(record)
            return {"status": "done"}

        _idempotent_handler = (handle, config)
    return _idempotent_handler


def handler_idempotent(event, context):
    handle, config = _idempotent_record_handler()
    config.register_lambda_context(context)
    return process_partial_response(
        event=event,
        record_handler=lambda record: handle(record=record),
        processor=_processor,
        context=context,
    )
