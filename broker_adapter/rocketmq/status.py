"""Errors in RocketMQ 5's terms: every answer of the MessagingService carries a ``Status`` (a protocol ``Code``
and a message), and clients act on the code (the official clients raise BadRequest / NotFound / Unsupported /
InternalError / TooManyRequests exceptions from it; a producer retries on anything but TOO_MANY_REQUESTS).

``RocketMQError`` is raised inside the servicer and turned into the response's status. Our own errors
(``dledger.errors``) map onto the codes a RocketMQ client expects for the same situation.
"""

from __future__ import annotations

from rocketmq.grpc_protocol import Code, definition_pb2

from broker_adapter.core.delivery import IllegalDeliveryTimeError, TransactionError
from broker_adapter.core.model import (
    InvalidGroupError,
    InvalidTopicError,
    OffsetRangeError,
    UnknownGroupError,
    UnknownQueueError,
    UnknownTopicError,
)
from dledger.errors import (
    BackpressureError,
    DLedgerError,
    InvalidRequestError,
    NotFoundError,
    NotLeaderError,
    OutcomeUnknownError,
    UnavailableError,
)


class RocketMQError(Exception):
    """A request answered with a non-OK protocol status."""

    def __init__(self, code: int, message: str):
        super().__init__(message)
        self.code = code
        self.message = message

    def __str__(self) -> str:
        return f"{Code.Name(self.code)}: {self.message}"


def unsupported(what: str) -> RocketMQError:
    return RocketMQError(
        Code.UNSUPPORTED,
        f"{what}: not supported by dledger-py's broker (docs/rocketmq.md, Protocol conformance)",
    )


def bad_request(message: str, code: int = Code.BAD_REQUEST) -> RocketMQError:
    return RocketMQError(code, message)


def from_dledger(err: DLedgerError) -> RocketMQError:
    """The protocol status for one of our errors. No leader / leadership lost: HA_NOT_AVAILABLE (retried by
    producers); an outcome unknown at a deadline: PROXY_TIMEOUT; too many pending appends: TOO_MANY_REQUESTS
    (RocketMQ's flow control: a producer backs off instead of retrying at once). The broker's narrower errors
    get the codes RocketMQ gives those cases (an unknown queue is a bad request, not a missing topic)."""
    code = _BROKER_CODES.get(type(err))
    if code is not None:
        return RocketMQError(code, str(err))
    if isinstance(err, BackpressureError):
        code = Code.TOO_MANY_REQUESTS
    elif isinstance(err, OutcomeUnknownError):
        code = Code.PROXY_TIMEOUT
    elif isinstance(err, NotLeaderError | UnavailableError):
        code = Code.HA_NOT_AVAILABLE
    elif isinstance(err, InvalidRequestError):
        code = Code.BAD_REQUEST
    elif isinstance(err, NotFoundError):
        code = Code.NOT_FOUND
    else:
        code = Code.INTERNAL_ERROR
    return RocketMQError(code, str(err))


_BROKER_CODES = {
    IllegalDeliveryTimeError: Code.ILLEGAL_DELIVERY_TIME,
    TransactionError: Code.INVALID_TRANSACTION_ID,
    InvalidTopicError: Code.ILLEGAL_TOPIC,
    InvalidGroupError: Code.ILLEGAL_CONSUMER_GROUP,
    UnknownTopicError: Code.TOPIC_NOT_FOUND,
    UnknownQueueError: Code.BAD_REQUEST,
    UnknownGroupError: Code.OFFSET_NOT_FOUND,
    OffsetRangeError: Code.ILLEGAL_OFFSET,
}


def status(code: int = Code.OK, message: str = "OK") -> definition_pb2.Status:
    return definition_pb2.Status(code=code, message=message)


def of(err: RocketMQError) -> definition_pb2.Status:
    return definition_pb2.Status(code=err.code, message=err.message)
