"""The options of the ``dledger`` source and sink, checked once on the driver (docs/spark.md, "Options").

Spark hands a data source its options case-insensitively; every name is matched here in lower case and an unknown
one, or a value that does not parse, is an ``OptionError`` naming the option, raised while Spark plans the query
(before a task runs, so a write with a bad option writes nothing).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from dledger.security.config import ClientSecurity

EARLIEST: Final = -2  # Kafka's numbers for "earliest" and "latest" in a per-queue offsets JSON
LATEST: Final = -1

COMMON: Final = (
    "addresses",
    "nameservers",
    "groupName",
    "topic",
    "caFile",
    "accessKey",
    "secretKey",
    "securityFile",
    "timeoutMs",
    "retryMs",
)
READ: Final = (
    *COMMON,
    "startingOffsets",
    "endingOffsets",
    "startingTimestamp",
    "endingTimestamp",
    "maxOffsetsPerTrigger",
    "failOnDataLoss",
    "pullBatch",
)
WRITE: Final = (*COMMON, "batchSize")
# Options Spark itself may pass along to a source or sink; accepted and ignored.
SPARK_OWN: Final = ("path", "checkpointLocation", "queryName")
MAX_PULL: Final = 1024  # the broker's MAX_PULL_MESSAGES
MAX_SEND: Final = 1024  # and its MAX_SEND_BATCH


class OptionError(ValueError):
    """A bad option of the dledger source or sink; the message names it."""


@dataclass(frozen=True, slots=True)
class Connect:
    """Where the topics are and how to reach them: one group (``addresses``) or a cluster (``nameservers``)."""

    addresses: tuple[str, ...]
    nameservers: tuple[str, ...]
    group_name: str
    security: ClientSecurity | None
    timeout_s: float
    retry_s: float

    def where(self) -> str:
        if self.nameservers:
            return "nameservers " + ",".join(self.nameservers)
        return "addresses " + ",".join(self.addresses)


@dataclass(frozen=True, slots=True)
class Bound:
    """A starting or ending point: ``earliest``, ``latest``, per-queue offsets, or a store timestamp (ms)."""

    kind: str  # "earliest" | "latest" | "offsets" | "timestamp"
    # per-queue: topic -> queue key ("3" or "group/3") -> offset (EARLIEST, LATEST or >= 0)
    offsets: Mapping[str, Mapping[str, int]] | None = None
    timestamp_ms: int = 0
    option: str = ""


@dataclass(frozen=True, slots=True)
class ReadOptions:
    connect: Connect
    topics: tuple[str, ...]
    starting: Bound
    ending: Bound
    max_per_trigger: int | None
    fail_on_data_loss: bool
    pull_batch: int


@dataclass(frozen=True, slots=True)
class WriteOptions:
    connect: Connect
    topic: str | None
    batch_size: int


def _lower(options: Mapping[str, str], allowed: tuple[str, ...]) -> dict[str, str]:
    known = {name.lower(): name for name in (*allowed, *SPARK_OWN)}
    out: dict[str, str] = {}
    for key, value in options.items():
        name = known.get(key.lower())
        if name is None:
            raise OptionError(
                f"unknown option {key!r} of the dledger data source (known: {', '.join(sorted(allowed))})"
            )
        out[name] = str(value)
    return out


def _list(opts: Mapping[str, str], name: str) -> tuple[str, ...]:
    raw = opts.get(name, "")
    items = tuple(p.strip() for p in raw.replace(";", ",").split(",") if p.strip())
    for item in items:
        host, sep, port = item.rpartition(":")
        if not sep or not host or not port.isdigit():
            raise OptionError(f"option {name}: {item!r} is not host:port")
    return items


def _int(opts: Mapping[str, str], name: str, default: int, low: int, high: int | None = None) -> int:
    raw = opts.get(name)
    if raw is None:
        return default
    try:
        value = int(raw)
    except ValueError:
        raise OptionError(f"option {name}: {raw!r} is not an integer") from None
    if value < low or (high is not None and value > high):
        bound = f"{low}..{high}" if high is not None else f">= {low}"
        raise OptionError(f"option {name}: {value} is out of range ({bound})")
    return value


def _bool(opts: Mapping[str, str], name: str, default: bool) -> bool:
    raw = opts.get(name)
    if raw is None:
        return default
    if raw.strip().lower() in ("true", "1", "yes"):
        return True
    if raw.strip().lower() in ("false", "0", "no"):
        return False
    raise OptionError(f"option {name}: {raw!r} is not true or false")


def _security(opts: Mapping[str, str]) -> ClientSecurity | None:
    if "securityFile" in opts:
        if any(k in opts for k in ("caFile", "accessKey", "secretKey")):
            raise OptionError("option securityFile: give it or caFile/accessKey/secretKey, not both")
        try:
            return ClientSecurity.from_file(Path(opts["securityFile"]))
        except Exception as e:
            raise OptionError(f"option securityFile: {e}") from None
    if "caFile" in opts:
        ca = Path(opts["caFile"])
        if not ca.is_file():
            raise OptionError(f"option caFile: {ca} is not a readable file")
        if ("accessKey" in opts) != ("secretKey" in opts):
            raise OptionError("option accessKey: accessKey and secretKey go together")
        return ClientSecurity(ca, opts.get("accessKey", ""), opts.get("secretKey", ""))
    if "accessKey" in opts or "secretKey" in opts:
        raise OptionError("option accessKey: a secure group needs caFile (or securityFile) too")
    return ClientSecurity.from_env()


def connect(opts: Mapping[str, str]) -> Connect:
    addresses, nameservers = _list(opts, "addresses"), _list(opts, "nameservers")
    if bool(addresses) == bool(nameservers):
        raise OptionError(
            "option addresses: give exactly one of addresses (a group's nodes) and nameservers (a cluster)"
        )
    if nameservers and "groupName" in opts:
        raise OptionError("option groupName: only with addresses (a cluster's groups have their own names)")
    timeout_ms = _int(opts, "timeoutMs", 10_000, 1)
    retry_ms = _int(opts, "retryMs", 30_000, 0)
    return Connect(
        addresses,
        nameservers,
        opts.get("groupName", "default"),
        _security(opts),
        timeout_ms / 1000,
        retry_ms / 1000,
    )


def _offsets_json(name: str, raw: str) -> dict[str, dict[str, int]]:
    try:
        doc = json.loads(raw)
    except ValueError as e:
        raise OptionError(f"option {name}: not earliest, latest or per-queue JSON: {e}") from None
    if not isinstance(doc, dict) or not doc:
        raise OptionError(f'option {name}: per-queue offsets are {{"topic": {{"queue": offset}}}}')
    out: dict[str, dict[str, int]] = {}
    for topic, queues in doc.items():
        if not isinstance(queues, dict):
            raise OptionError(f"option {name}: topic {topic!r} needs an object of queue -> offset")
        out[topic] = {}
        for key, value in queues.items():
            group, _, qid = str(key).rpartition("/")
            if not qid.isdigit() or (group == "" and "/" in str(key)):
                raise OptionError(
                    f"option {name}: queue {key!r} of {topic!r} is not <queue> or <group>/<queue>"
                )
            if not isinstance(value, int) or isinstance(value, bool) or value < EARLIEST:
                raise OptionError(
                    f"option {name}: offset of {topic}/{key} must be -2, -1 or >= 0, not {value!r}"
                )
            out[topic][str(key)] = value
    return out


def _bound(opts: Mapping[str, str], name: str, ts_name: str, default: str) -> Bound:
    if name in opts and ts_name in opts:
        raise OptionError(f"option {ts_name}: give {name} or {ts_name}, not both")
    if ts_name in opts:
        return Bound("timestamp", timestamp_ms=_int(opts, ts_name, 0, 0), option=ts_name)
    raw = opts.get(name, default).strip()
    if raw.lower() in ("earliest", "latest"):
        return Bound(raw.lower(), option=name)
    return Bound("offsets", offsets=_offsets_json(name, raw), option=name)


def _topics(opts: Mapping[str, str], required: bool) -> tuple[str, ...]:
    topics = tuple(t.strip() for t in opts.get("topic", "").split(",") if t.strip())
    if required and not topics:
        raise OptionError("option topic: the topic (or comma-separated topics) to read is required")
    return topics


def read_options(options: Mapping[str, str], streaming: bool) -> ReadOptions:
    opts = _lower(options, READ)
    where = connect(opts)
    topics = _topics(opts, required=True)
    starting = _bound(opts, "startingOffsets", "startingTimestamp", "latest" if streaming else "earliest")
    if streaming and ("endingOffsets" in opts or "endingTimestamp" in opts):
        raise OptionError("option endingOffsets: a stream has no end (endingOffsets is for batch reads)")
    ending = _bound(opts, "endingOffsets", "endingTimestamp", "latest")
    if ending.kind == "earliest":
        raise OptionError("option endingOffsets: earliest is no end")
    for bound in (starting, ending):
        for topic in (bound.offsets or {}).keys() - set(topics):
            raise OptionError(f"option {bound.option}: topic {topic!r} is not among the topics read")
    max_per = _int(opts, "maxOffsetsPerTrigger", 0, 1) if "maxOffsetsPerTrigger" in opts else None
    if max_per is not None and not streaming:
        raise OptionError("option maxOffsetsPerTrigger: only for streaming reads")
    return ReadOptions(
        where,
        topics,
        starting,
        ending,
        max_per,
        _bool(opts, "failOnDataLoss", True),
        _int(opts, "pullBatch", MAX_PULL, 1, MAX_PULL),
    )


def write_options(options: Mapping[str, str]) -> WriteOptions:
    opts = _lower(options, WRITE)
    topics = _topics(opts, required=False)
    if len(topics) > 1:
        raise OptionError("option topic: a sink writes to one topic (or to each row's topic column)")
    return WriteOptions(
        connect(opts), topics[0] if topics else None, _int(opts, "batchSize", 256, 1, MAX_SEND)
    )
