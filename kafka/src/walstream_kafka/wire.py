"""Kafka's framing and the versions this listener speaks, on kio (Aiven's Kafka protocol
library: requests and responses generated from Kafka's own JSON schemas, parsed natively).

A request is ``int32 length`` + request header + body; the answer is ``int32 length`` + response
header + body, with the same correlation id. Handlers describe an answer as a plain tree of dicts
and lists (:func:`build`); the fields a version lacks are dropped and the ones a handler leaves
out take Kafka's defaults, so one handler serves every supported version of its API.

:data:`SUPPORTED` is the version range of each API key (the ``ApiVersions`` answer and the
compatibility ledger, docs/reference/kafka-compatibility.md). A request outside it is answered
``UNSUPPORTED_VERSION`` when it is ``ApiVersions`` (the client then retries with a version
listed), and closes the connection otherwise, as Kafka's own brokers do.
"""

from __future__ import annotations

import datetime
import enum
import functools
import io
import struct
import types
import typing
import uuid
from collections.abc import Callable, Mapping
from dataclasses import MISSING, fields, is_dataclass
from typing import Any

from kio.index import load_request_schema, load_response_schema
from kio.serial import entity_reader, entity_writer

__all__ = [
    "API_NAMES",
    "SUPPORTED",
    "DecodedRequest",
    "UnsupportedRequest",
    "build",
    "decode_request",
    "encode_response",
    "peek_header",
]

#: API key → (lowest, highest) version served. Produce starts at 3 (record batches, magic 2);
#: Fetch stops at 12 and Metadata at 12 (later versions name topics by id only).
SUPPORTED: dict[int, tuple[int, int]] = {
    0: (3, 9),  # Produce
    1: (4, 12),  # Fetch
    2: (1, 7),  # ListOffsets
    3: (1, 12),  # Metadata
    8: (2, 8),  # OffsetCommit
    9: (1, 7),  # OffsetFetch
    10: (0, 4),  # FindCoordinator
    11: (0, 7),  # JoinGroup
    12: (0, 4),  # Heartbeat
    13: (0, 4),  # LeaveGroup
    14: (0, 5),  # SyncGroup
    15: (0, 5),  # DescribeGroups
    16: (0, 4),  # ListGroups
    17: (1, 1),  # SaslHandshake (v0's unframed tokens are not served)
    18: (0, 3),  # ApiVersions
    19: (2, 7),  # CreateTopics
    20: (1, 6),  # DeleteTopics
    21: (0, 2),  # DeleteRecords
    22: (0, 4),  # InitProducerId
    32: (1, 4),  # DescribeConfigs
    33: (0, 2),  # AlterConfigs
    36: (0, 2),  # SaslAuthenticate
    37: (0, 3),  # CreatePartitions
    44: (0, 1),  # IncrementalAlterConfigs
}

API_NAMES: dict[int, str] = {
    0: "Produce",
    1: "Fetch",
    2: "ListOffsets",
    3: "Metadata",
    8: "OffsetCommit",
    9: "OffsetFetch",
    10: "FindCoordinator",
    11: "JoinGroup",
    12: "Heartbeat",
    13: "LeaveGroup",
    14: "SyncGroup",
    15: "DescribeGroups",
    16: "ListGroups",
    17: "SaslHandshake",
    18: "ApiVersions",
    19: "CreateTopics",
    20: "DeleteTopics",
    21: "DeleteRecords",
    22: "InitProducerId",
    32: "DescribeConfigs",
    33: "AlterConfigs",
    36: "SaslAuthenticate",
    37: "CreatePartitions",
    44: "IncrementalAlterConfigs",
}

API_VERSIONS_KEY = 18
_PREFIX = struct.Struct(">hhi")  # api key, api version, correlation id


class UnsupportedRequest(Exception):
    """A request of an API key or version this listener does not serve."""

    def __init__(self, api_key: int, api_version: int, correlation_id: int) -> None:
        name = API_NAMES.get(api_key, f"API key {api_key}")
        super().__init__(f"{name} v{api_version} is not supported")
        self.api_key = api_key
        self.api_version = api_version
        self.correlation_id = correlation_id


class DecodedRequest(typing.NamedTuple):
    api_key: int
    api_version: int
    correlation_id: int
    client_id: str | None
    body: Any


def peek_header(frame: bytes) -> tuple[int, int, int]:
    """(api key, api version, correlation id) of a request frame (ValueError when short)."""
    if len(frame) < _PREFIX.size:
        raise ValueError("a request shorter than its header")
    api_key, api_version, correlation_id = _PREFIX.unpack_from(frame)
    return api_key, api_version, correlation_id


@functools.cache
def _request_reader(api_key: int, api_version: int) -> tuple[Any, Any, Any]:
    request_type = load_request_schema(api_key, api_version)
    header_type = request_type.__header_schema__
    return entity_reader(header_type), entity_reader(request_type), request_type


def decode_request(frame: bytes) -> DecodedRequest:
    """The request in ``frame`` (without its length prefix). :class:`UnsupportedRequest` for a
    key or version outside :data:`SUPPORTED`; ValueError and kio's errors for malformed bytes."""
    api_key, api_version, correlation_id = peek_header(frame)
    served = SUPPORTED.get(api_key)
    if served is None or not served[0] <= api_version <= served[1]:
        raise UnsupportedRequest(api_key, api_version, correlation_id)
    read_header, read_body, _ = _request_reader(api_key, api_version)
    header, header_size = read_header(frame, 0)
    body, _body_size = read_body(frame, header_size)
    # Bytes after the body are ignored, as Kafka's brokers do: librdkafka 2.x sends three
    # after a Metadata v12 request for every topic (AdminClient.list_topics()).
    return DecodedRequest(api_key, api_version, correlation_id, header.client_id, body)


