from google.protobuf import descriptor_pb2 as _descriptor_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class ErrorReason(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    ERROR_REASON_UNSPECIFIED: _ClassVar[ErrorReason]
    ERROR_REASON_INVALID_ARGUMENT: _ClassVar[ErrorReason]
    ERROR_REASON_MESSAGE_TOO_LARGE: _ClassVar[ErrorReason]
    ERROR_REASON_STREAM_NOT_FOUND: _ClassVar[ErrorReason]
    ERROR_REASON_GROUP_NOT_FOUND: _ClassVar[ErrorReason]
    ERROR_REASON_ALREADY_EXISTS: _ClassVar[ErrorReason]
    ERROR_REASON_OFFSET_OUT_OF_RANGE: _ClassVar[ErrorReason]
    ERROR_REASON_STREAM_NEEDS_REPAIR: _ClassVar[ErrorReason]
    ERROR_REASON_SINK_CONFLICT: _ClassVar[ErrorReason]
    ERROR_REASON_STAGING_NOT_FOUND: _ClassVar[ErrorReason]
    ERROR_REASON_CORRUPT_RECORD: _ClassVar[ErrorReason]
    ERROR_REASON_SHUTTING_DOWN: _ClassVar[ErrorReason]
    ERROR_REASON_UNAUTHENTICATED: _ClassVar[ErrorReason]
    ERROR_REASON_INTERNAL: _ClassVar[ErrorReason]
    ERROR_REASON_SCHEMA_INVALID: _ClassVar[ErrorReason]
    ERROR_REASON_SCHEMA_INCOMPATIBLE: _ClassVar[ErrorReason]
    ERROR_REASON_VALUE_MISMATCH: _ClassVar[ErrorReason]
    ERROR_REASON_PERMISSION_DENIED: _ClassVar[ErrorReason]
    ERROR_REASON_DISK_FULL: _ClassVar[ErrorReason]
    ERROR_REASON_OVERLOADED: _ClassVar[ErrorReason]
    ERROR_REASON_NOT_OWNER: _ClassVar[ErrorReason]
    ERROR_REASON_MEMBER_UNAVAILABLE: _ClassVar[ErrorReason]
    ERROR_REASON_STREAM_MOVING: _ClassVar[ErrorReason]
    ERROR_REASON_MOVE_FAILED: _ClassVar[ErrorReason]

class Ack(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    ACK_UNSPECIFIED: _ClassVar[Ack]
    ACK_FSYNC: _ClassVar[Ack]
    ACK_WRITE: _ClassVar[Ack]

class Ordering(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    ORDERING_UNSPECIFIED: _ClassVar[Ordering]
    ORDERING_NONE: _ClassVar[Ordering]
    ORDERING_KEY: _ClassVar[Ordering]

class MoveStep(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    MOVE_STEP_UNSPECIFIED: _ClassVar[MoveStep]
    MOVE_STEP_BEGIN: _ClassVar[MoveStep]
    MOVE_STEP_FILE: _ClassVar[MoveStep]
    MOVE_STEP_INSTALL: _ClassVar[MoveStep]
    MOVE_STEP_ABORT: _ClassVar[MoveStep]
ERROR_REASON_UNSPECIFIED: ErrorReason
ERROR_REASON_INVALID_ARGUMENT: ErrorReason
ERROR_REASON_MESSAGE_TOO_LARGE: ErrorReason
ERROR_REASON_STREAM_NOT_FOUND: ErrorReason
ERROR_REASON_GROUP_NOT_FOUND: ErrorReason
ERROR_REASON_ALREADY_EXISTS: ErrorReason
ERROR_REASON_OFFSET_OUT_OF_RANGE: ErrorReason
ERROR_REASON_STREAM_NEEDS_REPAIR: ErrorReason
ERROR_REASON_SINK_CONFLICT: ErrorReason
ERROR_REASON_STAGING_NOT_FOUND: ErrorReason
ERROR_REASON_CORRUPT_RECORD: ErrorReason
ERROR_REASON_SHUTTING_DOWN: ErrorReason
ERROR_REASON_UNAUTHENTICATED: ErrorReason
ERROR_REASON_INTERNAL: ErrorReason
ERROR_REASON_SCHEMA_INVALID: ErrorReason
ERROR_REASON_SCHEMA_INCOMPATIBLE: ErrorReason
ERROR_REASON_VALUE_MISMATCH: ErrorReason
ERROR_REASON_PERMISSION_DENIED: ErrorReason
ERROR_REASON_DISK_FULL: ErrorReason
ERROR_REASON_OVERLOADED: ErrorReason
ERROR_REASON_NOT_OWNER: ErrorReason
ERROR_REASON_MEMBER_UNAVAILABLE: ErrorReason
ERROR_REASON_STREAM_MOVING: ErrorReason
ERROR_REASON_MOVE_FAILED: ErrorReason
ACK_UNSPECIFIED: Ack
ACK_FSYNC: Ack
ACK_WRITE: Ack
ORDERING_UNSPECIFIED: Ordering
ORDERING_NONE: Ordering
ORDERING_KEY: Ordering
MOVE_STEP_UNSPECIFIED: MoveStep
MOVE_STEP_BEGIN: MoveStep
MOVE_STEP_FILE: MoveStep
MOVE_STEP_INSTALL: MoveStep
MOVE_STEP_ABORT: MoveStep
ERROR_FIELD_NUMBER: _ClassVar[int]
error: _descriptor.FieldDescriptor
NAMES_STREAM_FIELD_NUMBER: _ClassVar[int]
names_stream: _descriptor.FieldDescriptor

class ErrorSpec(_message.Message):
    __slots__ = ("status", "client_class", "client_bases", "trailing")
    STATUS_FIELD_NUMBER: _ClassVar[int]
    CLIENT_CLASS_FIELD_NUMBER: _ClassVar[int]
    CLIENT_BASES_FIELD_NUMBER: _ClassVar[int]
    TRAILING_FIELD_NUMBER: _ClassVar[int]
    status: str
    client_class: str
    client_bases: _containers.RepeatedScalarFieldContainer[str]
    trailing: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, status: _Optional[str] = ..., client_class: _Optional[str] = ..., client_bases: _Optional[_Iterable[str]] = ..., trailing: _Optional[_Iterable[str]] = ...) -> None: ...

class StreamConfig(_message.Message):
    __slots__ = ("max_age_ms", "max_bytes", "dedup_window_ms", "max_message_bytes")
    MAX_AGE_MS_FIELD_NUMBER: _ClassVar[int]
    MAX_BYTES_FIELD_NUMBER: _ClassVar[int]
    DEDUP_WINDOW_MS_FIELD_NUMBER: _ClassVar[int]
    MAX_MESSAGE_BYTES_FIELD_NUMBER: _ClassVar[int]
    max_age_ms: int
    max_bytes: int
    dedup_window_ms: int
    max_message_bytes: int
    def __init__(self, max_age_ms: _Optional[int] = ..., max_bytes: _Optional[int] = ..., dedup_window_ms: _Optional[int] = ..., max_message_bytes: _Optional[int] = ...) -> None: ...

class StreamInfo(_message.Message):
    __slots__ = ("name", "config", "start_offset", "end_offset", "message_count", "bytes_on_disk", "first_timestamp_ms", "last_timestamp_ms", "created_ms", "segment_count", "error", "value_schemas")
    NAME_FIELD_NUMBER: _ClassVar[int]
    CONFIG_FIELD_NUMBER: _ClassVar[int]
    START_OFFSET_FIELD_NUMBER: _ClassVar[int]
    END_OFFSET_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_COUNT_FIELD_NUMBER: _ClassVar[int]
    BYTES_ON_DISK_FIELD_NUMBER: _ClassVar[int]
    FIRST_TIMESTAMP_MS_FIELD_NUMBER: _ClassVar[int]
    LAST_TIMESTAMP_MS_FIELD_NUMBER: _ClassVar[int]
    CREATED_MS_FIELD_NUMBER: _ClassVar[int]
    SEGMENT_COUNT_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    VALUE_SCHEMAS_FIELD_NUMBER: _ClassVar[int]
    name: str
    config: StreamConfig
    start_offset: int
    end_offset: int
    message_count: int
    bytes_on_disk: int
    first_timestamp_ms: int
    last_timestamp_ms: int
    created_ms: int
    segment_count: int
    error: str
    value_schemas: _containers.RepeatedCompositeFieldContainer[ValueSchema]
    def __init__(self, name: _Optional[str] = ..., config: _Optional[_Union[StreamConfig, _Mapping]] = ..., start_offset: _Optional[int] = ..., end_offset: _Optional[int] = ..., message_count: _Optional[int] = ..., bytes_on_disk: _Optional[int] = ..., first_timestamp_ms: _Optional[int] = ..., last_timestamp_ms: _Optional[int] = ..., created_ms: _Optional[int] = ..., segment_count: _Optional[int] = ..., error: _Optional[str] = ..., value_schemas: _Optional[_Iterable[_Union[ValueSchema, _Mapping]]] = ...) -> None: ...

class ValueSchema(_message.Message):
    __slots__ = ("version", "ddl", "arrow_schema", "created_ms")
    VERSION_FIELD_NUMBER: _ClassVar[int]
    DDL_FIELD_NUMBER: _ClassVar[int]
    ARROW_SCHEMA_FIELD_NUMBER: _ClassVar[int]
    CREATED_MS_FIELD_NUMBER: _ClassVar[int]
    version: int
    ddl: str
    arrow_schema: bytes
    created_ms: int
    def __init__(self, version: _Optional[int] = ..., ddl: _Optional[str] = ..., arrow_schema: _Optional[bytes] = ..., created_ms: _Optional[int] = ...) -> None: ...

class CreateStreamRequest(_message.Message):
    __slots__ = ("name", "config", "exist_ok", "value_schema")
    NAME_FIELD_NUMBER: _ClassVar[int]
    CONFIG_FIELD_NUMBER: _ClassVar[int]
    EXIST_OK_FIELD_NUMBER: _ClassVar[int]
    VALUE_SCHEMA_FIELD_NUMBER: _ClassVar[int]
    name: str
    config: StreamConfig
    exist_ok: bool
    value_schema: str
    def __init__(self, name: _Optional[str] = ..., config: _Optional[_Union[StreamConfig, _Mapping]] = ..., exist_ok: _Optional[bool] = ..., value_schema: _Optional[str] = ...) -> None: ...

class DescribeStreamRequest(_message.Message):
    __slots__ = ("name",)
    NAME_FIELD_NUMBER: _ClassVar[int]
    name: str
    def __init__(self, name: _Optional[str] = ...) -> None: ...

class ListStreamsRequest(_message.Message):
    __slots__ = ("prefix", "pattern", "page_size", "page_token")
    PREFIX_FIELD_NUMBER: _ClassVar[int]
    PATTERN_FIELD_NUMBER: _ClassVar[int]
    PAGE_SIZE_FIELD_NUMBER: _ClassVar[int]
    PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    prefix: str
    pattern: str
    page_size: int
    page_token: str
    def __init__(self, prefix: _Optional[str] = ..., pattern: _Optional[str] = ..., page_size: _Optional[int] = ..., page_token: _Optional[str] = ...) -> None: ...

class ListStreamsResponse(_message.Message):
    __slots__ = ("streams", "next_page_token")
    STREAMS_FIELD_NUMBER: _ClassVar[int]
    NEXT_PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    streams: _containers.RepeatedCompositeFieldContainer[StreamInfo]
    next_page_token: str
    def __init__(self, streams: _Optional[_Iterable[_Union[StreamInfo, _Mapping]]] = ..., next_page_token: _Optional[str] = ...) -> None: ...

class UpdateStreamRequest(_message.Message):
    __slots__ = ("name", "config", "value_schema")
    NAME_FIELD_NUMBER: _ClassVar[int]
    CONFIG_FIELD_NUMBER: _ClassVar[int]
    VALUE_SCHEMA_FIELD_NUMBER: _ClassVar[int]
    name: str
    config: StreamConfig
    value_schema: str
    def __init__(self, name: _Optional[str] = ..., config: _Optional[_Union[StreamConfig, _Mapping]] = ..., value_schema: _Optional[str] = ...) -> None: ...

class DeleteStreamRequest(_message.Message):
    __slots__ = ("name",)
    NAME_FIELD_NUMBER: _ClassVar[int]
    name: str
    def __init__(self, name: _Optional[str] = ...) -> None: ...

class DeleteStreamResponse(_message.Message):
    __slots__ = ("deleted",)
    DELETED_FIELD_NUMBER: _ClassVar[int]
    deleted: bool
    def __init__(self, deleted: _Optional[bool] = ...) -> None: ...

class DeleteMessagesRequest(_message.Message):
    __slots__ = ("name", "before_offset")
    NAME_FIELD_NUMBER: _ClassVar[int]
    BEFORE_OFFSET_FIELD_NUMBER: _ClassVar[int]
    name: str
    before_offset: int
    def __init__(self, name: _Optional[str] = ..., before_offset: _Optional[int] = ...) -> None: ...

class RepairStreamRequest(_message.Message):
    __slots__ = ("name",)
    NAME_FIELD_NUMBER: _ClassVar[int]
    name: str
    def __init__(self, name: _Optional[str] = ...) -> None: ...

class RepairStreamResponse(_message.Message):
    __slots__ = ("stream", "truncated_bytes", "detail")
    STREAM_FIELD_NUMBER: _ClassVar[int]
    TRUNCATED_BYTES_FIELD_NUMBER: _ClassVar[int]
    DETAIL_FIELD_NUMBER: _ClassVar[int]
    stream: StreamInfo
    truncated_bytes: int
    detail: str
    def __init__(self, stream: _Optional[_Union[StreamInfo, _Mapping]] = ..., truncated_bytes: _Optional[int] = ..., detail: _Optional[str] = ...) -> None: ...

class StreamStatsRequest(_message.Message):
    __slots__ = ("streams", "pattern")
    STREAMS_FIELD_NUMBER: _ClassVar[int]
    PATTERN_FIELD_NUMBER: _ClassVar[int]
    streams: _containers.RepeatedScalarFieldContainer[str]
    pattern: str
    def __init__(self, streams: _Optional[_Iterable[str]] = ..., pattern: _Optional[str] = ...) -> None: ...

class StreamActivity(_message.Message):
    __slots__ = ("stream", "messages_in", "bytes_in", "messages_out", "bytes_out")
    STREAM_FIELD_NUMBER: _ClassVar[int]
    MESSAGES_IN_FIELD_NUMBER: _ClassVar[int]
    BYTES_IN_FIELD_NUMBER: _ClassVar[int]
    MESSAGES_OUT_FIELD_NUMBER: _ClassVar[int]
    BYTES_OUT_FIELD_NUMBER: _ClassVar[int]
    stream: StreamInfo
    messages_in: int
    bytes_in: int
    messages_out: int
    bytes_out: int
    def __init__(self, stream: _Optional[_Union[StreamInfo, _Mapping]] = ..., messages_in: _Optional[int] = ..., bytes_in: _Optional[int] = ..., messages_out: _Optional[int] = ..., bytes_out: _Optional[int] = ...) -> None: ...

class StreamStatsResponse(_message.Message):
    __slots__ = ("streams", "broker_time_ms", "broker_start_ms")
    STREAMS_FIELD_NUMBER: _ClassVar[int]
    BROKER_TIME_MS_FIELD_NUMBER: _ClassVar[int]
    BROKER_START_MS_FIELD_NUMBER: _ClassVar[int]
    streams: _containers.RepeatedCompositeFieldContainer[StreamActivity]
    broker_time_ms: int
    broker_start_ms: int
    def __init__(self, streams: _Optional[_Iterable[_Union[StreamActivity, _Mapping]]] = ..., broker_time_ms: _Optional[int] = ..., broker_start_ms: _Optional[int] = ...) -> None: ...

class Message(_message.Message):
    __slots__ = ("id", "key", "value", "headers")
    class HeadersEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: bytes
        def __init__(self, key: _Optional[str] = ..., value: _Optional[bytes] = ...) -> None: ...
    ID_FIELD_NUMBER: _ClassVar[int]
    KEY_FIELD_NUMBER: _ClassVar[int]
    VALUE_FIELD_NUMBER: _ClassVar[int]
    HEADERS_FIELD_NUMBER: _ClassVar[int]
    id: str
    key: bytes
    value: bytes
    headers: _containers.ScalarMap[str, bytes]
    def __init__(self, id: _Optional[str] = ..., key: _Optional[bytes] = ..., value: _Optional[bytes] = ..., headers: _Optional[_Mapping[str, bytes]] = ...) -> None: ...

class PublishRequest(_message.Message):
    __slots__ = ("stream", "messages", "arrow_stream", "ack")
    STREAM_FIELD_NUMBER: _ClassVar[int]
    MESSAGES_FIELD_NUMBER: _ClassVar[int]
    ARROW_STREAM_FIELD_NUMBER: _ClassVar[int]
    ACK_FIELD_NUMBER: _ClassVar[int]
    stream: str
    messages: _containers.RepeatedCompositeFieldContainer[Message]
    arrow_stream: bytes
    ack: Ack
    def __init__(self, stream: _Optional[str] = ..., messages: _Optional[_Iterable[_Union[Message, _Mapping]]] = ..., arrow_stream: _Optional[bytes] = ..., ack: _Optional[_Union[Ack, str]] = ...) -> None: ...

class Duplicate(_message.Message):
    __slots__ = ("index", "offset")
    INDEX_FIELD_NUMBER: _ClassVar[int]
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    index: int
    offset: int
    def __init__(self, index: _Optional[int] = ..., offset: _Optional[int] = ...) -> None: ...

class PublishResponse(_message.Message):
    __slots__ = ("first_offset", "stored_count", "duplicates", "timestamp_ms")
    FIRST_OFFSET_FIELD_NUMBER: _ClassVar[int]
    STORED_COUNT_FIELD_NUMBER: _ClassVar[int]
    DUPLICATES_FIELD_NUMBER: _ClassVar[int]
    TIMESTAMP_MS_FIELD_NUMBER: _ClassVar[int]
    first_offset: int
    stored_count: int
    duplicates: _containers.RepeatedCompositeFieldContainer[Duplicate]
    timestamp_ms: int
    def __init__(self, first_offset: _Optional[int] = ..., stored_count: _Optional[int] = ..., duplicates: _Optional[_Iterable[_Union[Duplicate, _Mapping]]] = ..., timestamp_ms: _Optional[int] = ...) -> None: ...

class PublishManyRequest(_message.Message):
    __slots__ = ("entries",)
    ENTRIES_FIELD_NUMBER: _ClassVar[int]
    entries: _containers.RepeatedCompositeFieldContainer[PublishRequest]
    def __init__(self, entries: _Optional[_Iterable[_Union[PublishRequest, _Mapping]]] = ...) -> None: ...

class EntryError(_message.Message):
    __slots__ = ("code", "message", "metadata")
    class MetadataEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    CODE_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    METADATA_FIELD_NUMBER: _ClassVar[int]
    code: int
    message: str
    metadata: _containers.ScalarMap[str, str]
    def __init__(self, code: _Optional[int] = ..., message: _Optional[str] = ..., metadata: _Optional[_Mapping[str, str]] = ...) -> None: ...

class PublishManyResult(_message.Message):
    __slots__ = ("published", "error")
    PUBLISHED_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    published: PublishResponse
    error: EntryError
    def __init__(self, published: _Optional[_Union[PublishResponse, _Mapping]] = ..., error: _Optional[_Union[EntryError, _Mapping]] = ...) -> None: ...

class PublishManyResponse(_message.Message):
    __slots__ = ("results",)
    RESULTS_FIELD_NUMBER: _ClassVar[int]
    results: _containers.RepeatedCompositeFieldContainer[PublishManyResult]
    def __init__(self, results: _Optional[_Iterable[_Union[PublishManyResult, _Mapping]]] = ...) -> None: ...

class FetchRequest(_message.Message):
    __slots__ = ("stream", "offset", "max_messages", "max_bytes", "wait_ms", "end_offset")
    STREAM_FIELD_NUMBER: _ClassVar[int]
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    MAX_MESSAGES_FIELD_NUMBER: _ClassVar[int]
    MAX_BYTES_FIELD_NUMBER: _ClassVar[int]
    WAIT_MS_FIELD_NUMBER: _ClassVar[int]
    END_OFFSET_FIELD_NUMBER: _ClassVar[int]
    stream: str
    offset: int
    max_messages: int
    max_bytes: int
    wait_ms: int
    end_offset: int
    def __init__(self, stream: _Optional[str] = ..., offset: _Optional[int] = ..., max_messages: _Optional[int] = ..., max_bytes: _Optional[int] = ..., wait_ms: _Optional[int] = ..., end_offset: _Optional[int] = ...) -> None: ...

class FetchResponse(_message.Message):
    __slots__ = ("batches", "next_offset", "start_offset", "end_offset", "count", "stored_schema", "schema_version")
    BATCHES_FIELD_NUMBER: _ClassVar[int]
    NEXT_OFFSET_FIELD_NUMBER: _ClassVar[int]
    START_OFFSET_FIELD_NUMBER: _ClassVar[int]
    END_OFFSET_FIELD_NUMBER: _ClassVar[int]
    COUNT_FIELD_NUMBER: _ClassVar[int]
    STORED_SCHEMA_FIELD_NUMBER: _ClassVar[int]
    SCHEMA_VERSION_FIELD_NUMBER: _ClassVar[int]
    batches: _containers.RepeatedScalarFieldContainer[bytes]
    next_offset: int
    start_offset: int
    end_offset: int
    count: int
    stored_schema: bytes
    schema_version: int
    def __init__(self, batches: _Optional[_Iterable[bytes]] = ..., next_offset: _Optional[int] = ..., start_offset: _Optional[int] = ..., end_offset: _Optional[int] = ..., count: _Optional[int] = ..., stored_schema: _Optional[bytes] = ..., schema_version: _Optional[int] = ...) -> None: ...

class OffsetForTimestampRequest(_message.Message):
    __slots__ = ("stream", "timestamp_ms")
    STREAM_FIELD_NUMBER: _ClassVar[int]
    TIMESTAMP_MS_FIELD_NUMBER: _ClassVar[int]
    stream: str
    timestamp_ms: int
    def __init__(self, stream: _Optional[str] = ..., timestamp_ms: _Optional[int] = ...) -> None: ...

class OffsetForTimestampResponse(_message.Message):
    __slots__ = ("offset",)
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    offset: int
    def __init__(self, offset: _Optional[int] = ...) -> None: ...

class EndOffsetsRequest(_message.Message):
    __slots__ = ("streams", "pattern")
    STREAMS_FIELD_NUMBER: _ClassVar[int]
    PATTERN_FIELD_NUMBER: _ClassVar[int]
    streams: _containers.RepeatedScalarFieldContainer[str]
    pattern: str
    def __init__(self, streams: _Optional[_Iterable[str]] = ..., pattern: _Optional[str] = ...) -> None: ...

class StreamOffsets(_message.Message):
    __slots__ = ("stream", "start_offset", "end_offset")
    STREAM_FIELD_NUMBER: _ClassVar[int]
    START_OFFSET_FIELD_NUMBER: _ClassVar[int]
    END_OFFSET_FIELD_NUMBER: _ClassVar[int]
    stream: str
    start_offset: int
    end_offset: int
    def __init__(self, stream: _Optional[str] = ..., start_offset: _Optional[int] = ..., end_offset: _Optional[int] = ...) -> None: ...

class EndOffsetsResponse(_message.Message):
    __slots__ = ("streams",)
    STREAMS_FIELD_NUMBER: _ClassVar[int]
    streams: _containers.RepeatedCompositeFieldContainer[StreamOffsets]
    def __init__(self, streams: _Optional[_Iterable[_Union[StreamOffsets, _Mapping]]] = ...) -> None: ...

class SegmentSpan(_message.Message):
    __slots__ = ("path", "position", "end_position", "device", "inode")
    PATH_FIELD_NUMBER: _ClassVar[int]
    POSITION_FIELD_NUMBER: _ClassVar[int]
    END_POSITION_FIELD_NUMBER: _ClassVar[int]
    DEVICE_FIELD_NUMBER: _ClassVar[int]
    INODE_FIELD_NUMBER: _ClassVar[int]
    path: str
    position: int
    end_position: int
    device: int
    inode: int
    def __init__(self, path: _Optional[str] = ..., position: _Optional[int] = ..., end_position: _Optional[int] = ..., device: _Optional[int] = ..., inode: _Optional[int] = ...) -> None: ...

class LocateResponse(_message.Message):
    __slots__ = ("spans", "next_offset", "start_offset", "end_offset", "host_id", "value_schemas")
    SPANS_FIELD_NUMBER: _ClassVar[int]
    NEXT_OFFSET_FIELD_NUMBER: _ClassVar[int]
    START_OFFSET_FIELD_NUMBER: _ClassVar[int]
    END_OFFSET_FIELD_NUMBER: _ClassVar[int]
    HOST_ID_FIELD_NUMBER: _ClassVar[int]
    VALUE_SCHEMAS_FIELD_NUMBER: _ClassVar[int]
    spans: _containers.RepeatedCompositeFieldContainer[SegmentSpan]
    next_offset: int
    start_offset: int
    end_offset: int
    host_id: str
    value_schemas: _containers.RepeatedCompositeFieldContainer[ValueSchema]
    def __init__(self, spans: _Optional[_Iterable[_Union[SegmentSpan, _Mapping]]] = ..., next_offset: _Optional[int] = ..., start_offset: _Optional[int] = ..., end_offset: _Optional[int] = ..., host_id: _Optional[str] = ..., value_schemas: _Optional[_Iterable[_Union[ValueSchema, _Mapping]]] = ...) -> None: ...

class StartFrom(_message.Message):
    __slots__ = ("earliest", "latest", "offset", "timestamp_ms")
    EARLIEST_FIELD_NUMBER: _ClassVar[int]
    LATEST_FIELD_NUMBER: _ClassVar[int]
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    TIMESTAMP_MS_FIELD_NUMBER: _ClassVar[int]
    earliest: bool
    latest: bool
    offset: int
    timestamp_ms: int
    def __init__(self, earliest: _Optional[bool] = ..., latest: _Optional[bool] = ..., offset: _Optional[int] = ..., timestamp_ms: _Optional[int] = ...) -> None: ...

class GroupPosition(_message.Message):
    __slots__ = ("stream", "group", "committed_offset")
    STREAM_FIELD_NUMBER: _ClassVar[int]
    GROUP_FIELD_NUMBER: _ClassVar[int]
    COMMITTED_OFFSET_FIELD_NUMBER: _ClassVar[int]
    stream: str
    group: str
    committed_offset: int
    def __init__(self, stream: _Optional[str] = ..., group: _Optional[str] = ..., committed_offset: _Optional[int] = ...) -> None: ...

class OpenConsumerRequest(_message.Message):
    __slots__ = ("stream", "group", "start_from")
    STREAM_FIELD_NUMBER: _ClassVar[int]
    GROUP_FIELD_NUMBER: _ClassVar[int]
    START_FROM_FIELD_NUMBER: _ClassVar[int]
    stream: str
    group: str
    start_from: StartFrom
    def __init__(self, stream: _Optional[str] = ..., group: _Optional[str] = ..., start_from: _Optional[_Union[StartFrom, _Mapping]] = ...) -> None: ...

class OpenConsumerResponse(_message.Message):
    __slots__ = ("position", "created", "start_from_ignored")
    POSITION_FIELD_NUMBER: _ClassVar[int]
    CREATED_FIELD_NUMBER: _ClassVar[int]
    START_FROM_IGNORED_FIELD_NUMBER: _ClassVar[int]
    position: GroupPosition
    created: bool
    start_from_ignored: bool
    def __init__(self, position: _Optional[_Union[GroupPosition, _Mapping]] = ..., created: _Optional[bool] = ..., start_from_ignored: _Optional[bool] = ...) -> None: ...

class PullRequest(_message.Message):
    __slots__ = ("stream", "group", "limit", "wait_ms", "auto_commit")
    STREAM_FIELD_NUMBER: _ClassVar[int]
    GROUP_FIELD_NUMBER: _ClassVar[int]
    LIMIT_FIELD_NUMBER: _ClassVar[int]
    WAIT_MS_FIELD_NUMBER: _ClassVar[int]
    AUTO_COMMIT_FIELD_NUMBER: _ClassVar[int]
    stream: str
    group: str
    limit: int
    wait_ms: int
    auto_commit: bool
    def __init__(self, stream: _Optional[str] = ..., group: _Optional[str] = ..., limit: _Optional[int] = ..., wait_ms: _Optional[int] = ..., auto_commit: _Optional[bool] = ...) -> None: ...

class PullResponse(_message.Message):
    __slots__ = ("batches", "count", "next_offset")
    BATCHES_FIELD_NUMBER: _ClassVar[int]
    COUNT_FIELD_NUMBER: _ClassVar[int]
    NEXT_OFFSET_FIELD_NUMBER: _ClassVar[int]
    batches: _containers.RepeatedScalarFieldContainer[bytes]
    count: int
    next_offset: int
    def __init__(self, batches: _Optional[_Iterable[bytes]] = ..., count: _Optional[int] = ..., next_offset: _Optional[int] = ...) -> None: ...

class CommitRequest(_message.Message):
    __slots__ = ("stream", "group", "offset", "next_offset")
    STREAM_FIELD_NUMBER: _ClassVar[int]
    GROUP_FIELD_NUMBER: _ClassVar[int]
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    NEXT_OFFSET_FIELD_NUMBER: _ClassVar[int]
    stream: str
    group: str
    offset: int
    next_offset: int
    def __init__(self, stream: _Optional[str] = ..., group: _Optional[str] = ..., offset: _Optional[int] = ..., next_offset: _Optional[int] = ...) -> None: ...

class CommitResponse(_message.Message):
    __slots__ = ("position",)
    POSITION_FIELD_NUMBER: _ClassVar[int]
    position: GroupPosition
    def __init__(self, position: _Optional[_Union[GroupPosition, _Mapping]] = ...) -> None: ...

class SeekRequest(_message.Message):
    __slots__ = ("stream", "group", "to")
    STREAM_FIELD_NUMBER: _ClassVar[int]
    GROUP_FIELD_NUMBER: _ClassVar[int]
    TO_FIELD_NUMBER: _ClassVar[int]
    stream: str
    group: str
    to: StartFrom
    def __init__(self, stream: _Optional[str] = ..., group: _Optional[str] = ..., to: _Optional[_Union[StartFrom, _Mapping]] = ...) -> None: ...

class SeekResponse(_message.Message):
    __slots__ = ("position", "clamped_to_start", "clamped_to_end")
    POSITION_FIELD_NUMBER: _ClassVar[int]
    CLAMPED_TO_START_FIELD_NUMBER: _ClassVar[int]
    CLAMPED_TO_END_FIELD_NUMBER: _ClassVar[int]
    position: GroupPosition
    clamped_to_start: bool
    clamped_to_end: bool
    def __init__(self, position: _Optional[_Union[GroupPosition, _Mapping]] = ..., clamped_to_start: _Optional[bool] = ..., clamped_to_end: _Optional[bool] = ...) -> None: ...

class ListGroupsRequest(_message.Message):
    __slots__ = ("stream",)
    STREAM_FIELD_NUMBER: _ClassVar[int]
    stream: str
    def __init__(self, stream: _Optional[str] = ...) -> None: ...

class ListGroupsResponse(_message.Message):
    __slots__ = ("groups",)
    GROUPS_FIELD_NUMBER: _ClassVar[int]
    groups: _containers.RepeatedCompositeFieldContainer[GroupInfo]
    def __init__(self, groups: _Optional[_Iterable[_Union[GroupInfo, _Mapping]]] = ...) -> None: ...

class DescribeGroupRequest(_message.Message):
    __slots__ = ("stream", "group")
    STREAM_FIELD_NUMBER: _ClassVar[int]
    GROUP_FIELD_NUMBER: _ClassVar[int]
    stream: str
    group: str
    def __init__(self, stream: _Optional[str] = ..., group: _Optional[str] = ...) -> None: ...

class GroupMember(_message.Message):
    __slots__ = ("member_id", "last_seen_ms", "in_flight")
    MEMBER_ID_FIELD_NUMBER: _ClassVar[int]
    LAST_SEEN_MS_FIELD_NUMBER: _ClassVar[int]
    IN_FLIGHT_FIELD_NUMBER: _ClassVar[int]
    member_id: str
    last_seen_ms: int
    in_flight: int
    def __init__(self, member_id: _Optional[str] = ..., last_seen_ms: _Optional[int] = ..., in_flight: _Optional[int] = ...) -> None: ...

class GroupInfo(_message.Message):
    __slots__ = ("stream", "group", "committed_offset", "lag", "members", "in_flight", "dead_lettered", "kind", "shared_config", "removed_unread")
    STREAM_FIELD_NUMBER: _ClassVar[int]
    GROUP_FIELD_NUMBER: _ClassVar[int]
    COMMITTED_OFFSET_FIELD_NUMBER: _ClassVar[int]
    LAG_FIELD_NUMBER: _ClassVar[int]
    MEMBERS_FIELD_NUMBER: _ClassVar[int]
    IN_FLIGHT_FIELD_NUMBER: _ClassVar[int]
    DEAD_LETTERED_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    SHARED_CONFIG_FIELD_NUMBER: _ClassVar[int]
    REMOVED_UNREAD_FIELD_NUMBER: _ClassVar[int]
    stream: str
    group: str
    committed_offset: int
    lag: int
    members: _containers.RepeatedCompositeFieldContainer[GroupMember]
    in_flight: int
    dead_lettered: int
    kind: str
    shared_config: SharedGroupConfig
    removed_unread: OffsetRange
    def __init__(self, stream: _Optional[str] = ..., group: _Optional[str] = ..., committed_offset: _Optional[int] = ..., lag: _Optional[int] = ..., members: _Optional[_Iterable[_Union[GroupMember, _Mapping]]] = ..., in_flight: _Optional[int] = ..., dead_lettered: _Optional[int] = ..., kind: _Optional[str] = ..., shared_config: _Optional[_Union[SharedGroupConfig, _Mapping]] = ..., removed_unread: _Optional[_Union[OffsetRange, _Mapping]] = ...) -> None: ...

class DeleteGroupRequest(_message.Message):
    __slots__ = ("stream", "group")
    STREAM_FIELD_NUMBER: _ClassVar[int]
    GROUP_FIELD_NUMBER: _ClassVar[int]
    stream: str
    group: str
    def __init__(self, stream: _Optional[str] = ..., group: _Optional[str] = ...) -> None: ...

class DeleteGroupResponse(_message.Message):
    __slots__ = ("deleted",)
    DELETED_FIELD_NUMBER: _ClassVar[int]
    deleted: bool
    def __init__(self, deleted: _Optional[bool] = ...) -> None: ...

class SharedGroupConfig(_message.Message):
    __slots__ = ("ack_wait_ms", "max_deliver", "backoff_ms", "dead_letter_stream", "start_from", "ordering")
    ACK_WAIT_MS_FIELD_NUMBER: _ClassVar[int]
    MAX_DELIVER_FIELD_NUMBER: _ClassVar[int]
    BACKOFF_MS_FIELD_NUMBER: _ClassVar[int]
    DEAD_LETTER_STREAM_FIELD_NUMBER: _ClassVar[int]
    START_FROM_FIELD_NUMBER: _ClassVar[int]
    ORDERING_FIELD_NUMBER: _ClassVar[int]
    ack_wait_ms: int
    max_deliver: int
    backoff_ms: _containers.RepeatedScalarFieldContainer[int]
    dead_letter_stream: str
    start_from: StartFrom
    ordering: Ordering
    def __init__(self, ack_wait_ms: _Optional[int] = ..., max_deliver: _Optional[int] = ..., backoff_ms: _Optional[_Iterable[int]] = ..., dead_letter_stream: _Optional[str] = ..., start_from: _Optional[_Union[StartFrom, _Mapping]] = ..., ordering: _Optional[_Union[Ordering, str]] = ...) -> None: ...

class ReceiveRequest(_message.Message):
    __slots__ = ("stream", "group", "member_id", "max_messages", "wait_ms", "config", "ack_ranges")
    STREAM_FIELD_NUMBER: _ClassVar[int]
    GROUP_FIELD_NUMBER: _ClassVar[int]
    MEMBER_ID_FIELD_NUMBER: _ClassVar[int]
    MAX_MESSAGES_FIELD_NUMBER: _ClassVar[int]
    WAIT_MS_FIELD_NUMBER: _ClassVar[int]
    CONFIG_FIELD_NUMBER: _ClassVar[int]
    ACK_RANGES_FIELD_NUMBER: _ClassVar[int]
    stream: str
    group: str
    member_id: str
    max_messages: int
    wait_ms: int
    config: SharedGroupConfig
    ack_ranges: _containers.RepeatedCompositeFieldContainer[OffsetRange]
    def __init__(self, stream: _Optional[str] = ..., group: _Optional[str] = ..., member_id: _Optional[str] = ..., max_messages: _Optional[int] = ..., wait_ms: _Optional[int] = ..., config: _Optional[_Union[SharedGroupConfig, _Mapping]] = ..., ack_ranges: _Optional[_Iterable[_Union[OffsetRange, _Mapping]]] = ...) -> None: ...

class Delivery(_message.Message):
    __slots__ = ("offset", "id", "key", "value", "headers", "timestamp_ms", "attempt", "lease_expires_ms")
    class HeadersEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: bytes
        def __init__(self, key: _Optional[str] = ..., value: _Optional[bytes] = ...) -> None: ...
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    ID_FIELD_NUMBER: _ClassVar[int]
    KEY_FIELD_NUMBER: _ClassVar[int]
    VALUE_FIELD_NUMBER: _ClassVar[int]
    HEADERS_FIELD_NUMBER: _ClassVar[int]
    TIMESTAMP_MS_FIELD_NUMBER: _ClassVar[int]
    ATTEMPT_FIELD_NUMBER: _ClassVar[int]
    LEASE_EXPIRES_MS_FIELD_NUMBER: _ClassVar[int]
    offset: int
    id: str
    key: bytes
    value: bytes
    headers: _containers.ScalarMap[str, bytes]
    timestamp_ms: int
    attempt: int
    lease_expires_ms: int
    def __init__(self, offset: _Optional[int] = ..., id: _Optional[str] = ..., key: _Optional[bytes] = ..., value: _Optional[bytes] = ..., headers: _Optional[_Mapping[str, bytes]] = ..., timestamp_ms: _Optional[int] = ..., attempt: _Optional[int] = ..., lease_expires_ms: _Optional[int] = ...) -> None: ...

class ReceiveResponse(_message.Message):
    __slots__ = ("deliveries",)
    DELIVERIES_FIELD_NUMBER: _ClassVar[int]
    deliveries: _containers.RepeatedCompositeFieldContainer[Delivery]
    def __init__(self, deliveries: _Optional[_Iterable[_Union[Delivery, _Mapping]]] = ...) -> None: ...

class ReceiveBatchResponse(_message.Message):
    __slots__ = ("arrow_stream", "count")
    ARROW_STREAM_FIELD_NUMBER: _ClassVar[int]
    COUNT_FIELD_NUMBER: _ClassVar[int]
    arrow_stream: bytes
    count: int
    def __init__(self, arrow_stream: _Optional[bytes] = ..., count: _Optional[int] = ...) -> None: ...

class OffsetRange(_message.Message):
    __slots__ = ("start", "end")
    START_FIELD_NUMBER: _ClassVar[int]
    END_FIELD_NUMBER: _ClassVar[int]
    start: int
    end: int
    def __init__(self, start: _Optional[int] = ..., end: _Optional[int] = ...) -> None: ...

class AckRequest(_message.Message):
    __slots__ = ("stream", "group", "offsets", "member_id", "ranges")
    STREAM_FIELD_NUMBER: _ClassVar[int]
    GROUP_FIELD_NUMBER: _ClassVar[int]
    OFFSETS_FIELD_NUMBER: _ClassVar[int]
    MEMBER_ID_FIELD_NUMBER: _ClassVar[int]
    RANGES_FIELD_NUMBER: _ClassVar[int]
    stream: str
    group: str
    offsets: _containers.RepeatedScalarFieldContainer[int]
    member_id: str
    ranges: _containers.RepeatedCompositeFieldContainer[OffsetRange]
    def __init__(self, stream: _Optional[str] = ..., group: _Optional[str] = ..., offsets: _Optional[_Iterable[int]] = ..., member_id: _Optional[str] = ..., ranges: _Optional[_Iterable[_Union[OffsetRange, _Mapping]]] = ...) -> None: ...

class AckResponse(_message.Message):
    __slots__ = ("acked", "position")
    ACKED_FIELD_NUMBER: _ClassVar[int]
    POSITION_FIELD_NUMBER: _ClassVar[int]
    acked: int
    position: GroupPosition
    def __init__(self, acked: _Optional[int] = ..., position: _Optional[_Union[GroupPosition, _Mapping]] = ...) -> None: ...

class NackRequest(_message.Message):
    __slots__ = ("stream", "group", "offsets", "delay_ms", "member_id", "ranges")
    STREAM_FIELD_NUMBER: _ClassVar[int]
    GROUP_FIELD_NUMBER: _ClassVar[int]
    OFFSETS_FIELD_NUMBER: _ClassVar[int]
    DELAY_MS_FIELD_NUMBER: _ClassVar[int]
    MEMBER_ID_FIELD_NUMBER: _ClassVar[int]
    RANGES_FIELD_NUMBER: _ClassVar[int]
    stream: str
    group: str
    offsets: _containers.RepeatedScalarFieldContainer[int]
    delay_ms: int
    member_id: str
    ranges: _containers.RepeatedCompositeFieldContainer[OffsetRange]
    def __init__(self, stream: _Optional[str] = ..., group: _Optional[str] = ..., offsets: _Optional[_Iterable[int]] = ..., delay_ms: _Optional[int] = ..., member_id: _Optional[str] = ..., ranges: _Optional[_Iterable[_Union[OffsetRange, _Mapping]]] = ...) -> None: ...

class NackResponse(_message.Message):
    __slots__ = ("nacked",)
    NACKED_FIELD_NUMBER: _ClassVar[int]
    nacked: int
    def __init__(self, nacked: _Optional[int] = ...) -> None: ...

class SubscribeRequest(_message.Message):
    __slots__ = ("open", "credits", "ack_offsets", "nack_offsets", "nack_delay_ms", "ack_ranges", "nack_ranges")
    class Open(_message.Message):
        __slots__ = ("stream", "group", "member_id", "config", "arrow_deliveries")
        STREAM_FIELD_NUMBER: _ClassVar[int]
        GROUP_FIELD_NUMBER: _ClassVar[int]
        MEMBER_ID_FIELD_NUMBER: _ClassVar[int]
        CONFIG_FIELD_NUMBER: _ClassVar[int]
        ARROW_DELIVERIES_FIELD_NUMBER: _ClassVar[int]
        stream: str
        group: str
        member_id: str
        config: SharedGroupConfig
        arrow_deliveries: bool
        def __init__(self, stream: _Optional[str] = ..., group: _Optional[str] = ..., member_id: _Optional[str] = ..., config: _Optional[_Union[SharedGroupConfig, _Mapping]] = ..., arrow_deliveries: _Optional[bool] = ...) -> None: ...
    OPEN_FIELD_NUMBER: _ClassVar[int]
    CREDITS_FIELD_NUMBER: _ClassVar[int]
    ACK_OFFSETS_FIELD_NUMBER: _ClassVar[int]
    NACK_OFFSETS_FIELD_NUMBER: _ClassVar[int]
    NACK_DELAY_MS_FIELD_NUMBER: _ClassVar[int]
    ACK_RANGES_FIELD_NUMBER: _ClassVar[int]
    NACK_RANGES_FIELD_NUMBER: _ClassVar[int]
    open: SubscribeRequest.Open
    credits: int
    ack_offsets: _containers.RepeatedScalarFieldContainer[int]
    nack_offsets: _containers.RepeatedScalarFieldContainer[int]
    nack_delay_ms: int
    ack_ranges: _containers.RepeatedCompositeFieldContainer[OffsetRange]
    nack_ranges: _containers.RepeatedCompositeFieldContainer[OffsetRange]
    def __init__(self, open: _Optional[_Union[SubscribeRequest.Open, _Mapping]] = ..., credits: _Optional[int] = ..., ack_offsets: _Optional[_Iterable[int]] = ..., nack_offsets: _Optional[_Iterable[int]] = ..., nack_delay_ms: _Optional[int] = ..., ack_ranges: _Optional[_Iterable[_Union[OffsetRange, _Mapping]]] = ..., nack_ranges: _Optional[_Iterable[_Union[OffsetRange, _Mapping]]] = ...) -> None: ...

class DeliveryBatch(_message.Message):
    __slots__ = ("deliveries", "arrow_stream", "count")
    DELIVERIES_FIELD_NUMBER: _ClassVar[int]
    ARROW_STREAM_FIELD_NUMBER: _ClassVar[int]
    COUNT_FIELD_NUMBER: _ClassVar[int]
    deliveries: _containers.RepeatedCompositeFieldContainer[Delivery]
    arrow_stream: bytes
    count: int
    def __init__(self, deliveries: _Optional[_Iterable[_Union[Delivery, _Mapping]]] = ..., arrow_stream: _Optional[bytes] = ..., count: _Optional[int] = ...) -> None: ...

class StageRequest(_message.Message):
    __slots__ = ("sink_id", "batch_id", "staging_id", "stream", "arrow_stream", "inbox_file", "inbox_inode", "inbox_length")
    SINK_ID_FIELD_NUMBER: _ClassVar[int]
    BATCH_ID_FIELD_NUMBER: _ClassVar[int]
    STAGING_ID_FIELD_NUMBER: _ClassVar[int]
    STREAM_FIELD_NUMBER: _ClassVar[int]
    ARROW_STREAM_FIELD_NUMBER: _ClassVar[int]
    INBOX_FILE_FIELD_NUMBER: _ClassVar[int]
    INBOX_INODE_FIELD_NUMBER: _ClassVar[int]
    INBOX_LENGTH_FIELD_NUMBER: _ClassVar[int]
    sink_id: str
    batch_id: int
    staging_id: str
    stream: str
    arrow_stream: bytes
    inbox_file: str
    inbox_inode: int
    inbox_length: int
    def __init__(self, sink_id: _Optional[str] = ..., batch_id: _Optional[int] = ..., staging_id: _Optional[str] = ..., stream: _Optional[str] = ..., arrow_stream: _Optional[bytes] = ..., inbox_file: _Optional[str] = ..., inbox_inode: _Optional[int] = ..., inbox_length: _Optional[int] = ...) -> None: ...

class StageResponse(_message.Message):
    __slots__ = ("staged_rows", "staged_bytes", "inbox_refused")
    STAGED_ROWS_FIELD_NUMBER: _ClassVar[int]
    STAGED_BYTES_FIELD_NUMBER: _ClassVar[int]
    INBOX_REFUSED_FIELD_NUMBER: _ClassVar[int]
    staged_rows: int
    staged_bytes: int
    inbox_refused: str
    def __init__(self, staged_rows: _Optional[int] = ..., staged_bytes: _Optional[int] = ..., inbox_refused: _Optional[str] = ...) -> None: ...

class StageInboxRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class StageInboxResponse(_message.Message):
    __slots__ = ("host_id", "path", "device", "inode")
    HOST_ID_FIELD_NUMBER: _ClassVar[int]
    PATH_FIELD_NUMBER: _ClassVar[int]
    DEVICE_FIELD_NUMBER: _ClassVar[int]
    INODE_FIELD_NUMBER: _ClassVar[int]
    host_id: str
    path: str
    device: int
    inode: int
    def __init__(self, host_id: _Optional[str] = ..., path: _Optional[str] = ..., device: _Optional[int] = ..., inode: _Optional[int] = ...) -> None: ...

class CommitBatchRequest(_message.Message):
    __slots__ = ("sink_id", "batch_id", "staging_ids")
    SINK_ID_FIELD_NUMBER: _ClassVar[int]
    BATCH_ID_FIELD_NUMBER: _ClassVar[int]
    STAGING_IDS_FIELD_NUMBER: _ClassVar[int]
    sink_id: str
    batch_id: int
    staging_ids: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, sink_id: _Optional[str] = ..., batch_id: _Optional[int] = ..., staging_ids: _Optional[_Iterable[str]] = ...) -> None: ...

class CommitBatchResponse(_message.Message):
    __slots__ = ("already_committed", "written")
    ALREADY_COMMITTED_FIELD_NUMBER: _ClassVar[int]
    WRITTEN_FIELD_NUMBER: _ClassVar[int]
    already_committed: bool
    written: _containers.RepeatedCompositeFieldContainer[StreamOffsets]
    def __init__(self, already_committed: _Optional[bool] = ..., written: _Optional[_Iterable[_Union[StreamOffsets, _Mapping]]] = ...) -> None: ...

class AbortBatchRequest(_message.Message):
    __slots__ = ("sink_id", "batch_id", "staging_ids")
    SINK_ID_FIELD_NUMBER: _ClassVar[int]
    BATCH_ID_FIELD_NUMBER: _ClassVar[int]
    STAGING_IDS_FIELD_NUMBER: _ClassVar[int]
    sink_id: str
    batch_id: int
    staging_ids: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, sink_id: _Optional[str] = ..., batch_id: _Optional[int] = ..., staging_ids: _Optional[_Iterable[str]] = ...) -> None: ...

class AbortBatchResponse(_message.Message):
    __slots__ = ("dropped",)
    DROPPED_FIELD_NUMBER: _ClassVar[int]
    dropped: int
    def __init__(self, dropped: _Optional[int] = ...) -> None: ...

class SinkStateRequest(_message.Message):
    __slots__ = ("sink_id",)
    SINK_ID_FIELD_NUMBER: _ClassVar[int]
    sink_id: str
    def __init__(self, sink_id: _Optional[str] = ...) -> None: ...

class SinkStateResponse(_message.Message):
    __slots__ = ("exists", "last_batch_id")
    EXISTS_FIELD_NUMBER: _ClassVar[int]
    LAST_BATCH_ID_FIELD_NUMBER: _ClassVar[int]
    exists: bool
    last_batch_id: int
    def __init__(self, exists: _Optional[bool] = ..., last_batch_id: _Optional[int] = ...) -> None: ...

class OwnersRequest(_message.Message):
    __slots__ = ("streams",)
    STREAMS_FIELD_NUMBER: _ClassVar[int]
    streams: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, streams: _Optional[_Iterable[str]] = ...) -> None: ...

