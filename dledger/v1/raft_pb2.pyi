from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class VoteRequest(_message.Message):
    __slots__ = ("group", "term", "src", "dst", "last_log_index", "last_log_term", "pre_vote", "transfer")
    GROUP_FIELD_NUMBER: _ClassVar[int]
    TERM_FIELD_NUMBER: _ClassVar[int]
    SRC_FIELD_NUMBER: _ClassVar[int]
    DST_FIELD_NUMBER: _ClassVar[int]
    LAST_LOG_INDEX_FIELD_NUMBER: _ClassVar[int]
    LAST_LOG_TERM_FIELD_NUMBER: _ClassVar[int]
    PRE_VOTE_FIELD_NUMBER: _ClassVar[int]
    TRANSFER_FIELD_NUMBER: _ClassVar[int]
    group: str
    term: int
    src: str
    dst: str
    last_log_index: int
    last_log_term: int
    pre_vote: bool
    transfer: bool
    def __init__(self, group: _Optional[str] = ..., term: _Optional[int] = ..., src: _Optional[str] = ..., dst: _Optional[str] = ..., last_log_index: _Optional[int] = ..., last_log_term: _Optional[int] = ..., pre_vote: _Optional[bool] = ..., transfer: _Optional[bool] = ...) -> None: ...

class VoteResponse(_message.Message):
    __slots__ = ("term", "src", "dst", "granted", "pre_vote")
    TERM_FIELD_NUMBER: _ClassVar[int]
    SRC_FIELD_NUMBER: _ClassVar[int]
    DST_FIELD_NUMBER: _ClassVar[int]
    GRANTED_FIELD_NUMBER: _ClassVar[int]
    PRE_VOTE_FIELD_NUMBER: _ClassVar[int]
    term: int
    src: str
    dst: str
    granted: bool
    pre_vote: bool
    def __init__(self, term: _Optional[int] = ..., src: _Optional[str] = ..., dst: _Optional[str] = ..., granted: _Optional[bool] = ..., pre_vote: _Optional[bool] = ...) -> None: ...

class AppendEntriesRequest(_message.Message):
    __slots__ = ("group", "term", "src", "dst", "prev_log_index", "prev_log_term", "leader_commit", "frames", "prev_chain_crc")
    GROUP_FIELD_NUMBER: _ClassVar[int]
    TERM_FIELD_NUMBER: _ClassVar[int]
    SRC_FIELD_NUMBER: _ClassVar[int]
    DST_FIELD_NUMBER: _ClassVar[int]
    PREV_LOG_INDEX_FIELD_NUMBER: _ClassVar[int]
    PREV_LOG_TERM_FIELD_NUMBER: _ClassVar[int]
    LEADER_COMMIT_FIELD_NUMBER: _ClassVar[int]
    FRAMES_FIELD_NUMBER: _ClassVar[int]
    PREV_CHAIN_CRC_FIELD_NUMBER: _ClassVar[int]
    group: str
    term: int
    src: str
    dst: str
    prev_log_index: int
    prev_log_term: int
    leader_commit: int
    frames: bytes
    prev_chain_crc: int
    def __init__(self, group: _Optional[str] = ..., term: _Optional[int] = ..., src: _Optional[str] = ..., dst: _Optional[str] = ..., prev_log_index: _Optional[int] = ..., prev_log_term: _Optional[int] = ..., leader_commit: _Optional[int] = ..., frames: _Optional[bytes] = ..., prev_chain_crc: _Optional[int] = ...) -> None: ...

class AppendEntriesResponse(_message.Message):
    __slots__ = ("term", "src", "dst", "success", "match_index", "conflict_index", "conflict_term", "last_log_index")
    TERM_FIELD_NUMBER: _ClassVar[int]
    SRC_FIELD_NUMBER: _ClassVar[int]
    DST_FIELD_NUMBER: _ClassVar[int]
    SUCCESS_FIELD_NUMBER: _ClassVar[int]
    MATCH_INDEX_FIELD_NUMBER: _ClassVar[int]
    CONFLICT_INDEX_FIELD_NUMBER: _ClassVar[int]
    CONFLICT_TERM_FIELD_NUMBER: _ClassVar[int]
    LAST_LOG_INDEX_FIELD_NUMBER: _ClassVar[int]
    term: int
    src: str
    dst: str
    success: bool
    match_index: int
    conflict_index: int
    conflict_term: int
    last_log_index: int
    def __init__(self, term: _Optional[int] = ..., src: _Optional[str] = ..., dst: _Optional[str] = ..., success: _Optional[bool] = ..., match_index: _Optional[int] = ..., conflict_index: _Optional[int] = ..., conflict_term: _Optional[int] = ..., last_log_index: _Optional[int] = ...) -> None: ...

class HeartbeatRequest(_message.Message):
    __slots__ = ("group", "term", "src", "dst", "commit", "context")
    GROUP_FIELD_NUMBER: _ClassVar[int]
    TERM_FIELD_NUMBER: _ClassVar[int]
    SRC_FIELD_NUMBER: _ClassVar[int]
    DST_FIELD_NUMBER: _ClassVar[int]
    COMMIT_FIELD_NUMBER: _ClassVar[int]
    CONTEXT_FIELD_NUMBER: _ClassVar[int]
    group: str
    term: int
    src: str
    dst: str
    commit: int
    context: int
    def __init__(self, group: _Optional[str] = ..., term: _Optional[int] = ..., src: _Optional[str] = ..., dst: _Optional[str] = ..., commit: _Optional[int] = ..., context: _Optional[int] = ...) -> None: ...