@functools.cache
def _response_type(api_key: int, api_version: int) -> Any:
    return load_response_schema(api_key, api_version)


@functools.cache
def _response_writer(response_type: Any) -> Callable[[Any, Any], None]:
    return typing.cast(Callable[[Any, Any], None], entity_writer(response_type))


def encode_response(
    api_key: int, api_version: int, correlation_id: int, tree: Mapping[str, Any]
) -> bytes:
    """The framed response ``tree`` (see :func:`build`) to a request of ``api_key`` v``api_version``."""
    response_type = _response_type(api_key, api_version)
    body = build(response_type, tree)
    buffer = io.BytesIO()
    buffer.write(b"\0\0\0\0")
    buffer.write(struct.pack(">i", correlation_id))
    # ApiVersions answers with header v0 at every version, so a client that sent a version the
    # broker does not know can still read the answer.
    if response_type.__flexible__ and api_key != API_VERSIONS_KEY:
        buffer.write(b"\0")  # no tagged fields in the response header
    _response_writer(response_type)(buffer, body)
    data = buffer.getbuffer()
    struct.pack_into(">i", data, 0, len(data) - 4)
    return bytes(data)


def encode_api_versions_error(correlation_id: int, error_code: int) -> bytes:
    """ApiVersions v0's answer ``error_code`` with every supported range (the answer to an
    ApiVersions request of a version this listener does not serve)."""
    return encode_response(
        API_VERSIONS_KEY,
        0,
        correlation_id,
        {
            "error_code": error_code,
            "api_keys": [
                {"api_key": key, "min_version": low, "max_version": high}
                for key, (low, high) in sorted(SUPPORTED.items())
            ],
        },
    )


# -- building kio entities from plain trees -----------------------------------------------------

_FieldSpec = tuple[str, Callable[[Any], Any] | None, Any, bool]


@functools.cache
def _specs(entity_type: type) -> tuple[_FieldSpec, ...]:
    hints = typing.get_type_hints(entity_type)
    specs: list[_FieldSpec] = []
    for field in fields(entity_type):
        hint = hints[field.name]
        convert = _converter(hint)
        if field.default is not MISSING or field.default_factory is not MISSING:
            default: Any = MISSING
        else:
            default = _zero(hint)
        nullable = _strip_optional(hint)[1]
        specs.append((field.name, convert, default, nullable))
    return tuple(specs)


def _strip_optional(hint: Any) -> tuple[Any, bool]:
    if isinstance(hint, types.UnionType) or typing.get_origin(hint) is typing.Union:
        arguments = [argument for argument in typing.get_args(hint) if argument is not type(None)]
        return arguments[0], True
    return hint, False


def _converter(hint: Any) -> Callable[[Any], Any] | None:
    inner, _ = _strip_optional(hint)
    if typing.get_origin(inner) is tuple:
        item = typing.get_args(inner)[0]
        if is_dataclass(item):
            return lambda values: tuple(
                value if not isinstance(value, Mapping) else build(item, value) for value in values
            )
        return tuple
    if is_dataclass(inner):
        return lambda value: value if not isinstance(value, Mapping) else build(inner, value)
    if isinstance(inner, type) and issubclass(inner, enum.Enum):
        return inner
    if isinstance(inner, type) and issubclass(inner, datetime.datetime):
        return lambda value: (
            value
            if isinstance(value, datetime.datetime)
            else None
            if value < 0
            else datetime.datetime.fromtimestamp(value / 1000, datetime.UTC)
        )
    if isinstance(inner, type) and issubclass(inner, datetime.timedelta):
        return lambda value: (
            value
            if isinstance(value, datetime.timedelta)
            else datetime.timedelta(milliseconds=value)
        )
    return None


def _zero(hint: Any) -> Any:
    inner, optional = _strip_optional(hint)
    if optional:
        return None
    if typing.get_origin(inner) is tuple:
        return ()
    if isinstance(inner, type):
        if issubclass(inner, bool):
            return False
        if issubclass(inner, enum.Enum):
            return inner(0)
        if issubclass(inner, datetime.timedelta):
            return datetime.timedelta(0)
        if issubclass(inner, int):
            return 0
        if issubclass(inner, str):
            return ""
        if issubclass(inner, bytes):
            return b""
        if issubclass(inner, uuid.UUID):
            return uuid.UUID(int=0)
        if is_dataclass(inner):
            return build(inner, {})
    raise TypeError(f"no default for a field of type {hint!r}")


def build(entity_type: Any, tree: Mapping[str, Any]) -> Any:
    """The kio entity ``entity_type`` from ``tree``: keys it lacks are dropped, fields ``tree``
    lacks take their schema default (or zero, empty, null), nested dicts and lists of dicts
    become the nested entities of that version."""
    arguments: dict[str, Any] = {}
    for name, convert, default, nullable in _specs(entity_type):
        value = tree.get(name)
        if value is None and not nullable:
            if default is not MISSING:
                arguments[name] = default
            continue
        if name in tree:
            if convert is not None and value is not None:
                value = convert(value)
            arguments[name] = value
        elif default is not MISSING:
            arguments[name] = default
    return entity_type(**arguments)