class StreamOwner(_message.Message):
    __slots__ = ("stream", "owner", "exists")
    STREAM_FIELD_NUMBER: _ClassVar[int]
    OWNER_FIELD_NUMBER: _ClassVar[int]
    EXISTS_FIELD_NUMBER: _ClassVar[int]
    stream: str
    owner: str
    exists: bool
    def __init__(self, stream: _Optional[str] = ..., owner: _Optional[str] = ..., exists: _Optional[bool] = ...) -> None: ...

class OwnersResponse(_message.Message):
    __slots__ = ("owners", "self", "members")
    OWNERS_FIELD_NUMBER: _ClassVar[int]
    SELF_FIELD_NUMBER: _ClassVar[int]
    MEMBERS_FIELD_NUMBER: _ClassVar[int]
    owners: _containers.RepeatedCompositeFieldContainer[StreamOwner]
    self: str
    members: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self_, owners: _Optional[_Iterable[_Union[StreamOwner, _Mapping]]] = ..., self: _Optional[str] = ..., members: _Optional[_Iterable[str]] = ...) -> None: ...

class MoveStreamRequest(_message.Message):
    __slots__ = ("stream", "to")
    STREAM_FIELD_NUMBER: _ClassVar[int]
    TO_FIELD_NUMBER: _ClassVar[int]
    stream: str
    to: str
    def __init__(self, stream: _Optional[str] = ..., to: _Optional[str] = ...) -> None: ...

