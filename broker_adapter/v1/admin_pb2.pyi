from broker_adapter.v1 import broker_pb2 as _broker_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class TopicStatusRequest(_message.Message):
    __slots__ = ("topic", "allow_follower")
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    ALLOW_FOLLOWER_FIELD_NUMBER: _ClassVar[int]
    topic: str
    allow_follower: bool
    def __init__(self, topic: _Optional[str] = ..., allow_follower: _Optional[bool] = ...) -> None: ...

class QueueStatus(_message.Message):
    __slots__ = ("queue_id", "min_offset", "max_offset", "last_store_timestamp")
    QUEUE_ID_FIELD_NUMBER: _ClassVar[int]
    MIN_OFFSET_FIELD_NUMBER: _ClassVar[int]
    MAX_OFFSET_FIELD_NUMBER: _ClassVar[int]
    LAST_STORE_TIMESTAMP_FIELD_NUMBER: _ClassVar[int]
    queue_id: int
    min_offset: int
    max_offset: int
    last_store_timestamp: int
    def __init__(self, queue_id: _Optional[int] = ..., min_offset: _Optional[int] = ..., max_offset: _Optional[int] = ..., last_store_timestamp: _Optional[int] = ...) -> None: ...

class TopicStatusResponse(_message.Message):
    __slots__ = ("topic", "queues")
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    QUEUES_FIELD_NUMBER: _ClassVar[int]
    topic: str
    queues: _containers.RepeatedCompositeFieldContainer[QueueStatus]
    def __init__(self, topic: _Optional[str] = ..., queues: _Optional[_Iterable[_Union[QueueStatus, _Mapping]]] = ...) -> None: ...

class DeleteTopicRequest(_message.Message):
    __slots__ = ("topic",)
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    topic: str
    def __init__(self, topic: _Optional[str] = ...) -> None: ...

class DeleteTopicResponse(_message.Message):
    __slots__ = ("queues",)
    QUEUES_FIELD_NUMBER: _ClassVar[int]
    queues: int
    def __init__(self, queues: _Optional[int] = ...) -> None: ...

class ListGroupsRequest(_message.Message):
    __slots__ = ("allow_follower",)
    ALLOW_FOLLOWER_FIELD_NUMBER: _ClassVar[int]
    allow_follower: bool
    def __init__(self, allow_follower: _Optional[bool] = ...) -> None: ...

class GroupSummary(_message.Message):
    __slots__ = ("group", "topics", "lag", "has_settings")
    GROUP_FIELD_NUMBER: _ClassVar[int]
    TOPICS_FIELD_NUMBER: _ClassVar[int]
    LAG_FIELD_NUMBER: _ClassVar[int]
    HAS_SETTINGS_FIELD_NUMBER: _ClassVar[int]
    group: str
    topics: _containers.RepeatedScalarFieldContainer[str]
    lag: int
    has_settings: bool
    def __init__(self, group: _Optional[str] = ..., topics: _Optional[_Iterable[str]] = ..., lag: _Optional[int] = ..., has_settings: _Optional[bool] = ...) -> None: ...

class ListGroupsResponse(_message.Message):
    __slots__ = ("groups",)
    GROUPS_FIELD_NUMBER: _ClassVar[int]
    groups: _containers.RepeatedCompositeFieldContainer[GroupSummary]
    def __init__(self, groups: _Optional[_Iterable[_Union[GroupSummary, _Mapping]]] = ...) -> None: ...

class DescribeGroupRequest(_message.Message):
    __slots__ = ("group", "topic", "allow_follower")
    GROUP_FIELD_NUMBER: _ClassVar[int]
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    ALLOW_FOLLOWER_FIELD_NUMBER: _ClassVar[int]
    group: str
    topic: str
    allow_follower: bool
    def __init__(self, group: _Optional[str] = ..., topic: _Optional[str] = ..., allow_follower: _Optional[bool] = ...) -> None: ...

class GroupQueue(_message.Message):
    __slots__ = ("topic", "queue_id", "committed_offset", "has_committed", "max_offset", "lag", "in_flight")
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    QUEUE_ID_FIELD_NUMBER: _ClassVar[int]
    COMMITTED_OFFSET_FIELD_NUMBER: _ClassVar[int]
    HAS_COMMITTED_FIELD_NUMBER: _ClassVar[int]
    MAX_OFFSET_FIELD_NUMBER: _ClassVar[int]
    LAG_FIELD_NUMBER: _ClassVar[int]
    IN_FLIGHT_FIELD_NUMBER: _ClassVar[int]
    topic: str
    queue_id: int
    committed_offset: int
    has_committed: bool
    max_offset: int
    lag: int
    in_flight: int
    def __init__(self, topic: _Optional[str] = ..., queue_id: _Optional[int] = ..., committed_offset: _Optional[int] = ..., has_committed: _Optional[bool] = ..., max_offset: _Optional[int] = ..., lag: _Optional[int] = ..., in_flight: _Optional[int] = ...) -> None: ...

