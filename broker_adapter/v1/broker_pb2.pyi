from dledger.v1 import client_pb2 as _client_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class OutgoingMessage(_message.Message):
    __slots__ = ("queue_id", "body", "tags", "keys", "msg_id", "producer_id", "sequence", "properties", "born_timestamp", "delivery_timestamp")
    class PropertiesEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    QUEUE_ID_FIELD_NUMBER: _ClassVar[int]
    BODY_FIELD_NUMBER: _ClassVar[int]
    TAGS_FIELD_NUMBER: _ClassVar[int]
    KEYS_FIELD_NUMBER: _ClassVar[int]
    MSG_ID_FIELD_NUMBER: _ClassVar[int]
    PRODUCER_ID_FIELD_NUMBER: _ClassVar[int]
    SEQUENCE_FIELD_NUMBER: _ClassVar[int]
    PROPERTIES_FIELD_NUMBER: _ClassVar[int]
    BORN_TIMESTAMP_FIELD_NUMBER: _ClassVar[int]
    DELIVERY_TIMESTAMP_FIELD_NUMBER: _ClassVar[int]
    queue_id: int
    body: bytes
    tags: str
    keys: _containers.RepeatedScalarFieldContainer[str]
    msg_id: str
    producer_id: str
    sequence: int
    properties: _containers.ScalarMap[str, str]
    born_timestamp: int
    delivery_timestamp: int
    def __init__(self, queue_id: _Optional[int] = ..., body: _Optional[bytes] = ..., tags: _Optional[str] = ..., keys: _Optional[_Iterable[str]] = ..., msg_id: _Optional[str] = ..., producer_id: _Optional[str] = ..., sequence: _Optional[int] = ..., properties: _Optional[_Mapping[str, str]] = ..., born_timestamp: _Optional[int] = ..., delivery_timestamp: _Optional[int] = ...) -> None: ...

class SendRequest(_message.Message):
    __slots__ = ("topic", "messages")
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    MESSAGES_FIELD_NUMBER: _ClassVar[int]
    topic: str
    messages: _containers.RepeatedCompositeFieldContainer[OutgoingMessage]
    def __init__(self, topic: _Optional[str] = ..., messages: _Optional[_Iterable[_Union[OutgoingMessage, _Mapping]]] = ...) -> None: ...

class SendResult(_message.Message):
    __slots__ = ("msg_id", "topic", "queue_id", "queue_offset", "commitlog_offset", "duplicate")
    MSG_ID_FIELD_NUMBER: _ClassVar[int]
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    QUEUE_ID_FIELD_NUMBER: _ClassVar[int]
    QUEUE_OFFSET_FIELD_NUMBER: _ClassVar[int]
    COMMITLOG_OFFSET_FIELD_NUMBER: _ClassVar[int]
    DUPLICATE_FIELD_NUMBER: _ClassVar[int]
    msg_id: str
    topic: str
    queue_id: int
    queue_offset: int
    commitlog_offset: int
    duplicate: bool
    def __init__(self, msg_id: _Optional[str] = ..., topic: _Optional[str] = ..., queue_id: _Optional[int] = ..., queue_offset: _Optional[int] = ..., commitlog_offset: _Optional[int] = ..., duplicate: _Optional[bool] = ...) -> None: ...

class SendResponse(_message.Message):
    __slots__ = ("results",)
    RESULTS_FIELD_NUMBER: _ClassVar[int]
    results: _containers.RepeatedCompositeFieldContainer[SendResult]
    def __init__(self, results: _Optional[_Iterable[_Union[SendResult, _Mapping]]] = ...) -> None: ...

class SendBatch(_message.Message):
    __slots__ = ("batch_id", "messages")
    BATCH_ID_FIELD_NUMBER: _ClassVar[int]
    MESSAGES_FIELD_NUMBER: _ClassVar[int]
    batch_id: int
    messages: _containers.RepeatedScalarFieldContainer[bytes]
    def __init__(self, batch_id: _Optional[int] = ..., messages: _Optional[_Iterable[bytes]] = ...) -> None: ...

