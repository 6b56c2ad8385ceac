"""Records as the API sees them, and the argument checks shared by every edge of walstream.

**Records.** :class:`Record` is what an append takes; :class:`SequencedRecord` what a read returns;
:class:`AppendAck` and :class:`ReadResult` the answers. The batch codec that stores them is in
:mod:`walstream.format.batch`.

**Argument checks** (the Python API, the HTTP service, the CLI).

Every check raises :class:`~walstream.errors.InvalidArgument` with a message naming the argument
and the accepted range, so bad input never surfaces as ``struct.error``, ``OverflowError`` or
``UnicodeEncodeError`` from deeper layers. The bounds are what the batch format (docs/architecture/formats.md) and
the metadata stores can hold:

* offsets, stream ids, limits and timestamps are signed 64-bit integers; offsets, ids, limits and
  record timestamps (milliseconds since the Unix epoch) are never negative;
* text (stream names, header names, fencing tokens) is valid UTF-8: no lone surrogates;
* the **stream-name rule** (:func:`check_stream_name`): 1 to 2048 ASCII characters, the
  *encoding of a UTF-8 name* (:func:`encode_stream_name`): ASCII letters, digits, ``.``, ``_``
  and ``-`` stand for themselves; every other byte of the UTF-8 name is an escape, one of
  ``+ / @ ^ ` ~`` followed by the byte in two upper-case hex digits (``+`` for bytes 00-2C, ``/``
  for 2F, ``@`` for 3A-40, ``^`` for 5B-5E, `````` for 60, ``~`` for 7B-FF). So a name never
  holds a space, a control character, NUL or a lone ``/``, and is never ``.`` or ``..``.
  The encoding keeps the order of the UTF-8 bytes and their prefixes (an escape sorts where its
  byte sorts, and no code is a prefix of another), so names list and page in S2's order and a
  prefix query is a prefix query of the encoded names; names made of the characters that stand
  for themselves (every name of the older rule) are their own encoding.

  A name may be all digits (S2's stream ``5``): on the command line ``N`` and ``#N`` mean the
  stream with id N, and ``=NAME`` means the stream called NAME (:func:`parse_stream_ref`;
  ``=5``, ``=-orders``); the Python API takes an ``int`` id or a ``str`` name.
"""

from __future__ import annotations

import math
import re
import struct
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, fields
from typing import Any

from walstream.errors import InvalidArgument

__all__ = [
    "DEPLOYMENT_ID_BYTES",
    "ENCRYPTED_HEADER",
    "MAX_FENCING_TOKEN_BYTES",
    "MAX_FIELD_BYTES",
    "MAX_HEADER_COUNT",
    "MAX_HEADER_NAME_BYTES",
    "MAX_I64",
    "MAX_STREAM_NAME_LENGTH",
    "MIN_I64",
    "AppendAck",
    "ReadResult",
    "Record",
    "SequencedRecord",
    "check_append_input",
    "check_int",
    "check_optional_int",
    "check_optional_text",
    "check_stream_name",
    "check_stream_ref",
    "check_text",
    "check_wait",
    "decode_stream_name",
    "describe",
    "encode_stream_name",
    "parse_int_text",
    "parse_stream_ref",
]

MAX_I64 = 2**63 - 1
MIN_I64 = -(2**63)
#: Longest stream name, in characters (the rule allows ASCII only, so also in bytes): S2's 512
#: bytes, each escaped (3 characters), after a basin prefix of up to 49.
MAX_STREAM_NAME_LENGTH = 2048
#: The header name of encrypted records (:mod:`walstream.encryption`): reserved, a plaintext
#: record may not begin with it.
ENCRYPTED_HEADER = "walstream-cipher"
#: Longest fencing token, in UTF-8 bytes.
MAX_FENCING_TOKEN_BYTES = 4096

_PLAIN_NAME = re.compile(r"[A-Za-z0-9._-]+")
_PLAIN_BYTES = frozenset(b"-.0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZ_abcdefghijklmnopqrstuvwxyz")
#: (escape character, lowest byte, highest byte): each escape lies in the range of bytes it
#: stands for, between the characters that stand for themselves around it.
_ESCAPE_RANGES = (
    ("+", 0x00, 0x2C),
    ("/", 0x2F, 0x2F),
    ("@", 0x3A, 0x40),
    ("^", 0x5B, 0x5E),
    ("`", 0x60, 0x60),
    ("~", 0x7B, 0xFF),
)
_ESCAPE_OF = {byte: char for char, low, high in _ESCAPE_RANGES for byte in range(low, high + 1)}
_RANGE_OF = {char: (low, high) for char, low, high in _ESCAPE_RANGES}
_ENCODED_BYTE = [chr(b) if b in _PLAIN_BYTES else f"{_ESCAPE_OF[b]}{b:02X}" for b in range(256)]
_HEX = frozenset("0123456789ABCDEF")
_DIGITS = re.compile(r"[0-9]+")
_INTEGER_TEXT = re.compile(r"-?[0-9]+")
#: Digits of the longest decimal a 64-bit integer needs (and a bit more), so ``int()`` never
#: parses thousands of digits only to reject the result.
_MAX_INTEGER_DIGITS = 20
_DESCRIBE_CHARS = 60


