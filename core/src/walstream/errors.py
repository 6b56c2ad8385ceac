"""The closed error taxonomy of walstream.

Every failure a user can observe is an instance of one of the classes below. Backends translate
their medium's errors into them (the conformance suite checks that they do). Each error says
whether the operation **definitely did not happen** (``definitely_not_applied``) or **may have
happened** (only :class:`AmbiguousError`, and :class:`FencedError` for writes that were in flight
when the fence landed), and its message says what to do next.
"""

from __future__ import annotations

__all__ = [
    "AmbiguousError",
    "BackendUnavailable",
    "BasinExists",
    "BasinNotFound",
    "CapacityError",
    "ConfigError",
    "CorruptionError",
    "DataLossError",
    "DecryptionFailed",
    "EncryptionKeyRequired",
    "FencedError",
    "IdentityMismatch",
    "InvalidArgument",
    "NotFound",
    "OutOfRangeError",
    "PreconditionFailed",
    "SchemaTooNew",
    "StreamExists",
    "StreamNotFound",
    "TailMismatchError",
    "Throttled",
    "VersionMismatchError",
    "WalstreamError",
]


class WalstreamError(Exception):
    """Base of every error walstream raises on purpose."""

    #: True when the failed operation certainly had no effect and may simply be retried.
    definitely_not_applied: bool = True


class ConfigError(WalstreamError, ValueError):
    """A configuration value, key or plugin name is wrong. The message names the key."""


class SchemaTooNew(ConfigError):
    """The metadata database was migrated by a newer walstream than this one.

    Its schema version (``found_version``) is newer than the last migration this code knows
    (``known_version``), so this code cannot tell what the newer tables mean and refuses to open
    it; nothing was changed. Upgrade walstream on this node: every node of a deployment must run a
    release that knows the schema.
    """

    def __init__(self, message: str, found_version: int, known_version: int) -> None:
        super().__init__(message)
        self.found_version = found_version
        self.known_version = known_version


class InvalidArgument(WalstreamError, ValueError):
    """An API argument is malformed (empty batch, both ``start`` and ``tail_offset``, ...)."""


class EncryptionKeyRequired(InvalidArgument):
    """An encrypted record was read without a key, or a key is malformed (not base64 of 32
    bytes, an unknown cipher). Read with the key the records were written with."""


class DecryptionFailed(WalstreamError):
    """A record could not be decrypted with the key given: another key or cipher wrote it, it
    is not encrypted, or its bytes changed. Nothing was returned; read with the right key."""


class FencedError(WalstreamError):
    """The writer lost ownership: a newer node epoch, stream epoch or fencing token won.

    Nothing is acknowledged after this error. A write that was already in flight when the fence
    landed may still be recovered by the new owner, so treat in-flight writes as ambiguous.
    """


class TailMismatchError(WalstreamError):
    """``match_tail`` did not equal the stream's tail. Carries ``actual_tail``."""

    def __init__(self, message: str, actual_tail: int) -> None:
        super().__init__(message)
        self.actual_tail = actual_tail


class OutOfRangeError(WalstreamError):
    """A read or trim position lies outside ``[start_offset, tail]``.

    Carries ``start_offset`` and ``tail`` so the caller can resume at a valid position.
    """

    def __init__(self, message: str, start_offset: int, tail: int) -> None:
        super().__init__(message)
        self.start_offset = start_offset
        self.tail = tail


class StreamNotFound(WalstreamError, LookupError):
    """No stream with this name or id (or it was deleted)."""


class StreamExists(WalstreamError):
    """A stream with this name already exists."""


class BasinNotFound(WalstreamError, LookupError):
    """No basin (a namespace of streams, see :class:`walstream.metadata.BasinInfo`) with this
    name."""


class BasinExists(WalstreamError):
    """A basin with this name already exists."""


class CapacityError(WalstreamError):
    """A bound was reached: a record larger than the WAL accepts, or back-pressure that did not
    clear before the deadline. Nothing was written; retry later or raise the bound."""


class CorruptionError(WalstreamError):
    """Stored bytes failed a checksum, magic or structure check. Bad bytes are never returned."""


class IdentityMismatch(CorruptionError):
    """Stored bytes belong to another deployment, node or object than the one reading them.

    Raised when a WAL header, WAL object or chunk, or an object file carries a deployment id (or
    node id, object id) other than the expected one: foreign bytes are never served as ours. Check
    that the configuration points at this deployment's WAL and object store.
    """


class DataLossError(WalstreamError):
    """The read reaches offsets an operator recorded as lost (``walstream recover --accept-loss``).

    Carries the lost range ``[start_offset, end_offset)`` of ``stream_id``; a reader can resume at
    ``end_offset``. Offsets of a lost range are never reused for new records.
    """

    def __init__(self, message: str, stream_id: int, start_offset: int, end_offset: int) -> None:
        super().__init__(message)
        self.stream_id = stream_id
        self.start_offset = start_offset
        self.end_offset = end_offset


class BackendUnavailable(WalstreamError):
    """A backend could not be reached or refused service; the operation did not happen."""


class Throttled(BackendUnavailable):
    """The backend asked us to slow down (e.g. S3 ``503 SlowDown``)."""


class NotFound(WalstreamError, LookupError):
    """An object-store key does not exist."""


class PreconditionFailed(WalstreamError):
    """A conditional operation lost: ``put_if_absent`` found the key, a compare-and-set failed."""


class VersionMismatchError(PreconditionFailed):
    """A compare-and-set of a versioned value lost: the expected version is not the current one.

    Raised by the metadata store's key/value calls (``kv_put``, ``kv_delete``) when the key's
    version is not ``expected_version`` (an ``expected_version`` of 0 means the key must not
    exist). Carries ``actual_version``: the version found, 0 when the key does not exist. Nothing
    was changed; read the value again (``kv_get``) and retry on what it holds now.
    """

    def __init__(self, message: str, actual_version: int) -> None:
        super().__init__(message)
        self.actual_version = actual_version


class AmbiguousError(WalstreamError):
    """The operation may or may not have happened (e.g. a timeout after the request was sent).

    Read back (``check_tail``, ``read``) to find out before retrying a non-idempotent write.
    """

    definitely_not_applied = False


#: Object-store names for the same classes (docs/architecture/contracts.md): ``Unavailable`` and ``DataError``.
Unavailable = BackendUnavailable
DataError = CorruptionError
