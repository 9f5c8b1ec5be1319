from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class AppendRequest(_message.Message):
    __slots__ = ("group", "bodies", "request_id")
    GROUP_FIELD_NUMBER: _ClassVar[int]
    BODIES_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    group: str
    bodies: _containers.RepeatedScalarFieldContainer[bytes]
    request_id: int
    def __init__(self, group: _Optional[str] = ..., bodies: _Optional[_Iterable[bytes]] = ..., request_id: _Optional[int] = ...) -> None: ...

class AppendError(_message.Message):
    __slots__ = ("code", "message", "leader_id", "leader_address", "outcome_unknown")
    CODE_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    LEADER_ID_FIELD_NUMBER: _ClassVar[int]
    LEADER_ADDRESS_FIELD_NUMBER: _ClassVar[int]
    OUTCOME_UNKNOWN_FIELD_NUMBER: _ClassVar[int]
    code: str
    message: str
    leader_id: str
    leader_address: str
    outcome_unknown: bool
    def __init__(self, code: _Optional[str] = ..., message: _Optional[str] = ..., leader_id: _Optional[str] = ..., leader_address: _Optional[str] = ..., outcome_unknown: _Optional[bool] = ...) -> None: ...

class AppendResponse(_message.Message):
    __slots__ = ("request_id", "first_index", "term", "pos", "error")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    FIRST_INDEX_FIELD_NUMBER: _ClassVar[int]
    TERM_FIELD_NUMBER: _ClassVar[int]
    POS_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    request_id: int
    first_index: int
    term: int
    pos: _containers.RepeatedScalarFieldContainer[int]
    error: AppendError
    def __init__(self, request_id: _Optional[int] = ..., first_index: _Optional[int] = ..., term: _Optional[int] = ..., pos: _Optional[_Iterable[int]] = ..., error: _Optional[_Union[AppendError, _Mapping]] = ...) -> None: ...

class GetRequest(_message.Message):
    __slots__ = ("group", "index")
    GROUP_FIELD_NUMBER: _ClassVar[int]
    INDEX_FIELD_NUMBER: _ClassVar[int]
    group: str
    index: int
    def __init__(self, group: _Optional[str] = ..., index: _Optional[int] = ...) -> None: ...

class GetResponse(_message.Message):
    __slots__ = ("index", "term", "pos", "magic", "body")
    INDEX_FIELD_NUMBER: _ClassVar[int]
    TERM_FIELD_NUMBER: _ClassVar[int]
    POS_FIELD_NUMBER: _ClassVar[int]
    MAGIC_FIELD_NUMBER: _ClassVar[int]
    BODY_FIELD_NUMBER: _ClassVar[int]
    index: int
    term: int
    pos: int
    magic: int
    body: bytes
    def __init__(self, index: _Optional[int] = ..., term: _Optional[int] = ..., pos: _Optional[int] = ..., magic: _Optional[int] = ..., body: _Optional[bytes] = ...) -> None: ...

class MetadataRequest(_message.Message):
    __slots__ = ("group",)
    GROUP_FIELD_NUMBER: _ClassVar[int]
    group: str
    def __init__(self, group: _Optional[str] = ...) -> None: ...

class PeerInfo(_message.Message):
    __slots__ = ("id", "address", "match_index", "member")
    ID_FIELD_NUMBER: _ClassVar[int]
    ADDRESS_FIELD_NUMBER: _ClassVar[int]
    MATCH_INDEX_FIELD_NUMBER: _ClassVar[int]
    MEMBER_FIELD_NUMBER: _ClassVar[int]
    id: str
    address: str
    match_index: int
    member: str
    def __init__(self, id: _Optional[str] = ..., address: _Optional[str] = ..., match_index: _Optional[int] = ..., member: _Optional[str] = ...) -> None: ...