class SendBatchResult(_message.Message):
    __slots__ = ("batch_id", "queue_offsets", "commitlog_offsets", "duplicates", "error")
    BATCH_ID_FIELD_NUMBER: _ClassVar[int]
    QUEUE_OFFSETS_FIELD_NUMBER: _ClassVar[int]
    COMMITLOG_OFFSETS_FIELD_NUMBER: _ClassVar[int]
    DUPLICATES_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    batch_id: int
    queue_offsets: _containers.RepeatedScalarFieldContainer[int]
    commitlog_offsets: _containers.RepeatedScalarFieldContainer[int]
    duplicates: _containers.RepeatedScalarFieldContainer[bool]
    error: _client_pb2.AppendError
    def __init__(self, batch_id: _Optional[int] = ..., queue_offsets: _Optional[_Iterable[int]] = ..., commitlog_offsets: _Optional[_Iterable[int]] = ..., duplicates: _Optional[_Iterable[bool]] = ..., error: _Optional[_Union[_client_pb2.AppendError, _Mapping]] = ...) -> None: ...

class PullRequest(_message.Message):
    __slots__ = ("topic", "queue_id", "offset", "max_messages", "max_wait_ms", "allow_follower", "raw", "filter", "consumer_group", "client_id")
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    QUEUE_ID_FIELD_NUMBER: _ClassVar[int]
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    MAX_MESSAGES_FIELD_NUMBER: _ClassVar[int]
    MAX_WAIT_MS_FIELD_NUMBER: _ClassVar[int]
    ALLOW_FOLLOWER_FIELD_NUMBER: _ClassVar[int]
    RAW_FIELD_NUMBER: _ClassVar[int]
    FILTER_FIELD_NUMBER: _ClassVar[int]
    CONSUMER_GROUP_FIELD_NUMBER: _ClassVar[int]
    CLIENT_ID_FIELD_NUMBER: _ClassVar[int]
    topic: str
    queue_id: int
    offset: int
    max_messages: int
    max_wait_ms: int
    allow_follower: bool
    raw: bool
    filter: str
    consumer_group: str
    client_id: str
    def __init__(self, topic: _Optional[str] = ..., queue_id: _Optional[int] = ..., offset: _Optional[int] = ..., max_messages: _Optional[int] = ..., max_wait_ms: _Optional[int] = ..., allow_follower: _Optional[bool] = ..., raw: _Optional[bool] = ..., filter: _Optional[str] = ..., consumer_group: _Optional[str] = ..., client_id: _Optional[str] = ...) -> None: ...

class StoredMessage(_message.Message):
    __slots__ = ("topic", "queue_id", "queue_offset", "commitlog_offset", "body", "tags", "keys", "msg_id", "properties", "born_timestamp", "store_timestamp")
    class PropertiesEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    QUEUE_ID_FIELD_NUMBER: _ClassVar[int]
    QUEUE_OFFSET_FIELD_NUMBER: _ClassVar[int]
    COMMITLOG_OFFSET_FIELD_NUMBER: _ClassVar[int]
    BODY_FIELD_NUMBER: _ClassVar[int]
    TAGS_FIELD_NUMBER: _ClassVar[int]
    KEYS_FIELD_NUMBER: _ClassVar[int]
    MSG_ID_FIELD_NUMBER: _ClassVar[int]
    PROPERTIES_FIELD_NUMBER: _ClassVar[int]
    BORN_TIMESTAMP_FIELD_NUMBER: _ClassVar[int]
    STORE_TIMESTAMP_FIELD_NUMBER: _ClassVar[int]
    topic: str
    queue_id: int
    queue_offset: int
    commitlog_offset: int
    body: bytes
    tags: str
    keys: _containers.RepeatedScalarFieldContainer[str]
    msg_id: str
    properties: _containers.ScalarMap[str, str]
    born_timestamp: int
    store_timestamp: int
    def __init__(self, topic: _Optional[str] = ..., queue_id: _Optional[int] = ..., queue_offset: _Optional[int] = ..., commitlog_offset: _Optional[int] = ..., body: _Optional[bytes] = ..., tags: _Optional[str] = ..., keys: _Optional[_Iterable[str]] = ..., msg_id: _Optional[str] = ..., properties: _Optional[_Mapping[str, str]] = ..., born_timestamp: _Optional[int] = ..., store_timestamp: _Optional[int] = ...) -> None: ...

