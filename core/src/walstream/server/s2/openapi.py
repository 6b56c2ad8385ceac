"""The OpenAPI 3.1 document of what ``walstream serve`` implements of S2's REST API v1
(``GET /openapi.json``): the routes, their parameters, bodies and answers, as this server gives
them. Routes of S2 that walstream does not implement are absent (they answer 501 or 404).
"""

from __future__ import annotations

from typing import Any

from walstream.stream_config import MAX_AGE_S

__all__ = ["document"]

_U64 = {"type": "integer", "minimum": 0, "maximum": 2**64 - 1}
_I64 = {"type": "integer", "minimum": 0, "maximum": 2**63 - 1}


def _ref(name: str) -> dict[str, str]:
    return {"$ref": f"#/components/schemas/{name}"}


def _nullable(schema: dict[str, Any]) -> dict[str, Any]:
    return {"oneOf": [{"type": "null"}, schema]}


_SCHEMAS: dict[str, Any] = {
    "ErrorInfo": {
        "type": "object",
        "required": ["code", "message"],
        "properties": {"code": {"type": "string"}, "message": {"type": "string"}},
    },
    "AppendConditionFailed": {
        "oneOf": [
            {
                "type": "object",
                "required": ["seq_num_mismatch"],
                "properties": {"seq_num_mismatch": _U64},
            },
            {
                "type": "object",
                "required": ["fencing_token_mismatch"],
                "properties": {"fencing_token_mismatch": {"type": "string"}},
            },
        ]
    },
    "StreamPosition": {
        "type": "object",
        "required": ["seq_num", "timestamp"],
        "properties": {"seq_num": _U64, "timestamp": _U64},
    },
    "TailResponse": {
        "type": "object",
        "required": ["tail"],
        "properties": {"tail": _ref("StreamPosition")},
    },
    "Header": {"type": "array", "items": {"type": "string"}, "minItems": 2, "maxItems": 2},
    "AppendRecord": {
        "type": "object",
        "properties": {
            "body": {"type": "string"},
            "headers": {"type": "array", "items": _ref("Header")},
            "timestamp": _nullable(_U64),
        },
    },
    "AppendInput": {
        "type": "object",
        "required": ["records"],
        "properties": {
            "records": {
                "type": "array",
                "items": _ref("AppendRecord"),
                "minItems": 1,
                "maxItems": 1000,
            },
            "match_seq_num": _nullable(_U64),
            "fencing_token": _nullable({"type": "string", "maxLength": 36}),
        },
    },
    "AppendAck": {
        "type": "object",
        "required": ["start", "end", "tail"],
        "properties": {
            "start": _ref("StreamPosition"),
            "end": _ref("StreamPosition"),
            "tail": _ref("StreamPosition"),
        },
    },
    "SequencedRecord": {
        "type": "object",
        "required": ["seq_num", "timestamp", "headers", "body"],
        "properties": {
            "seq_num": _U64,
            "timestamp": _U64,
            "headers": {"type": "array", "items": _ref("Header")},
            "body": {"type": "string"},
        },
    },
    "ReadBatch": {
        "type": "object",
        "required": ["records"],
        "properties": {
            "records": {"type": "array", "items": _ref("SequencedRecord")},
            "tail": _ref("StreamPosition"),
        },
    },
    "StreamConfig": {
        "type": "object",
        "description": "A stream's configuration (docs/guides/lifecycle.md); in a "
        "reconfiguration, fields left out keep their value and a null field returns to S2's "
        "default",
        "properties": {
            "storage_class": _nullable({"type": "string", "enum": ["standard", "express"]}),
            "retention_policy": _nullable(
                {
                    "oneOf": [
                        {
                            "type": "object",
                            "required": ["age"],
                            "properties": {
                                "age": {"type": "integer", "minimum": 1, "maximum": MAX_AGE_S}
                            },
                        },
                        {
                            "type": "object",
                            "required": ["infinite"],
                            "properties": {"infinite": {"type": "object"}},
                        },
                    ]
                }
            ),
            "timestamping": _nullable(
                {
                    "type": "object",
                    "properties": {
                        "mode": _nullable(
                            {
                                "type": "string",
                                "enum": ["client-prefer", "client-require", "arrival"],
                            }
                        ),
                        "uncapped": {"type": ["boolean", "null"]},
                    },
                }
            ),
            "delete_on_empty": _nullable(
                {
                    "type": "object",
                    "properties": {
                        "min_age_secs": {"type": "integer", "minimum": 0, "maximum": MAX_AGE_S}
                    },
                }
            ),
        },
    },
    "EncryptionAlgorithm": {"type": "string", "enum": ["aegis-256", "aes-256-gcm"]},
    "BasinConfig": {
        "type": "object",
        "properties": {
            "create_stream_on_append": {"type": ["boolean", "null"]},
            "create_stream_on_read": {"type": ["boolean", "null"]},
            "default_stream_config": _nullable(_ref("StreamConfig")),
            "stream_cipher": _nullable(_ref("EncryptionAlgorithm")),
        },
    },
    "BasinReconfiguration": {
        "type": "object",
        "description": "Fields left out keep their value; stream_cipher null removes the cipher, "
        "default_stream_config null resets it; null flags are left as they are",
        "properties": {
            "create_stream_on_append": {"type": ["boolean", "null"]},
            "create_stream_on_read": {"type": ["boolean", "null"]},
            "default_stream_config": _nullable(_ref("StreamConfig")),
            "stream_cipher": _nullable(_ref("EncryptionAlgorithm")),
        },
    },
    "BasinInfo": {
        "type": "object",
        "required": ["name", "created_at"],
        "properties": {
            "name": {"type": "string"},
            "created_at": {"type": "string", "format": "date-time"},
            "deleted_at": {"type": ["string", "null"]},
            "scope": {"type": "null"},
        },
    },
    "ListBasinsResponse": {
        "type": "object",
        "required": ["basins", "has_more"],
        "properties": {
            "basins": {"type": "array", "items": _ref("BasinInfo")},
            "has_more": {"type": "boolean"},
        },
    },
    "CreateBasinRequest": {
        "type": "object",
        "required": ["basin"],
        "properties": {
            "basin": {"type": "string", "pattern": "^[a-z0-9][a-z0-9-]{6,46}[a-z0-9]$"},
            "config": _nullable(_ref("BasinConfig")),
        },
    },
    "EnsureBasinRequest": {
        "type": "object",
        "properties": {"config": _nullable(_ref("BasinConfig"))},
    },
    "StreamInfo": {
        "type": "object",
        "required": ["name", "created_at"],
        "properties": {
            "name": {"type": "string"},
            "created_at": {"type": "string", "format": "date-time"},
            "deleted_at": {"type": ["string", "null"]},
            "cipher": _nullable(_ref("EncryptionAlgorithm")),
        },
    },
    "ListStreamsResponse": {
        "type": "object",
        "required": ["streams", "has_more"],
        "properties": {
            "streams": {"type": "array", "items": _ref("StreamInfo")},
            "has_more": {"type": "boolean"},
        },
    },
    "CreateStreamRequest": {
        "type": "object",
        "required": ["stream"],
        "properties": {
            "stream": {
                "type": "string",
                "minLength": 1,
                "description": "1 to 512 bytes of UTF-8, not '.' or '..'",
            },
            "config": _nullable(_ref("StreamConfig")),
        },
    },
    "Health": {
        "type": "object",
        "required": ["status", "node_id", "node_epoch"],
        "properties": {
            "status": {"type": "string", "enum": ["ok", "failed", "stopping"]},
            "node_id": {"type": "integer"},
            "node_epoch": {"type": "integer"},
        },
    },
}

