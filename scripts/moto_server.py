"""moto's server, with DynamoDB requests applied one at a time.

Real DynamoDB applies a conditional write atomically: of two concurrent `UpdateItem`s
whose condition is `status = dead`, exactly one succeeds. moto's threaded server checks the
condition and applies the update in Python without a lock, so on a busy machine a thread
switch between the two steps lets both writes succeed (seen here: 7 of 150 races of eight
writers had more than one winner under CPU load, 0 of 150 once serialised). The redrive
leases and the failure-history upserts depend on that atomicity, so the emulator must
provide it. Serialising DynamoDB costs nothing measurable: moto's request handling is
bound by the interpreter lock anyway. Other services (SQS long polls) stay concurrent.

Usage is moto_server's: `python scripts/moto_server.py -H 127.0.0.1 -p PORT`.
"""

import threading

import moto.server as server


class SerialDynamoDB(server.DomainDispatcherApplication):
    """Dispatches as moto does; DynamoDB requests (JSON protocol, `X-Amz-Target:
    DynamoDB_20120810.<Action>`) run under one lock, response body included."""

    _dynamodb = threading.Lock()

    def __call__(self, environ, start_response):
        if not environ.get("HTTP_X_AMZ_TARGET", "").startswith("DynamoDB_"):
            return super().__call__(environ, start_response)
        with self._dynamodb:
            return [b"".join(super().__call__(environ, start_response))]


server.DomainDispatcherApplication = SerialDynamoDB

if __name__ == "__main__":
    server.main()