class PullResponse(_message.Message):
    __slots__ = ("messages", "next_offset", "max_offset", "raw", "raw_count")
    MESSAGES_FIELD_NUMBER: _ClassVar[int]
    NEXT_OFFSET_FIELD_NUMBER: _ClassVar[int]
    MAX_OFFSET_FIELD_NUMBER: _ClassVar[int]
    RAW_FIELD_NUMBER: _ClassVar[int]
    RAW_COUNT_FIELD_NUMBER: _ClassVar[int]
    messages: _containers.RepeatedCompositeFieldContainer[StoredMessage]
    next_offset: int
    max_offset: int
    raw: bytes
    raw_count: int
    def __init__(self, messages: _Optional[_Iterable[_Union[StoredMessage, _Mapping]]] = ..., next_offset: _Optional[int] = ..., max_offset: _Optional[int] = ..., raw: _Optional[bytes] = ..., raw_count: _Optional[int] = ...) -> None: ...

class CreateTopicRequest(_message.Message):
    __slots__ = ("topic", "queues")
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    QUEUES_FIELD_NUMBER: _ClassVar[int]
    topic: str
    queues: int
    def __init__(self, topic: _Optional[str] = ..., queues: _Optional[int] = ...) -> None: ...

class CreateTopicResponse(_message.Message):
    __slots__ = ("topic", "queues")
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    QUEUES_FIELD_NUMBER: _ClassVar[int]
    topic: str
    queues: int
    def __init__(self, topic: _Optional[str] = ..., queues: _Optional[int] = ...) -> None: ...

class ListTopicsRequest(_message.Message):
    __slots__ = ("allow_follower",)
    ALLOW_FOLLOWER_FIELD_NUMBER: _ClassVar[int]
    allow_follower: bool
    def __init__(self, allow_follower: _Optional[bool] = ...) -> None: ...

class TopicInfo(_message.Message):
    __slots__ = ("topic", "queues", "max_offsets")
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    QUEUES_FIELD_NUMBER: _ClassVar[int]
    MAX_OFFSETS_FIELD_NUMBER: _ClassVar[int]
    topic: str
    queues: int
    max_offsets: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, topic: _Optional[str] = ..., queues: _Optional[int] = ..., max_offsets: _Optional[_Iterable[int]] = ...) -> None: ...

class ListTopicsResponse(_message.Message):
    __slots__ = ("topics",)
    TOPICS_FIELD_NUMBER: _ClassVar[int]
    topics: _containers.RepeatedCompositeFieldContainer[TopicInfo]
    def __init__(self, topics: _Optional[_Iterable[_Union[TopicInfo, _Mapping]]] = ...) -> None: ...

class CommitOffsetRequest(_message.Message):
    __slots__ = ("group", "topic", "queue_id", "offset")
    GROUP_FIELD_NUMBER: _ClassVar[int]
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    QUEUE_ID_FIELD_NUMBER: _ClassVar[int]
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    group: str
    topic: str
    queue_id: int
    offset: int
    def __init__(self, group: _Optional[str] = ..., topic: _Optional[str] = ..., queue_id: _Optional[int] = ..., offset: _Optional[int] = ...) -> None: ...

class CommitOffsetResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class QueryOffsetRequest(_message.Message):
    __slots__ = ("group", "topic", "queue_id", "allow_follower")
    GROUP_FIELD_NUMBER: _ClassVar[int]
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    QUEUE_ID_FIELD_NUMBER: _ClassVar[int]
    ALLOW_FOLLOWER_FIELD_NUMBER: _ClassVar[int]
    group: str
    topic: str
    queue_id: int
    allow_follower: bool
    def __init__(self, group: _Optional[str] = ..., topic: _Optional[str] = ..., queue_id: _Optional[int] = ..., allow_follower: _Optional[bool] = ...) -> None: ...

