"""Client authentication: RocketMQ 5's request signature, used by both client faces (ours and RocketMQ's).

Every call carries two headers (what the official RocketMQ 5 clients send)::

    x-mq-date-time: 20261124T203000Z                   (yyyyMMdd'T'HHmmss'Z')
    authorization:  MQv2-HMAC-SHA1 Credential=<AK>, SignedHeaders=x-mq-date-time, Signature=<hex>

where ``<hex>`` is HMAC-SHA1(secret key, the date-time string), in either hex case. The access key is the
Credential up to its first '/' (RocketMQ's form ``AK/region/...``). Unlike RocketMQ, a date-time more than
``skew_s`` (default 15 minutes) away from the server's clock is refused, so a captured header cannot be replayed
forever (docs/security.md, "Clients").

The reasons a check fails are for the server's log and the client's error; neither ever contains a secret.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import hmac
from collections.abc import Callable, Iterable

import grpc

AUTHORIZATION = "authorization"
DATE_TIME = "x-mq-date-time"
ALGORITHM = "MQv2-HMAC-SHA1"
DATE_FORMAT = "%Y%m%dT%H%M%SZ"
DEFAULT_SKEW_S = 15 * 60


class AuthenticationError(Exception):
    """Missing or bad credentials: the message says which (never the secret)."""


class UnknownCredentials(AuthenticationError):
    """An unknown access key, or a signature that does not match the key's secret: the one refusal a user change
    not yet applied on this node could turn into an acceptance (``guard`` catches up before answering it)."""


def date_time(now: dt.datetime | None = None) -> str:
    return (now or dt.datetime.now(dt.UTC)).strftime(DATE_FORMAT)


def signature(secret_key: str, when: str) -> str:
    return hmac.new(secret_key.encode(), when.encode(), hashlib.sha1).hexdigest()


def headers(access_key: str, secret_key: str, now: dt.datetime | None = None) -> tuple[tuple[str, str], ...]:
    """The two headers that authenticate one call as ``access_key``."""
    when = date_time(now)
    auth = f"{ALGORITHM} Credential={access_key}, SignedHeaders={DATE_TIME}, Signature={signature(secret_key, when)}"
    return ((DATE_TIME, when), (AUTHORIZATION, auth))


def parse_authorization(value: str) -> tuple[str, str]:
    """(access key, signature) from an ``authorization`` header; AuthenticationError if it is not one."""
    algorithm, _, rest = value.strip().partition(" ")
    if algorithm != ALGORITHM:
        raise AuthenticationError(f"authorization scheme {algorithm[:32]!r} is not {ALGORITHM}")
    fields: dict[str, str] = {}
    for part in rest.split(","):
        k, sep, v = part.strip().partition("=")
        if sep:
            fields[k.strip()] = v.strip()
    credential, signed = fields.get("Credential", ""), fields.get("Signature", "")
    if not credential or not signed:
        raise AuthenticationError("authorization header lacks Credential= or Signature=")
    signed_headers = fields.get("SignedHeaders", DATE_TIME)
    if DATE_TIME not in [h.strip().lower() for h in signed_headers.split(";")]:
        raise AuthenticationError(f"SignedHeaders must include {DATE_TIME}")
    return credential.split("/", 1)[0], signed


def verify(
    metadata: Iterable[tuple[str, str | bytes]],
    secret_of: Callable[[str], str | None],
    *,
    skew_s: int = DEFAULT_SKEW_S,
    now: dt.datetime | None = None,
) -> str:
    """The access key a call's metadata authenticates; AuthenticationError saying why not."""
    md = {k.lower(): v for k, v in metadata if isinstance(v, str)}
    value, when = md.get(AUTHORIZATION), md.get(DATE_TIME)
    if not value:
        raise AuthenticationError("no authorization header: give an access key and secret key")
    if not when:
        raise AuthenticationError(f"no {DATE_TIME} header")
    access_key, signed = parse_authorization(value)
    try:
        stamp = dt.datetime.strptime(when, DATE_FORMAT).replace(tzinfo=dt.UTC)
    except ValueError:
        raise AuthenticationError(f"{DATE_TIME} {when[:32]!r} is not yyyyMMddTHHmmssZ") from None
    off = abs(((now or dt.datetime.now(dt.UTC)) - stamp).total_seconds())
    if off > skew_s:
        raise AuthenticationError(
            f"{DATE_TIME} {when} is {off:.0f} s from the server's clock (allowed: {skew_s} s); "
            "check the client's clock"
        )
    secret = secret_of(access_key)
    if secret is None:
        raise UnknownCredentials(f"unknown access key {access_key!r}")
    if not hmac.compare_digest(signature(secret, when), signed.lower()):
        raise UnknownCredentials(f"bad signature for access key {access_key!r} (wrong secret key?)")
    return access_key


class SignaturePlugin(grpc.AuthMetadataPlugin):
    """Call credentials that sign every call (used by our clients, the CLI and follower forwarding)."""

    def __init__(self, access_key: str, secret_key: str):
        self._ak = access_key
        self._sk = secret_key

    def __call__(self, context: grpc.AuthMetadataContext, callback: grpc.AuthMetadataPluginCallback) -> None:
        callback(headers(self._ak, self._sk), None)

    def __repr__(self) -> str:  # never the secret
        return f"SignaturePlugin({self._ak!r})"