_ERROR_STATUSES = (
    "400",
    "401",
    "404",
    "405",
    "408",
    "409",
    "413",
    "415",
    "422",
    "429",
    "503",
)


def _json(schema: dict[str, Any]) -> dict[str, Any]:
    return {"application/json": {"schema": schema}}


def _answers(ok: dict[str, Any], *extra: tuple[str, dict[str, Any]]) -> dict[str, Any]:
    answers: dict[str, Any] = dict(ok)
    for status in _ERROR_STATUSES:
        answers[status] = {"description": "S2 error", "content": _json(_ref("ErrorInfo"))}
    for status, answer in extra:
        answers[status] = answer
    return answers


def _ok(status: str, schema: dict[str, Any] | None, description: str) -> dict[str, Any]:
    answer: dict[str, Any] = {"description": description}
    if schema is not None:
        answer["content"] = _json(schema)
    return {status: answer}


def _query(name: str, schema: dict[str, Any], description: str) -> dict[str, Any]:
    return {
        "name": name,
        "in": "query",
        "required": False,
        "schema": schema,
        "description": description,
    }


_BASIN_HEADER = {
    "name": "s2-basin",
    "in": "header",
    "required": True,
    "schema": {"type": "string"},
    "description": "The basin of the stream ('walstream' holds every walstream stream)",
}
_FORMAT_HEADER = {
    "name": "s2-format",
    "in": "header",
    "required": False,
    "schema": {"type": "string", "enum": ["raw", "base64"]},
    "description": "How bytes travel in JSON: UTF-8 text (raw, default) or base64",
}
_LIST = [
    _query("prefix", {"type": "string"}, "names starting with it"),
    _query("start_after", {"type": "string"}, "names sorting after it"),
    _query("limit", {"type": "integer", "minimum": 0, "maximum": 1000}, "at most (1000)"),
]
_BASIN_PATH = {"name": "basin", "in": "path", "required": True, "schema": {"type": "string"}}
_STREAM_PATH = {"name": "stream", "in": "path", "required": True, "schema": {"type": "string"}}
_PROVISION = {
    "s2-provision-result": {"schema": {"type": "string", "enum": ["created", "updated", "noop"]}}
}
_REQUEST_TOKEN = {
    "name": "s2-request-token",
    "in": "header",
    "required": False,
    "schema": {"type": "string", "maxLength": 36},
    "description": "makes the create idempotent: a retry with the same token and config "
    "answers 201 (s2-provision-result: noop) instead of 409",
}
_ENCRYPTION_KEY = {
    "name": "s2-encryption-key",
    "in": "header",
    "required": False,
    "schema": {"type": "string", "maxLength": 44},
    "description": "base64 of the 32-byte key of a stream with a cipher (never stored)",
}
_ENCRYPTION_CIPHER = {
    "name": "walstream-encryption-cipher",
    "in": "header",
    "required": False,
    "schema": _ref("EncryptionAlgorithm"),
    "description": "walstream's own: the cipher of the key, for a stream whose basin names "
    "no stream_cipher",
}
_CONTENT_ENCODING = {
    "name": "content-encoding",
    "in": "header",
    "required": False,
    "schema": {"type": "string", "enum": ["gzip", "zstd", "identity"]},
    "description": "a compressed body (bounded by the body limit once decompressed: 413)",
}
_ACCEPT_ENCODING = {
    "name": "accept-encoding",
    "in": "header",
    "required": False,
    "schema": {"type": "string"},
    "description": "gzip or zstd: answers (and S2S messages) of 1 KiB and more are compressed",
}
_LAST_EVENT_ID = {
    "name": "last-event-id",
    "in": "header",
    "required": False,
    "schema": {"type": "string", "pattern": "^[0-9]+,[0-9]+,[0-9]+$"},
    "description": "SSE: resume after this event id (<seq_num>,<count>,<bytes>)",
}