class QueryOffsetResponse(_message.Message):
    __slots__ = ("offset", "found")
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    FOUND_FIELD_NUMBER: _ClassVar[int]
    offset: int
    found: bool
    def __init__(self, offset: _Optional[int] = ..., found: _Optional[bool] = ...) -> None: ...

class GroupSettingsRequest(_message.Message):
    __slots__ = ("group", "fifo", "max_attempts", "backoff", "levels_ms", "initial_ms", "max_ms", "multiplier")
    GROUP_FIELD_NUMBER: _ClassVar[int]
    FIFO_FIELD_NUMBER: _ClassVar[int]
    MAX_ATTEMPTS_FIELD_NUMBER: _ClassVar[int]
    BACKOFF_FIELD_NUMBER: _ClassVar[int]
    LEVELS_MS_FIELD_NUMBER: _ClassVar[int]
    INITIAL_MS_FIELD_NUMBER: _ClassVar[int]
    MAX_MS_FIELD_NUMBER: _ClassVar[int]
    MULTIPLIER_FIELD_NUMBER: _ClassVar[int]
    group: str
    fifo: bool
    max_attempts: int
    backoff: str
    levels_ms: _containers.RepeatedScalarFieldContainer[int]
    initial_ms: int
    max_ms: int
    multiplier: float
    def __init__(self, group: _Optional[str] = ..., fifo: _Optional[bool] = ..., max_attempts: _Optional[int] = ..., backoff: _Optional[str] = ..., levels_ms: _Optional[_Iterable[int]] = ..., initial_ms: _Optional[int] = ..., max_ms: _Optional[int] = ..., multiplier: _Optional[float] = ...) -> None: ...

class GroupSettingsResponse(_message.Message):
    __slots__ = ("settings_json",)
    SETTINGS_JSON_FIELD_NUMBER: _ClassVar[int]
    settings_json: str
    def __init__(self, settings_json: _Optional[str] = ...) -> None: ...

class LaterRequest(_message.Message):
    __slots__ = ("group", "topic", "queue_id", "queue_offset")
    GROUP_FIELD_NUMBER: _ClassVar[int]
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    QUEUE_ID_FIELD_NUMBER: _ClassVar[int]
    QUEUE_OFFSET_FIELD_NUMBER: _ClassVar[int]
    group: str
    topic: str
    queue_id: int
    queue_offset: int
    def __init__(self, group: _Optional[str] = ..., topic: _Optional[str] = ..., queue_id: _Optional[int] = ..., queue_offset: _Optional[int] = ...) -> None: ...

class LaterResponse(_message.Message):
    __slots__ = ("dead_lettered", "deliver_at_ms", "attempt")
    DEAD_LETTERED_FIELD_NUMBER: _ClassVar[int]
    DELIVER_AT_MS_FIELD_NUMBER: _ClassVar[int]
    ATTEMPT_FIELD_NUMBER: _ClassVar[int]
    dead_lettered: bool
    deliver_at_ms: int
    attempt: int
    def __init__(self, dead_lettered: _Optional[bool] = ..., deliver_at_ms: _Optional[int] = ..., attempt: _Optional[int] = ...) -> None: ...

class RouteRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class RouteResponse(_message.Message):
    __slots__ = ("node_id", "leader_id", "leader_address", "term", "max_commitlog_offset")
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    LEADER_ID_FIELD_NUMBER: _ClassVar[int]
    LEADER_ADDRESS_FIELD_NUMBER: _ClassVar[int]
    TERM_FIELD_NUMBER: _ClassVar[int]
    MAX_COMMITLOG_OFFSET_FIELD_NUMBER: _ClassVar[int]
    node_id: str
    leader_id: str
    leader_address: str
    term: int
    max_commitlog_offset: int
    def __init__(self, node_id: _Optional[str] = ..., leader_id: _Optional[str] = ..., leader_address: _Optional[str] = ..., term: _Optional[int] = ..., max_commitlog_offset: _Optional[int] = ...) -> None: ...
