"""Errors clients act on. Each has ``retriable`` (may a client try again?) and ``grpc_status`` (the name of the
``grpc.StatusCode`` the gRPC layer maps it to; kept as a string so the pure core imports no gRPC).

Several classes share a status code; the wire carries the class name too (``dledger.transport.convert``), so a
client rebuilds exactly the class a node raised. ``ERRORS`` lists every class that travels."""

from __future__ import annotations


class DLedgerError(Exception):
    retriable = False
    grpc_status = "INTERNAL"


class NotLeaderError(DLedgerError):
    """This node is not the leader; ``leader_hint`` is the leader's id or address when known."""

    retriable = True
    grpc_status = "FAILED_PRECONDITION"

    def __init__(self, leader_hint: str | None = None, message: str | None = None):
        self.leader_hint = leader_hint
        hint = f"; the leader is {leader_hint}" if leader_hint else "; no leader is known yet"
        super().__init__(message or f"not the leader{hint}")


class OutcomeUnknownError(DLedgerError):
    """Leadership was lost while the request waited: the entry may or may not commit. Retry only if the
    request is idempotent (or check with a read)."""

    retriable = True
    grpc_status = "UNAVAILABLE"


class UnavailableError(DLedgerError):
    """No quorum, shutting down, or a peer unreachable."""

    retriable = True
    grpc_status = "UNAVAILABLE"


class DirectoryInUseError(UnavailableError):
    """Another process holds a node directory's lock (``holder``: its pid as it recorded it). Not retriable:
    trying again changes nothing until that process exits."""

    retriable = False

    def __init__(self, message: str, holder: str):
        super().__init__(message)
        self.holder = holder


class BackpressureError(DLedgerError):
    """Too many appends are pending; try again shortly."""

    retriable = True
    grpc_status = "RESOURCE_EXHAUSTED"


class StorageFullError(DLedgerError):
    """This node's disk is full: it refuses writes (nothing was written) until a write succeeds again. Other
    nodes of the group may still accept them, so a client retries, on the leader of the moment."""

    retriable = True
    grpc_status = "RESOURCE_EXHAUSTED"


class EntryReplacedError(DLedgerError):
    """The proposed entry was overwritten by a newer leader's entry: it did not commit. Safe to retry."""

    retriable = True
    grpc_status = "ABORTED"


class InvalidRequestError(DLedgerError):
    grpc_status = "INVALID_ARGUMENT"


class NotFoundError(DLedgerError):
    grpc_status = "NOT_FOUND"


class PermissionDeniedError(DLedgerError):
    """The caller's user lacks a permission this needs (docs/security.md); the message names it."""

    grpc_status = "PERMISSION_DENIED"


class ConfigError(DLedgerError):
    """A setting is invalid; the message names it and the accepted range."""

    grpc_status = "INVALID_ARGUMENT"


# Every error that crosses the wire, by the name it travels under. A new subclass goes here, and the round-trip
# test in tests/runtime/test_convert.py checks it.
ERRORS: dict[str, type[DLedgerError]] = {
    c.__name__: c
    for c in (
        DLedgerError,
        NotLeaderError,
        OutcomeUnknownError,
        UnavailableError,
        DirectoryInUseError,
        BackpressureError,
        StorageFullError,
        EntryReplacedError,
        InvalidRequestError,
        NotFoundError,
        PermissionDeniedError,
        ConfigError,
    )
}