def describe(value: Any) -> str:
    """A short, safe description of ``value`` for an error message.

    Never recurses into containers and never converts a huge integer to decimal (both of which
    can raise), and never repeats a megabyte of input back to the caller.
    """
    if value is None or isinstance(value, bool):
        return repr(value)
    if isinstance(value, int):
        if value.bit_length() > 64:
            return f"an integer of {value.bit_length()} bits"
        return str(value)
    if isinstance(value, float):
        return repr(value)
    if isinstance(value, str):
        shown = (
            value[:_DESCRIBE_CHARS].encode("utf-8", "backslashreplace").decode("ascii", "replace")
        )
        text = repr(shown)
        if len(value) > _DESCRIBE_CHARS:
            text += f" (… {len(value)} characters)"
        return text
    if isinstance(value, (bytes, bytearray, memoryview)):
        return f"{type(value).__name__} of {len(value)} bytes"
    return f"a {type(value).__name__}"


def check_int(value: Any, what: str, minimum: int = 0, maximum: int = MAX_I64) -> int:
    """``value`` as an int in ``[minimum, maximum]`` (bool is not an int here)."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidArgument(f"{what}: expected an integer, got {describe(value)}")
    if not minimum <= value <= maximum:
        raise InvalidArgument(
            f"{what}: must be between {minimum} and {maximum}, got {describe(value)}"
        )
    return int(value)


def check_optional_int(
    value: Any, what: str, minimum: int = 0, maximum: int = MAX_I64
) -> int | None:
    return None if value is None else check_int(value, what, minimum, maximum)


def check_text(value: Any, what: str, max_bytes: int | None = None) -> str:
    """``value`` as a str that encodes to UTF-8 (no lone surrogates), at most ``max_bytes``."""
    if not isinstance(value, str):
        raise InvalidArgument(f"{what}: expected a string, got {describe(value)}")
    if max_bytes is not None and len(value) > max_bytes:
        # Every character takes at least one byte: too long without encoding it.
        raise InvalidArgument(
            f"{what}: at most {max_bytes} bytes of UTF-8, got {len(value)} characters"
        )
    try:
        encoded = value.encode("utf-8")
    except UnicodeEncodeError as error:
        raise InvalidArgument(
            f"{what}: not valid UTF-8 text (a lone surrogate at character {error.start})"
        ) from None
    if max_bytes is not None and len(encoded) > max_bytes:
        raise InvalidArgument(
            f"{what}: at most {max_bytes} bytes of UTF-8, got {len(encoded)} bytes"
        )
    return value


def check_optional_text(value: Any, what: str, max_bytes: int | None = None) -> str | None:
    return None if value is None else check_text(value, what, max_bytes)


def encode_stream_name(name: str) -> str:
    """The walstream name of a UTF-8 name (the module docstring's encoding): order, prefixes and
    equality are those of the UTF-8 bytes. Raises :class:`InvalidArgument` for text that is not
    valid UTF-8."""
    if _PLAIN_NAME.fullmatch(name) is not None:
        return name
    try:
        data = name.encode("utf-8")
    except UnicodeEncodeError:
        raise InvalidArgument(f"name {describe(name)} is not valid UTF-8 text") from None
    return "".join([_ENCODED_BYTE[byte] for byte in data])


def decode_stream_name(name: str) -> str:
    """The UTF-8 name a walstream name encodes (:class:`InvalidArgument` when it encodes none:
    a character outside the rule, a malformed escape, or bytes that are not UTF-8)."""
    if _PLAIN_NAME.fullmatch(name) is not None:
        return name
    data = bytearray()
    position, size = 0, len(name)
    while position < size:
        char = name[position]
        code = ord(char)
        if code < 128 and code in _PLAIN_BYTES:
            data.append(code)
            position += 1
            continue
        bounds = _RANGE_OF.get(char)
        digits = name[position + 1 : position + 3]
        if bounds is None or len(digits) != 2 or not set(digits) <= _HEX:
            raise InvalidArgument(
                f"stream name {describe(name)}: character {char!r} at {position} is neither a "
                "letter, digit, '.', '_' or '-' nor an escape (one of + / @ ^ ` ~ and two "
                "upper-case hex digits)"
            )
        byte = int(digits, 16)
        if not bounds[0] <= byte <= bounds[1]:
            raise InvalidArgument(
                f"stream name {describe(name)}: escape {char}{digits} at {position} names a "
                f"byte the escape {char!r} does not stand for (it takes {bounds[0]:02X} to "
                f"{bounds[1]:02X}; letters, digits, '.', '_' and '-' stand for themselves)"
            )
        data.append(byte)
        position += 3
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        raise InvalidArgument(
            f"stream name {describe(name)}: its escapes are not UTF-8 bytes"
        ) from None


def check_stream_name(name: Any) -> str | None:
    """The stream-name rule, checked when a stream is created (``None``: a stream without name).

    1 to :data:`MAX_STREAM_NAME_LENGTH` characters that encode a UTF-8 name (the module
    docstring), and neither ``.`` nor ``..``.
    """
    if name is None:
        return None
    if not isinstance(name, str):
        raise InvalidArgument(
            f"a stream name must be a string (or None for no name), got {describe(name)}"
        )
    if not name:
        raise InvalidArgument(
            "a stream name must not be empty (use None for a stream without name)"
        )
    if len(name) > MAX_STREAM_NAME_LENGTH:
        raise InvalidArgument(
            f"a stream name has at most {MAX_STREAM_NAME_LENGTH} characters, got {len(name)}"
        )
    if name in (".", ".."):
        raise InvalidArgument(f"a stream name is not {name!r}")
    try:
        decode_stream_name(name)
    except InvalidArgument as error:
        raise InvalidArgument(
            f"{error}. Use ASCII letters, digits, '.', '_' and '-' (e.g. orders, order-lines, "
            "eu.orders_2), or walstream.records.encode_stream_name(any UTF-8 name)"
        ) from None
    return name


def check_stream_ref(name_or_id: Any) -> str | int:
    """A stream to look up: an id (0 to 2**63-1) or a non-empty UTF-8 name.

    Lookups do not apply the full name rule, so streams created before it stay reachable; a
    name that breaks the rule simply finds nothing.
    """
    if isinstance(name_or_id, int) and not isinstance(name_or_id, bool):
        return check_int(name_or_id, "stream id")
    if isinstance(name_or_id, str):
        if not name_or_id:
            raise InvalidArgument("a stream name must not be empty")
        return check_text(name_or_id, "stream name")
    raise InvalidArgument(
        f"a stream is addressed by its name (str) or id (int), got {describe(name_or_id)}"
    )


def parse_int_text(text: str, what: str, minimum: int = 0, maximum: int = MAX_I64) -> int:
    """A decimal integer written as text (a query parameter, an HTTP header, a CLI argument).

    Only ``-?[0-9]+``: no spaces, ``+``, ``_`` or non-ASCII digits, which ``int()`` accepts.
    """
    if _INTEGER_TEXT.fullmatch(text) is None or len(text.lstrip("-")) > _MAX_INTEGER_DIGITS:
        raise InvalidArgument(f"{what}: expected a decimal integer, got {describe(text)}")
    return check_int(int(text), what, minimum, maximum)


def parse_stream_ref(text: str) -> str | int:
    """A stream reference typed by a person or in a URL: ``#N`` or ``N`` (digits) is the stream
    with id N, ``=NAME`` the stream called NAME (``=5`` is the stream named ``5``), anything
    else a name. A name never holds ``#`` or ``=`` (they are escaped), so this is unambiguous."""
    if not isinstance(text, str):
        raise InvalidArgument(f"a stream reference must be text, got {describe(text)}")
    if text.startswith("="):
        if len(text) == 1:
            raise InvalidArgument("'=' introduces a stream name (=NAME, e.g. =5)")
        return check_text(text[1:], "stream name")
    if text.startswith("#"):
        if _DIGITS.fullmatch(text[1:]) is None:
            raise InvalidArgument(
                f"{describe(text)}: '#' introduces a stream id (#N with N digits, e.g. #5); "
                "stream names never start with '#'"
            )
        return parse_int_text(text[1:], "stream id")
    if _DIGITS.fullmatch(text) is not None:
        return parse_int_text(text, "stream id")
    return check_stream_ref(text)


def check_wait(wait: Any, what: str = "wait") -> float:
    """Seconds to wait: a real number, at least 0 (infinity waits until something happens)."""
    if isinstance(wait, bool) or not isinstance(wait, (int, float)):
        raise InvalidArgument(f"{what}: expected seconds (a number), got {describe(wait)}")
    if wait < 0:
        raise InvalidArgument(f"{what}: must be at least 0 seconds, got {describe(wait)}")
    try:
        seconds = float(wait)
    except OverflowError:  # an int beyond float range: as good as forever
        seconds = math.inf
    if not seconds >= 0:  # also rejects NaN
        raise InvalidArgument(f"{what}: must be at least 0 seconds, got {describe(wait)}")
    return seconds


#: Length of a deployment id: 16 random bytes made once by the metadata store and carried by
#: every WAL medium and object file of the deployment.
DEPLOYMENT_ID_BYTES = 16

_REC_TS_KEYLEN = struct.Struct(">qi")
_I32 = struct.Struct(">i")
_U16 = struct.Struct(">H")
_MAX_I32 = 2**31 - 1
_MAX_I64 = 2**63 - 1
#: Bounds the batch format imposes on one record (u16 header count and name length, i32 sizes).
MAX_HEADER_COUNT = 2**16 - 1
MAX_HEADER_NAME_BYTES = 2**16 - 1
MAX_FIELD_BYTES = _MAX_I32

Headers = tuple[tuple[str, bytes], ...]


@dataclass(frozen=True, slots=True)
class Record:
    """A record to append. ``timestamp_ms=None`` takes the node's clock at append time."""

    value: bytes
    key: bytes | None = None
    headers: Headers = ()
    timestamp_ms: int | None = None

    def __post_init__(self) -> None:
        # The bounds are what the batch format encodes (module docstring): checked here so a bad
        # record fails with InvalidArgument when it is made, not with struct.error at append.
        # Records are made on the hot path: plain bytes, ints and (str, bytes) tuples take the
        # fast checks, anything else the thorough ones.
        value = self.value
        if type(value) is not bytes or len(value) > MAX_FIELD_BYTES:
            object.__setattr__(self, "value", _checked_bytes(value, "Record.value"))
        key = self.key
        if key is not None and (type(key) is not bytes or len(key) > MAX_FIELD_BYTES):
            object.__setattr__(self, "key", _checked_bytes(key, "Record.key"))
        timestamp = self.timestamp_ms
        if timestamp is not None and (type(timestamp) is not int or not 0 <= timestamp <= _MAX_I64):
            check_int(timestamp, "Record.timestamp_ms (milliseconds since 1970)")
        headers = self.headers
        if type(headers) is tuple and len(headers) <= MAX_HEADER_COUNT:
            if all(_plain_header(header) for header in headers):
                return
        object.__setattr__(self, "headers", _checked_headers(headers))


def _plain_header(header: object) -> bool:
    """A (str, bytes) tuple within the format's bounds (the common case, checked fast)."""
    if type(header) is not tuple or len(header) != 2:
        return False
    name, data = header
    if type(name) is not str or type(data) is not bytes or len(data) > MAX_FIELD_BYTES:
        return False
    try:
        return len(name.encode("utf-8")) <= MAX_HEADER_NAME_BYTES
    except UnicodeEncodeError:
        return False


def _checked_headers(headers: object) -> Headers:
    """``headers`` as a tuple of (str, bytes) pairs, or :class:`InvalidArgument` naming the
    first one the batch format cannot encode."""
    if isinstance(headers, (str, bytes, bytearray, memoryview)) or not isinstance(
        headers, Iterable
    ):
        raise InvalidArgument(
            f"Record.headers must be a sequence of (str, bytes) pairs, got {describe(headers)}"
        )
    pairs = tuple(headers)
    if len(pairs) > MAX_HEADER_COUNT:
        raise InvalidArgument(
            f"Record.headers: at most {MAX_HEADER_COUNT} headers per record, got {len(pairs)}"
        )
    checked: list[tuple[str, bytes]] = []
    for index, header in enumerate(pairs):
        if (
            not isinstance(header, (tuple, list))
            or len(header) != 2
            or not isinstance(header[0], str)
            or not isinstance(header[1], (bytes, bytearray, memoryview))
        ):
            raise InvalidArgument(
                f"Record.headers[{index}]: expected a (str, bytes) pair, got {describe(header)}"
            )
        name = check_text(header[0], f"Record.headers[{index}] name", MAX_HEADER_NAME_BYTES)
        checked.append((name, _checked_bytes(header[1], f"Record.headers[{index}] value")))
    return tuple(checked)


def _checked_bytes(data: object, what: str) -> bytes:
    """``data`` if it is bytes-like and its length fits the format's i32; a memoryview of
    anything but single bytes (``len`` counts items, not bytes) becomes a byte view."""
    if isinstance(data, memoryview):
        if data.ndim != 1 or data.itemsize != 1 or not data.c_contiguous:
            data = memoryview(data.tobytes())
        length = data.nbytes
    elif isinstance(data, (bytes, bytearray)):
        length = len(data)
    else:
        raise InvalidArgument(f"{what} must be bytes, not {type(data).__name__}")
    if length > MAX_FIELD_BYTES:
        raise InvalidArgument(
            f"{what}: at most {MAX_FIELD_BYTES} bytes (2 GiB - 1), got {length} bytes"
        )
    return data  # type: ignore[return-value]


def check_append_input(records: object, match_tail: object, fencing_token: object) -> list[Record]:
    """The arguments of an append, checked once for every caller of the engine: ``records`` as
    a non-empty list of :class:`Record` (any iterable of them is taken), ``match_tail`` an
    offset or None, ``fencing_token`` text of at most :data:`MAX_FENCING_TOKEN_BYTES` bytes or
    None. Raises :class:`InvalidArgument` naming the argument."""
    # A list (the common case) skips the abstract-class check, which is slow.
    if type(records) is not list:
        if isinstance(records, Record) or not isinstance(records, Iterable):
            raise InvalidArgument(
                "append takes an iterable of walstream.Record (e.g. a list), got "
                f"{describe(records)}"
            )
        records = list(records)
    assert isinstance(records, list)
    if not records:
        raise InvalidArgument("append needs at least one record")
    for record in records:
        if type(record) is not Record and not isinstance(record, Record):
            raise InvalidArgument(
                f"append takes walstream.Record objects, got {type(record).__name__}"
            )
        headers = record.headers
        if headers and headers[0][0] == ENCRYPTED_HEADER:
            raise InvalidArgument(
                f"header name {ENCRYPTED_HEADER!r} is reserved for encrypted records: rename "
                "the header, or append with encryption=EncryptionKey(...)"
            )
    if match_tail is not None:
        check_int(match_tail, "match_tail")
    if fencing_token is not None:
        check_text(fencing_token, "fencing_token", MAX_FENCING_TOKEN_BYTES)
    return records


@dataclass(frozen=True, slots=True)
class SequencedRecord:
    """A record as read back: its stream offset and the stored fields."""

    offset: int
    value: bytes
    key: bytes | None = None
    headers: Headers = ()
    timestamp_ms: int = 0


_RecordMaker = Callable[[int, bytes, bytes | None, Headers, int], SequencedRecord]


def _sequenced_record_maker() -> _RecordMaker:
    """A constructor of :class:`SequencedRecord` for decoders, which make thousands per block:
    it fills the slots through their descriptors, in the order of the dataclass's fields,
    instead of the frozen ``__init__``'s ``object.__setattr__`` per field (half the time). Same
    values, same type, equal to what the class's own constructor makes."""
    names = [item.name for item in fields(SequencedRecord)]
    if names != ["offset", "value", "key", "headers", "timestamp_ms"]:
        raise TypeError(f"SequencedRecord's fields changed ({names}): update this maker")
    set_offset, set_value, set_key, set_headers, set_timestamp = (
        getattr(SequencedRecord, name).__set__ for name in names
    )
    new = object.__new__

    def make(
        offset: int, value: bytes, key: bytes | None, headers: Headers, timestamp_ms: int
    ) -> SequencedRecord:
        record: SequencedRecord = new(SequencedRecord)
        set_offset(record, offset)
        set_value(record, value)
        set_key(record, key)
        set_headers(record, headers)
        set_timestamp(record, timestamp_ms)
        return record

    return make


make_sequenced_record = _sequenced_record_maker()
"""``make_sequenced_record(offset, value, key, headers, timestamp_ms)``: a
:class:`SequencedRecord`, made twice as fast as by its constructor (no argument checks)."""


@dataclass(frozen=True, slots=True)
class AppendAck:
    """``[start, end)`` are the offsets the batch got; ``tail`` is the stream's tail after it.

    ``first_timestamp_ms`` and ``last_timestamp_ms`` are the timestamps stored with the batch's
    first and last record (after the stream's never-backwards adjustment)."""

    start: int
    end: int
    tail: int
    first_timestamp_ms: int = 0
    last_timestamp_ms: int = 0


@dataclass(frozen=True, slots=True)
class ReadResult:
    records: list[SequencedRecord] = field(default_factory=list)
    tail: int = 0