class MoveStreamResponse(_message.Message):
    __slots__ = ("stream", "source", "target", "end_offset", "groups", "bytes", "already_there", "paused_ms", "dead_letter_streams")
    STREAM_FIELD_NUMBER: _ClassVar[int]
    SOURCE_FIELD_NUMBER: _ClassVar[int]
    TARGET_FIELD_NUMBER: _ClassVar[int]
    END_OFFSET_FIELD_NUMBER: _ClassVar[int]
    GROUPS_FIELD_NUMBER: _ClassVar[int]
    BYTES_FIELD_NUMBER: _ClassVar[int]
    ALREADY_THERE_FIELD_NUMBER: _ClassVar[int]
    PAUSED_MS_FIELD_NUMBER: _ClassVar[int]
    DEAD_LETTER_STREAMS_FIELD_NUMBER: _ClassVar[int]
    stream: str
    source: str
    target: str
    end_offset: int
    groups: int
    bytes: int
    already_there: bool
    paused_ms: int
    dead_letter_streams: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, stream: _Optional[str] = ..., source: _Optional[str] = ..., target: _Optional[str] = ..., end_offset: _Optional[int] = ..., groups: _Optional[int] = ..., bytes: _Optional[int] = ..., already_there: _Optional[bool] = ..., paused_ms: _Optional[int] = ..., dead_letter_streams: _Optional[_Iterable[str]] = ...) -> None: ...