class DescribeGroupResponse(_message.Message):
    __slots__ = ("group", "queues", "members")
    GROUP_FIELD_NUMBER: _ClassVar[int]
    QUEUES_FIELD_NUMBER: _ClassVar[int]
    MEMBERS_FIELD_NUMBER: _ClassVar[int]
    group: str
    queues: _containers.RepeatedCompositeFieldContainer[GroupQueue]
    members: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, group: _Optional[str] = ..., queues: _Optional[_Iterable[_Union[GroupQueue, _Mapping]]] = ..., members: _Optional[_Iterable[str]] = ...) -> None: ...

class DeleteGroupRequest(_message.Message):
    __slots__ = ("group",)
    GROUP_FIELD_NUMBER: _ClassVar[int]
    group: str
    def __init__(self, group: _Optional[str] = ...) -> None: ...

class DeleteGroupResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ResetOffsetsRequest(_message.Message):
    __slots__ = ("group", "topic", "mode", "value", "queue_id")
    GROUP_FIELD_NUMBER: _ClassVar[int]
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    MODE_FIELD_NUMBER: _ClassVar[int]
    VALUE_FIELD_NUMBER: _ClassVar[int]
    QUEUE_ID_FIELD_NUMBER: _ClassVar[int]
    group: str
    topic: str
    mode: str
    value: int
    queue_id: int
    def __init__(self, group: _Optional[str] = ..., topic: _Optional[str] = ..., mode: _Optional[str] = ..., value: _Optional[int] = ..., queue_id: _Optional[int] = ...) -> None: ...

class OffsetReset(_message.Message):
    __slots__ = ("queue_id", "old_offset", "had_old", "new_offset")
    QUEUE_ID_FIELD_NUMBER: _ClassVar[int]
    OLD_OFFSET_FIELD_NUMBER: _ClassVar[int]
    HAD_OLD_FIELD_NUMBER: _ClassVar[int]
    NEW_OFFSET_FIELD_NUMBER: _ClassVar[int]
    queue_id: int
    old_offset: int
    had_old: bool
    new_offset: int
    def __init__(self, queue_id: _Optional[int] = ..., old_offset: _Optional[int] = ..., had_old: _Optional[bool] = ..., new_offset: _Optional[int] = ...) -> None: ...

class ResetOffsetsResponse(_message.Message):
    __slots__ = ("queues",)
    QUEUES_FIELD_NUMBER: _ClassVar[int]
    queues: _containers.RepeatedCompositeFieldContainer[OffsetReset]
    def __init__(self, queues: _Optional[_Iterable[_Union[OffsetReset, _Mapping]]] = ...) -> None: ...

class QueryMessagesRequest(_message.Message):
    __slots__ = ("by", "value", "topic", "start_ms", "end_ms", "limit", "allow_follower")
    BY_FIELD_NUMBER: _ClassVar[int]
    VALUE_FIELD_NUMBER: _ClassVar[int]
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    START_MS_FIELD_NUMBER: _ClassVar[int]
    END_MS_FIELD_NUMBER: _ClassVar[int]
    LIMIT_FIELD_NUMBER: _ClassVar[int]
    ALLOW_FOLLOWER_FIELD_NUMBER: _ClassVar[int]
    by: str
    value: str
    topic: str
    start_ms: int
    end_ms: int
    limit: int
    allow_follower: bool
    def __init__(self, by: _Optional[str] = ..., value: _Optional[str] = ..., topic: _Optional[str] = ..., start_ms: _Optional[int] = ..., end_ms: _Optional[int] = ..., limit: _Optional[int] = ..., allow_follower: _Optional[bool] = ...) -> None: ...

class QueryMessagesResponse(_message.Message):
    __slots__ = ("messages",)
    MESSAGES_FIELD_NUMBER: _ClassVar[int]
    messages: _containers.RepeatedCompositeFieldContainer[_broker_pb2.StoredMessage]
    def __init__(self, messages: _Optional[_Iterable[_Union[_broker_pb2.StoredMessage, _Mapping]]] = ...) -> None: ...

class GetConfigRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class SetConfigRequest(_message.Message):
    __slots__ = ("values",)
    class ValuesEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    VALUES_FIELD_NUMBER: _ClassVar[int]
    values: _containers.ScalarMap[str, str]
    def __init__(self, values: _Optional[_Mapping[str, str]] = ...) -> None: ...

class ConfigValue(_message.Message):
    __slots__ = ("key", "value_json", "source")
    KEY_FIELD_NUMBER: _ClassVar[int]
    VALUE_JSON_FIELD_NUMBER: _ClassVar[int]
    SOURCE_FIELD_NUMBER: _ClassVar[int]
    key: str
    value_json: str
    source: str
    def __init__(self, key: _Optional[str] = ..., value_json: _Optional[str] = ..., source: _Optional[str] = ...) -> None: ...

class ConfigResponse(_message.Message):
    __slots__ = ("values",)
    VALUES_FIELD_NUMBER: _ClassVar[int]
    values: _containers.RepeatedCompositeFieldContainer[ConfigValue]
    def __init__(self, values: _Optional[_Iterable[_Union[ConfigValue, _Mapping]]] = ...) -> None: ...
