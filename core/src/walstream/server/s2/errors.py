"""S2's error answers and how walstream's typed errors map onto them.

Every error the S2 API answers is an :class:`S2Error`: an HTTP status and either S2's standard
``{"code": ..., "message": ...}`` body (``ErrorInfo``) or one of S2's special bodies: 412
``{"seq_num_mismatch": N}`` / ``{"fencing_token_mismatch": "token"}`` and 416
``{"tail": {"seq_num": N, "timestamp": T}}``. The codes are S2's (``invalid`` 422,
``bad_json``/``bad_proto``/``bad_query``/``bad_header``/``bad_path``/``bad_frame`` 400,
``stream_not_found``/``basin_not_found`` 404, ``resource_already_exists`` 409,
``rate_limited`` 429, ``unavailable``/``server_draining`` 503, ...).
"""

from __future__ import annotations

import json
from typing import Any

from walstream.errors import (
    AmbiguousError,
    BackendUnavailable,
    BasinExists,
    BasinNotFound,
    CapacityError,
    ConfigError,
    CorruptionError,
    DataLossError,
    DecryptionFailed,
    EncryptionKeyRequired,
    FencedError,
    InvalidArgument,
    OutOfRangeError,
    StreamExists,
    StreamNotFound,
    TailMismatchError,
    Throttled,
    WalstreamError,
)

__all__ = ["S2Error", "from_walstream"]


class S2Error(Exception):
    """An S2 API error answer: ``status`` and the JSON ``body`` to send."""

    def __init__(
        self, status: int, code: str, message: str, body: dict[str, Any] | None = None
    ) -> None:
        super().__init__(message)
        self.status = status
        self.code = code
        self.message = message
        self.body: dict[str, Any] = body if body is not None else {"code": code, "message": message}

    def encoded(self) -> bytes:
        return json.dumps(self.body, separators=(",", ":")).encode("utf-8")


def from_walstream(error: WalstreamError) -> S2Error:
    """The S2 answer for a walstream error (the 412 and 416 bodies are built by the routes,
    which know the stream's position)."""
    message = str(error)
    if isinstance(error, TailMismatchError):
        return S2Error(412, "", message, {"seq_num_mismatch": error.actual_tail})
    if isinstance(error, OutOfRangeError):
        return S2Error(416, "", message, {"tail": {"seq_num": error.tail, "timestamp": 0}})
    if isinstance(error, StreamNotFound):
        return S2Error(404, "stream_not_found", message)
    if isinstance(error, BasinNotFound):
        return S2Error(404, "basin_not_found", message)
    if isinstance(error, (StreamExists, BasinExists)):
        return S2Error(409, "resource_already_exists", message)
    if isinstance(error, EncryptionKeyRequired):
        return S2Error(400, "bad_header", message)
    if isinstance(error, DecryptionFailed):
        return S2Error(400, "decryption_failed", message)
    if isinstance(error, (InvalidArgument, ConfigError)):
        return S2Error(422, "invalid", message)
    if isinstance(error, FencedError):
        # The node lost the stream to another writer: a conflict the caller may retry elsewhere.
        return S2Error(409, "transaction_conflict", message)
    if isinstance(error, (CapacityError, Throttled)):
        return S2Error(429, "rate_limited", message)
    if isinstance(error, BackendUnavailable):
        return S2Error(503, "unavailable", message)
    if isinstance(error, AmbiguousError):
        return S2Error(504, "upstream_timeout", message)
    if isinstance(error, DataLossError):
        return S2Error(
            500,
            "storage",
            f"{message} (records [{error.start_offset}, {error.end_offset}) were recorded as "
            f"lost; read from seq_num {error.end_offset})",
        )
    if isinstance(error, CorruptionError):
        return S2Error(500, "storage", message)
    return S2Error(500, "other", f"{type(error).__name__}: {message}")