class HeartbeatResponse(_message.Message):
    __slots__ = ("term", "src", "dst", "context", "last_log_index")
    TERM_FIELD_NUMBER: _ClassVar[int]
    SRC_FIELD_NUMBER: _ClassVar[int]
    DST_FIELD_NUMBER: _ClassVar[int]
    CONTEXT_FIELD_NUMBER: _ClassVar[int]
    LAST_LOG_INDEX_FIELD_NUMBER: _ClassVar[int]
    term: int
    src: str
    dst: str
    context: int
    last_log_index: int
    def __init__(self, term: _Optional[int] = ..., src: _Optional[str] = ..., dst: _Optional[str] = ..., context: _Optional[int] = ..., last_log_index: _Optional[int] = ...) -> None: ...

class TimeoutNowRequest(_message.Message):
    __slots__ = ("group", "term", "src", "dst")
    GROUP_FIELD_NUMBER: _ClassVar[int]
    TERM_FIELD_NUMBER: _ClassVar[int]
    SRC_FIELD_NUMBER: _ClassVar[int]
    DST_FIELD_NUMBER: _ClassVar[int]
    group: str
    term: int
    src: str
    dst: str
    def __init__(self, group: _Optional[str] = ..., term: _Optional[int] = ..., src: _Optional[str] = ..., dst: _Optional[str] = ...) -> None: ...

class SnapshotMeta(_message.Message):
    __slots__ = ("index", "term", "chain_crc", "end_pos", "conf")
    INDEX_FIELD_NUMBER: _ClassVar[int]
    TERM_FIELD_NUMBER: _ClassVar[int]
    CHAIN_CRC_FIELD_NUMBER: _ClassVar[int]
    END_POS_FIELD_NUMBER: _ClassVar[int]
    CONF_FIELD_NUMBER: _ClassVar[int]
    index: int
    term: int
    chain_crc: int
    end_pos: int
    conf: bytes
    def __init__(self, index: _Optional[int] = ..., term: _Optional[int] = ..., chain_crc: _Optional[int] = ..., end_pos: _Optional[int] = ..., conf: _Optional[bytes] = ...) -> None: ...

class InstallSnapshotChunk(_message.Message):
    __slots__ = ("group", "term", "src", "dst", "snapshot", "file", "offset", "data", "last")
    GROUP_FIELD_NUMBER: _ClassVar[int]
    TERM_FIELD_NUMBER: _ClassVar[int]
    SRC_FIELD_NUMBER: _ClassVar[int]
    DST_FIELD_NUMBER: _ClassVar[int]
    SNAPSHOT_FIELD_NUMBER: _ClassVar[int]
    FILE_FIELD_NUMBER: _ClassVar[int]
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    DATA_FIELD_NUMBER: _ClassVar[int]
    LAST_FIELD_NUMBER: _ClassVar[int]
    group: str
    term: int
    src: str
    dst: str
    snapshot: SnapshotMeta
    file: str
    offset: int
    data: bytes
    last: bool
    def __init__(self, group: _Optional[str] = ..., term: _Optional[int] = ..., src: _Optional[str] = ..., dst: _Optional[str] = ..., snapshot: _Optional[_Union[SnapshotMeta, _Mapping]] = ..., file: _Optional[str] = ..., offset: _Optional[int] = ..., data: _Optional[bytes] = ..., last: _Optional[bool] = ...) -> None: ...

class RaftMessage(_message.Message):
    __slots__ = ("vote", "vote_response", "append_entries", "append_entries_response", "heartbeat", "heartbeat_response", "timeout_now")
    VOTE_FIELD_NUMBER: _ClassVar[int]
    VOTE_RESPONSE_FIELD_NUMBER: _ClassVar[int]
    APPEND_ENTRIES_FIELD_NUMBER: _ClassVar[int]
    APPEND_ENTRIES_RESPONSE_FIELD_NUMBER: _ClassVar[int]
    HEARTBEAT_FIELD_NUMBER: _ClassVar[int]
    HEARTBEAT_RESPONSE_FIELD_NUMBER: _ClassVar[int]
    TIMEOUT_NOW_FIELD_NUMBER: _ClassVar[int]
    vote: VoteRequest
    vote_response: VoteResponse
    append_entries: AppendEntriesRequest
    append_entries_response: AppendEntriesResponse
    heartbeat: HeartbeatRequest
    heartbeat_response: HeartbeatResponse
    timeout_now: TimeoutNowRequest
    def __init__(self, vote: _Optional[_Union[VoteRequest, _Mapping]] = ..., vote_response: _Optional[_Union[VoteResponse, _Mapping]] = ..., append_entries: _Optional[_Union[AppendEntriesRequest, _Mapping]] = ..., append_entries_response: _Optional[_Union[AppendEntriesResponse, _Mapping]] = ..., heartbeat: _Optional[_Union[HeartbeatRequest, _Mapping]] = ..., heartbeat_response: _Optional[_Union[HeartbeatResponse, _Mapping]] = ..., timeout_now: _Optional[_Union[TimeoutNowRequest, _Mapping]] = ...) -> None: ...

class PeerReply(_message.Message):
    __slots__ = ("messages",)
    MESSAGES_FIELD_NUMBER: _ClassVar[int]
    messages: _containers.RepeatedCompositeFieldContainer[RaftMessage]
    def __init__(self, messages: _Optional[_Iterable[_Union[RaftMessage, _Mapping]]] = ...) -> None: ...

class DeliverRequest(_message.Message):
    __slots__ = ("group", "messages")
    GROUP_FIELD_NUMBER: _ClassVar[int]
    MESSAGES_FIELD_NUMBER: _ClassVar[int]
    group: str
    messages: _containers.RepeatedCompositeFieldContainer[RaftMessage]
    def __init__(self, group: _Optional[str] = ..., messages: _Optional[_Iterable[_Union[RaftMessage, _Mapping]]] = ...) -> None: ...