class MoveInRequest(_message.Message):
    __slots__ = ("stream", "move_id", "source", "step", "file", "position", "data", "state_json")
    STREAM_FIELD_NUMBER: _ClassVar[int]
    MOVE_ID_FIELD_NUMBER: _ClassVar[int]
    SOURCE_FIELD_NUMBER: _ClassVar[int]
    STEP_FIELD_NUMBER: _ClassVar[int]
    FILE_FIELD_NUMBER: _ClassVar[int]
    POSITION_FIELD_NUMBER: _ClassVar[int]
    DATA_FIELD_NUMBER: _ClassVar[int]
    STATE_JSON_FIELD_NUMBER: _ClassVar[int]
    stream: str
    move_id: str
    source: str
    step: MoveStep
    file: str
    position: int
    data: bytes
    state_json: bytes
    def __init__(self, stream: _Optional[str] = ..., move_id: _Optional[str] = ..., source: _Optional[str] = ..., step: _Optional[_Union[MoveStep, str]] = ..., file: _Optional[str] = ..., position: _Optional[int] = ..., data: _Optional[bytes] = ..., state_json: _Optional[bytes] = ...) -> None: ...

class MoveInResponse(_message.Message):
    __slots__ = ("installed",)
    INSTALLED_FIELD_NUMBER: _ClassVar[int]
    installed: bool
    def __init__(self, installed: _Optional[bool] = ...) -> None: ...