class MetadataResponse(_message.Message):
    __slots__ = ("group", "node_id", "address", "role", "term", "leader_id", "leader_address", "last_index", "commit_index", "applied_index", "peers", "data_dir", "pid", "flush", "voters", "learners", "conf_index")
    GROUP_FIELD_NUMBER: _ClassVar[int]
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    ADDRESS_FIELD_NUMBER: _ClassVar[int]
    ROLE_FIELD_NUMBER: _ClassVar[int]
    TERM_FIELD_NUMBER: _ClassVar[int]
    LEADER_ID_FIELD_NUMBER: _ClassVar[int]
    LEADER_ADDRESS_FIELD_NUMBER: _ClassVar[int]
    LAST_INDEX_FIELD_NUMBER: _ClassVar[int]
    COMMIT_INDEX_FIELD_NUMBER: _ClassVar[int]
    APPLIED_INDEX_FIELD_NUMBER: _ClassVar[int]
    PEERS_FIELD_NUMBER: _ClassVar[int]
    DATA_DIR_FIELD_NUMBER: _ClassVar[int]
    PID_FIELD_NUMBER: _ClassVar[int]
    FLUSH_FIELD_NUMBER: _ClassVar[int]
    VOTERS_FIELD_NUMBER: _ClassVar[int]
    LEARNERS_FIELD_NUMBER: _ClassVar[int]
    CONF_INDEX_FIELD_NUMBER: _ClassVar[int]
    group: str
    node_id: str
    address: str
    role: str
    term: int
    leader_id: str
    leader_address: str
    last_index: int
    commit_index: int
    applied_index: int
    peers: _containers.RepeatedCompositeFieldContainer[PeerInfo]
    data_dir: str
    pid: int
    flush: str
    voters: _containers.RepeatedScalarFieldContainer[str]
    learners: _containers.RepeatedScalarFieldContainer[str]
    conf_index: int
    def __init__(self, group: _Optional[str] = ..., node_id: _Optional[str] = ..., address: _Optional[str] = ..., role: _Optional[str] = ..., term: _Optional[int] = ..., leader_id: _Optional[str] = ..., leader_address: _Optional[str] = ..., last_index: _Optional[int] = ..., commit_index: _Optional[int] = ..., applied_index: _Optional[int] = ..., peers: _Optional[_Iterable[_Union[PeerInfo, _Mapping]]] = ..., data_dir: _Optional[str] = ..., pid: _Optional[int] = ..., flush: _Optional[str] = ..., voters: _Optional[_Iterable[str]] = ..., learners: _Optional[_Iterable[str]] = ..., conf_index: _Optional[int] = ...) -> None: ...

class TransferLeadershipRequest(_message.Message):
    __slots__ = ("group", "target")
    GROUP_FIELD_NUMBER: _ClassVar[int]
    TARGET_FIELD_NUMBER: _ClassVar[int]
    group: str
    target: str
    def __init__(self, group: _Optional[str] = ..., target: _Optional[str] = ...) -> None: ...

class TransferLeadershipResponse(_message.Message):
    __slots__ = ("leader_id",)
    LEADER_ID_FIELD_NUMBER: _ClassVar[int]
    leader_id: str
    def __init__(self, leader_id: _Optional[str] = ...) -> None: ...

class TakeSnapshotRequest(_message.Message):
    __slots__ = ("group",)
    GROUP_FIELD_NUMBER: _ClassVar[int]
    group: str
    def __init__(self, group: _Optional[str] = ...) -> None: ...

class TakeSnapshotResponse(_message.Message):
    __slots__ = ("taken", "index", "term", "size", "first_index")
    TAKEN_FIELD_NUMBER: _ClassVar[int]
    INDEX_FIELD_NUMBER: _ClassVar[int]
    TERM_FIELD_NUMBER: _ClassVar[int]
    SIZE_FIELD_NUMBER: _ClassVar[int]
    FIRST_INDEX_FIELD_NUMBER: _ClassVar[int]
    taken: bool
    index: int
    term: int
    size: int
    first_index: int
    def __init__(self, taken: _Optional[bool] = ..., index: _Optional[int] = ..., term: _Optional[int] = ..., size: _Optional[int] = ..., first_index: _Optional[int] = ...) -> None: ...

class BackupRequest(_message.Message):
    __slots__ = ("group",)
    GROUP_FIELD_NUMBER: _ClassVar[int]
    group: str
    def __init__(self, group: _Optional[str] = ...) -> None: ...

class BackupChunk(_message.Message):
    __slots__ = ("file", "offset", "data")
    FILE_FIELD_NUMBER: _ClassVar[int]
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    DATA_FIELD_NUMBER: _ClassVar[int]
    file: str
    offset: int
    data: bytes
    def __init__(self, file: _Optional[str] = ..., offset: _Optional[int] = ..., data: _Optional[bytes] = ...) -> None: ...

class ChangeMembershipRequest(_message.Message):
    __slots__ = ("group", "kind", "node_id", "address")
    GROUP_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    ADDRESS_FIELD_NUMBER: _ClassVar[int]
    group: str
    kind: str
    node_id: str
    address: str
    def __init__(self, group: _Optional[str] = ..., kind: _Optional[str] = ..., node_id: _Optional[str] = ..., address: _Optional[str] = ...) -> None: ...

class ChangeMembershipResponse(_message.Message):
    __slots__ = ("index", "term", "voters", "learners")
    INDEX_FIELD_NUMBER: _ClassVar[int]
    TERM_FIELD_NUMBER: _ClassVar[int]
    VOTERS_FIELD_NUMBER: _ClassVar[int]
    LEARNERS_FIELD_NUMBER: _ClassVar[int]
    index: int
    term: int
    voters: _containers.RepeatedScalarFieldContainer[str]
    learners: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, index: _Optional[int] = ..., term: _Optional[int] = ..., voters: _Optional[_Iterable[str]] = ..., learners: _Optional[_Iterable[str]] = ...) -> None: ...