def _paths() -> dict[str, Any]:
    unwritten = (
        "416",
        {"description": "start past the tail", "content": _json(_ref("TailResponse"))},
    )
    condition = (
        "412",
        {"description": "append condition failed", "content": _json(_ref("AppendConditionFailed"))},
    )
    return {
        "/health": {
            "get": {
                "operationId": "health",
                "security": [],
                "responses": {
                    "200": {"description": "serving", "content": _json(_ref("Health"))},
                    "503": {"description": "failed or stopping", "content": _json(_ref("Health"))},
                },
            }
        },
        "/v1/basins": {
            "get": {
                "operationId": "list_basins",
                "parameters": _LIST,
                "responses": _answers(_ok("200", _ref("ListBasinsResponse"), "basins")),
            },
            "post": {
                "operationId": "create_basin",
                "parameters": [_REQUEST_TOKEN],
                "requestBody": {"required": True, "content": _json(_ref("CreateBasinRequest"))},
                "responses": _answers(_ok("201", _ref("BasinInfo"), "created")),
            },
        },
        "/v1/basins/{basin}": {
            "parameters": [_BASIN_PATH],
            "get": {
                "operationId": "get_basin_config",
                "responses": _answers(_ok("200", _ref("BasinConfig"), "the basin's config")),
            },
            "put": {
                "operationId": "ensure_basin",
                "requestBody": {
                    "required": False,
                    "content": _json(_nullable(_ref("EnsureBasinRequest"))),
                },
                "responses": _answers(
                    {
                        "200": {
                            "description": "exists",
                            "headers": _PROVISION,
                            "content": _json(_ref("BasinInfo")),
                        },
                        "201": {
                            "description": "created",
                            "headers": _PROVISION,
                            "content": _json(_ref("BasinInfo")),
                        },
                    },
                    ("403", {"description": "the root basin", "content": _json(_ref("ErrorInfo"))}),
                ),
            },
            "patch": {
                "operationId": "reconfigure_basin",
                "requestBody": {
                    "required": False,
                    "content": _json(_ref("BasinReconfiguration")),
                },
                "responses": _answers(
                    _ok("200", _ref("BasinConfig"), "the basin's config after the change"),
                    ("403", {"description": "the root basin", "content": _json(_ref("ErrorInfo"))}),
                ),
            },
            "delete": {
                "operationId": "delete_basin",
                "responses": _answers(
                    _ok("202", None, "deleted with its streams"),
                    ("403", {"description": "the root basin", "content": _json(_ref("ErrorInfo"))}),
                ),
            },
        },
        "/v1/streams": {
            "parameters": [_BASIN_HEADER],
            "get": {
                "operationId": "list_streams",
                "parameters": _LIST,
                "responses": _answers(_ok("200", _ref("ListStreamsResponse"), "streams")),
            },
            "post": {
                "operationId": "create_stream",
                "parameters": [_REQUEST_TOKEN],
                "requestBody": {"required": True, "content": _json(_ref("CreateStreamRequest"))},
                "responses": _answers(_ok("201", _ref("StreamInfo"), "created")),
            },
        },
        "/v1/streams/{stream}": {
            "parameters": [_BASIN_HEADER, _STREAM_PATH],
            "get": {
                "operationId": "get_stream_config",
                "responses": _answers(_ok("200", _ref("StreamConfig"), "the stream's config")),
            },
            "put": {
                "operationId": "ensure_stream",
                "requestBody": {
                    "required": False,
                    "content": _json(_nullable(_ref("StreamConfig"))),
                },
                "responses": _answers(
                    {
                        "200": {
                            "description": "exists",
                            "headers": _PROVISION,
                            "content": _json(_ref("StreamInfo")),
                        },
                        "201": {
                            "description": "created",
                            "headers": _PROVISION,
                            "content": _json(_ref("StreamInfo")),
                        },
                    }
                ),
            },
            "patch": {
                "operationId": "reconfigure_stream",
                "requestBody": {"required": True, "content": _json(_ref("StreamConfig"))},
                "responses": _answers(_ok("200", _ref("StreamConfig"), "the stream's config")),
            },
            "delete": {
                "operationId": "delete_stream",
                "responses": _answers(_ok("202", None, "deleted")),
            },
        },
        "/v1/streams/{stream}/records": {
            "parameters": [
                _BASIN_HEADER,
                _STREAM_PATH,
                _FORMAT_HEADER,
                _ENCRYPTION_KEY,
                _ENCRYPTION_CIPHER,
                _ACCEPT_ENCODING,
            ],
            "get": {
                "operationId": "read",
                "parameters": [
                    _LAST_EVENT_ID,
                    _query("seq_num", _I64, "start at this sequence number"),
                    _query("timestamp", _I64, "start at the first record at or after it"),
                    _query("tail_offset", _I64, "start this many records before the tail"),
                    _query("count", _I64, "at most this many records (1000)"),
                    _query("bytes", _I64, "at most this many metered bytes (1 MiB)"),
                    _query("until", _I64, "only records with a timestamp below it"),
                    _query("clamp", {"type": "boolean"}, "start at the tail when past it"),
                    _query(
                        "wait",
                        {"type": "integer", "minimum": 0, "maximum": 60},
                        "seconds to wait for records at the tail",
                    ),
                ],
                "responses": _answers(
                    {
                        "200": {
                            "description": "records (text/event-stream with Accept for SSE)",
                            "content": {
                                **_json(_ref("ReadBatch")),
                                "text/event-stream": {"schema": {"type": "string"}},
                            },
                        }
                    },
                    unwritten,
                ),
            },
            "post": {
                "operationId": "append",
                "parameters": [_CONTENT_ENCODING],
                "requestBody": {"required": True, "content": _json(_ref("AppendInput"))},
                "responses": _answers(_ok("200", _ref("AppendAck"), "appended"), condition),
            },
        },
        "/v1/streams/{stream}/records/tail": {
            "parameters": [_BASIN_HEADER, _STREAM_PATH],
            "get": {
                "operationId": "check_tail",
                "responses": _answers(_ok("200", _ref("TailResponse"), "the tail")),
            },
        },
    }


def document() -> dict[str, Any]:
    """The OpenAPI document (a new dict each call)."""
    return {
        "openapi": "3.1.0",
        "info": {
            "title": "walstream serve: S2 REST API v1",
            "version": "1",
            "description": "The part of S2's REST API v1 (s2.dev) that walstream implements.",
        },
        "security": [{"bearer": []}],
        "paths": _paths(),
        "components": {
            "schemas": _SCHEMAS,
            "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}},
        },
    }
