from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class TopicQueues(_message.Message):
    __slots__ = ("topic", "queues")
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    QUEUES_FIELD_NUMBER: _ClassVar[int]
    topic: str
    queues: int
    def __init__(self, topic: _Optional[str] = ..., queues: _Optional[int] = ...) -> None: ...

class BrokerRegistration(_message.Message):
    __slots__ = ("cluster", "group", "node_id", "address", "leader", "term", "topics")
    CLUSTER_FIELD_NUMBER: _ClassVar[int]
    GROUP_FIELD_NUMBER: _ClassVar[int]
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    ADDRESS_FIELD_NUMBER: _ClassVar[int]
    LEADER_FIELD_NUMBER: _ClassVar[int]
    TERM_FIELD_NUMBER: _ClassVar[int]
    TOPICS_FIELD_NUMBER: _ClassVar[int]
    cluster: str
    group: str
    node_id: str
    address: str
    leader: bool
    term: int
    topics: _containers.RepeatedCompositeFieldContainer[TopicQueues]
    def __init__(self, cluster: _Optional[str] = ..., group: _Optional[str] = ..., node_id: _Optional[str] = ..., address: _Optional[str] = ..., leader: _Optional[bool] = ..., term: _Optional[int] = ..., topics: _Optional[_Iterable[_Union[TopicQueues, _Mapping]]] = ...) -> None: ...

class RegisterBrokerResponse(_message.Message):
    __slots__ = ("expire_after_ms",)
    EXPIRE_AFTER_MS_FIELD_NUMBER: _ClassVar[int]
    expire_after_ms: int
    def __init__(self, expire_after_ms: _Optional[int] = ...) -> None: ...

class UnregisterBrokerRequest(_message.Message):
    __slots__ = ("cluster", "group", "node_id")
    CLUSTER_FIELD_NUMBER: _ClassVar[int]
    GROUP_FIELD_NUMBER: _ClassVar[int]
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    cluster: str
    group: str
    node_id: str
    def __init__(self, cluster: _Optional[str] = ..., group: _Optional[str] = ..., node_id: _Optional[str] = ...) -> None: ...

class UnregisterBrokerResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class QueryRouteRequest(_message.Message):
    __slots__ = ("topic",)
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    topic: str
    def __init__(self, topic: _Optional[str] = ...) -> None: ...

class GroupRoute(_message.Message):
    __slots__ = ("group", "cluster", "leader_address", "addresses", "queues")
    GROUP_FIELD_NUMBER: _ClassVar[int]
    CLUSTER_FIELD_NUMBER: _ClassVar[int]
    LEADER_ADDRESS_FIELD_NUMBER: _ClassVar[int]
    ADDRESSES_FIELD_NUMBER: _ClassVar[int]
    QUEUES_FIELD_NUMBER: _ClassVar[int]
    group: str
    cluster: str
    leader_address: str
    addresses: _containers.RepeatedScalarFieldContainer[str]
    queues: int
    def __init__(self, group: _Optional[str] = ..., cluster: _Optional[str] = ..., leader_address: _Optional[str] = ..., addresses: _Optional[_Iterable[str]] = ..., queues: _Optional[int] = ...) -> None: ...

class QueryRouteResponse(_message.Message):
    __slots__ = ("topic", "groups")
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    GROUPS_FIELD_NUMBER: _ClassVar[int]
    topic: str
    groups: _containers.RepeatedCompositeFieldContainer[GroupRoute]
    def __init__(self, topic: _Optional[str] = ..., groups: _Optional[_Iterable[_Union[GroupRoute, _Mapping]]] = ...) -> None: ...

class ClusterInfoRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class RegisteredBroker(_message.Message):
    __slots__ = ("registration", "age_ms")
    REGISTRATION_FIELD_NUMBER: _ClassVar[int]
    AGE_MS_FIELD_NUMBER: _ClassVar[int]
    registration: BrokerRegistration
    age_ms: int
    def __init__(self, registration: _Optional[_Union[BrokerRegistration, _Mapping]] = ..., age_ms: _Optional[int] = ...) -> None: ...

class ClusterInfoResponse(_message.Message):
    __slots__ = ("brokers", "consumer_groups")
    BROKERS_FIELD_NUMBER: _ClassVar[int]
    CONSUMER_GROUPS_FIELD_NUMBER: _ClassVar[int]
    brokers: _containers.RepeatedCompositeFieldContainer[RegisteredBroker]
    consumer_groups: _containers.RepeatedCompositeFieldContainer[ConsumerGroupMembers]
    def __init__(self, brokers: _Optional[_Iterable[_Union[RegisteredBroker, _Mapping]]] = ..., consumer_groups: _Optional[_Iterable[_Union[ConsumerGroupMembers, _Mapping]]] = ...) -> None: ...

class ConsumerHeartbeatRequest(_message.Message):
    __slots__ = ("group", "client_id")
    GROUP_FIELD_NUMBER: _ClassVar[int]
    CLIENT_ID_FIELD_NUMBER: _ClassVar[int]
    group: str
    client_id: str
    def __init__(self, group: _Optional[str] = ..., client_id: _Optional[str] = ...) -> None: ...

class ConsumerHeartbeatResponse(_message.Message):
    __slots__ = ("expire_after_ms",)
    EXPIRE_AFTER_MS_FIELD_NUMBER: _ClassVar[int]
    expire_after_ms: int
    def __init__(self, expire_after_ms: _Optional[int] = ...) -> None: ...

class ListConsumersRequest(_message.Message):
    __slots__ = ("group",)
    GROUP_FIELD_NUMBER: _ClassVar[int]
    group: str
    def __init__(self, group: _Optional[str] = ...) -> None: ...

class ConsumerGroupMembers(_message.Message):
    __slots__ = ("group", "client_ids")
    GROUP_FIELD_NUMBER: _ClassVar[int]
    CLIENT_IDS_FIELD_NUMBER: _ClassVar[int]
    group: str
    client_ids: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, group: _Optional[str] = ..., client_ids: _Optional[_Iterable[str]] = ...) -> None: ...

class UnregisterConsumerRequest(_message.Message):
    __slots__ = ("group", "client_id")
    GROUP_FIELD_NUMBER: _ClassVar[int]
    CLIENT_ID_FIELD_NUMBER: _ClassVar[int]
    group: str
    client_id: str
    def __init__(self, group: _Optional[str] = ..., client_id: _Optional[str] = ...) -> None: ...

class UnregisterConsumerResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...
