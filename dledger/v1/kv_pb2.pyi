from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class ReadConsistency(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    LINEARIZABLE: _ClassVar[ReadConsistency]
    SERIALIZABLE: _ClassVar[ReadConsistency]
LINEARIZABLE: ReadConsistency
SERIALIZABLE: ReadConsistency

class PutRequest(_message.Message):
    __slots__ = ("group", "key", "value")
    GROUP_FIELD_NUMBER: _ClassVar[int]
    KEY_FIELD_NUMBER: _ClassVar[int]
    VALUE_FIELD_NUMBER: _ClassVar[int]
    group: str
    key: bytes
    value: bytes
    def __init__(self, group: _Optional[str] = ..., key: _Optional[bytes] = ..., value: _Optional[bytes] = ...) -> None: ...

class PutResponse(_message.Message):
    __slots__ = ("index", "had_previous", "previous")
    INDEX_FIELD_NUMBER: _ClassVar[int]
    HAD_PREVIOUS_FIELD_NUMBER: _ClassVar[int]
    PREVIOUS_FIELD_NUMBER: _ClassVar[int]
    index: int
    had_previous: bool
    previous: bytes
    def __init__(self, index: _Optional[int] = ..., had_previous: _Optional[bool] = ..., previous: _Optional[bytes] = ...) -> None: ...

class KVGetRequest(_message.Message):
    __slots__ = ("group", "key", "consistency")
    GROUP_FIELD_NUMBER: _ClassVar[int]
    KEY_FIELD_NUMBER: _ClassVar[int]
    CONSISTENCY_FIELD_NUMBER: _ClassVar[int]
    group: str
    key: bytes
    consistency: ReadConsistency
    def __init__(self, group: _Optional[str] = ..., key: _Optional[bytes] = ..., consistency: _Optional[_Union[ReadConsistency, str]] = ...) -> None: ...

class KVGetResponse(_message.Message):
    __slots__ = ("found", "value", "applied_index")
    FOUND_FIELD_NUMBER: _ClassVar[int]
    VALUE_FIELD_NUMBER: _ClassVar[int]
    APPLIED_INDEX_FIELD_NUMBER: _ClassVar[int]
    found: bool
    value: bytes
    applied_index: int
    def __init__(self, found: _Optional[bool] = ..., value: _Optional[bytes] = ..., applied_index: _Optional[int] = ...) -> None: ...

class DeleteRequest(_message.Message):
    __slots__ = ("group", "key")
    GROUP_FIELD_NUMBER: _ClassVar[int]
    KEY_FIELD_NUMBER: _ClassVar[int]
    group: str
    key: bytes
    def __init__(self, group: _Optional[str] = ..., key: _Optional[bytes] = ...) -> None: ...

class DeleteResponse(_message.Message):
    __slots__ = ("index", "existed")
    INDEX_FIELD_NUMBER: _ClassVar[int]
    EXISTED_FIELD_NUMBER: _ClassVar[int]
    index: int
    existed: bool
    def __init__(self, index: _Optional[int] = ..., existed: _Optional[bool] = ...) -> None: ...

class CompareAndSwapRequest(_message.Message):
    __slots__ = ("group", "key", "expected", "expect_absent", "value")
    GROUP_FIELD_NUMBER: _ClassVar[int]
    KEY_FIELD_NUMBER: _ClassVar[int]
    EXPECTED_FIELD_NUMBER: _ClassVar[int]
    EXPECT_ABSENT_FIELD_NUMBER: _ClassVar[int]
    VALUE_FIELD_NUMBER: _ClassVar[int]
    group: str
    key: bytes
    expected: bytes
    expect_absent: bool
    value: bytes
    def __init__(self, group: _Optional[str] = ..., key: _Optional[bytes] = ..., expected: _Optional[bytes] = ..., expect_absent: _Optional[bool] = ..., value: _Optional[bytes] = ...) -> None: ...

class CompareAndSwapResponse(_message.Message):
    __slots__ = ("index", "swapped", "found", "current")
    INDEX_FIELD_NUMBER: _ClassVar[int]
    SWAPPED_FIELD_NUMBER: _ClassVar[int]
    FOUND_FIELD_NUMBER: _ClassVar[int]
    CURRENT_FIELD_NUMBER: _ClassVar[int]
    index: int
    swapped: bool
    found: bool
    current: bytes
    def __init__(self, index: _Optional[int] = ..., swapped: _Optional[bool] = ..., found: _Optional[bool] = ..., current: _Optional[bytes] = ...) -> None: ...
