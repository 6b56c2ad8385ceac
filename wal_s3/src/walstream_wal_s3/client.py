"""S3 client plumbing shared by the S3 object store, the S3 WAL and the s3express WAL.

- :class:`S3Settings` — where and how to connect (bucket, prefix, endpoint, credentials, pool).
- :class:`S3Client` — one aiobotocore client per event loop, each with a bounded connection
  pool; :meth:`S3Client.call` runs one S3 operation with retries (jittered exponential backoff)
  and translates every failure into :mod:`walstream.errors`.

Error translation (:func:`classify`):

========================================  ===============================  ===========
S3 / transport failure                    walstream error                  retried
========================================  ===============================  ===========
404, ``NoSuchKey``, ``NoSuchUpload``       :class:`NotFound`                no
412 ``PreconditionFailed``                 :class:`PreconditionFailed`      no
409 ``ConditionalRequestConflict``         :class:`PreconditionFailed`      yes
503 ``SlowDown``, 429, throttling codes    :class:`Throttled`               yes
other 5xx                                  :class:`BackendUnavailable`      yes
connection refused / connect timeout       :class:`BackendUnavailable`      yes
read timeout / connection closed           :class:`AmbiguousError` (write)  yes
403, bad credentials, ``NoSuchBucket``     :class:`BackendUnavailable`      no
========================================  ===============================  ===========

A write whose last attempt failed after an earlier attempt *may have been applied* (a timeout
after sending, a 5xx) ends in :class:`AmbiguousError` unless the final answer is definite.

Time bounds (an endpoint that accepts connections but never answers — a frozen server, a
black-holed network — must not stall a caller):

- each attempt: ``connect_timeout`` (default 5 s) to connect, then ``read_timeout`` (default
  10 s) for each read of the answer;
- each operation, all attempts and backoff sleeps together: ``request_timeout`` (default 30 s).
  After it, the operation fails with :class:`BackendUnavailable` (a read, or a write that
  certainly was not applied) or :class:`AmbiguousError` (a write that may have been applied),
  naming the endpoint, the bucket and the operation;
- after ``slow_warning`` (default 5 s) without an answer, one WARNING log line names the
  endpoint, the bucket and the operation being waited for; an operation cancelled after that
  (a deadline, Ctrl-C) logs what it abandoned.
"""

from __future__ import annotations

import asyncio
import enum
import logging
import random
import time
import weakref
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from aiobotocore.config import AioConfig
from aiobotocore.session import AioSession, get_session
from botocore.exceptions import (
    BotoCoreError,
    ClientError,
    ConnectionClosedError,
    ConnectTimeoutError,
    EndpointConnectionError,
    HTTPClientError,
    NoCredentialsError,
    ParamValidationError,
    ReadTimeoutError,
    ResponseStreamingError,
)
from botocore.loaders import Loader, create_loader
from walstream.clock import Clock, SystemClock, make_rng
from walstream.config import parse_duration
from walstream.errors import (
    AmbiguousError,
    BackendUnavailable,
    ConfigError,
    InvalidArgument,
    NotFound,
    PreconditionFailed,
    Throttled,
    WalstreamError,
)

__all__ = [
    "ConditionalOutcomeUnknown",
    "RangeNotSatisfiable",
    "RetryPolicy",
    "S3Client",
    "S3Settings",
    "UnansweredWrite",
    "classify",
]

log = logging.getLogger(__name__)

_THROTTLE_CODES = frozenset(
    {
        "SlowDown",
        "Throttling",
        "ThrottlingException",
        "RequestLimitExceeded",
        "TooManyRequests",
        "RequestThrottled",
        "ServiceUnavailable",
    }
)
_NOT_FOUND_CODES = frozenset({"NoSuchKey", "NotFound", "404", "NoSuchUpload", "NoSuchVersion"})
_CREDENTIAL_CODES = frozenset(
    {
        "AccessDenied",
        "InvalidAccessKeyId",
        "SignatureDoesNotMatch",
        "ExpiredToken",
        "InvalidToken",
        "403",
    }
)


class RangeNotSatisfiable(InvalidArgument):
    """S3 answered 416: the requested range starts at or after the end of the object."""


class UnansweredWrite(AmbiguousError):
    """A write got no answer within ``request_timeout``: it may have been applied. ``detail``
    names the endpoint, bucket and operation without the read-back advice (for a caller to
    whom the write's outcome does not matter, such as a probe of a throw-away key)."""

    def __init__(self, message: str, detail: str) -> None:
        super().__init__(message)
        self.detail = detail


class ConditionalOutcomeUnknown(PreconditionFailed):
    """A conditional write lost (412) after an earlier attempt of the same write may have been
    applied: the object that won may be our own. The caller resolves it by reading back."""


@dataclass(frozen=True)
class RetryPolicy:
    """Full-jitter exponential backoff: attempt ``n`` sleeps ``uniform(0, min(cap, base·2ⁿ))``."""

    max_attempts: int = 10
    base_delay_s: float = 0.05
    max_delay_s: float = 2.0
    throttle_base_delay_s: float = 0.2
    """Throttling (503 SlowDown) backs off from a larger base: S3 asks us to slow down."""

    def delay_s(self, attempt: int, throttled: bool, rng: random.Random) -> float:
        base = self.throttle_base_delay_s if throttled else self.base_delay_s
        return rng.uniform(0.0, min(self.max_delay_s, base * (2**attempt)))


@dataclass(frozen=True)
class S3Settings:
    """Connection settings; :meth:`from_options` reads a validated YAML section."""

    bucket: str
    prefix: str = ""
    endpoint_url: str | None = None
    region: str | None = None
    access_key_id: str | None = None
    secret_access_key: str | None = None
    session_token: str | None = None
    max_pool_connections: int = 32
    connect_timeout_s: float = 5.0
    """Bound of one TCP/TLS connect."""
    read_timeout_s: float = 10.0
    """Bound of each read of an answer (a frozen endpoint accepts the connection, then
    never answers)."""
    request_timeout_s: float = 30.0
    """Bound of one operation: every attempt and backoff sleep together."""
    slow_warning_s: float = 5.0
    """An operation without an answer for this long logs a WARNING naming what it waits for."""
    create_bucket: bool = False
    retry: RetryPolicy = field(default_factory=RetryPolicy)

    def __post_init__(self) -> None:
        if not self.bucket:
            raise InvalidArgument("S3 bucket name is empty")
        if self.endpoint_url is not None:
            scheme, _, rest = str(self.endpoint_url).partition("://")
            if scheme not in ("http", "https") or not rest.strip("/"):
                raise ConfigError(
                    f"endpoint_url: {self.endpoint_url!r} is not an http:// or https:// URL; "
                    f"write it with its scheme, e.g. http://{rest or self.endpoint_url}"
                )
        if self.prefix and not self.prefix.endswith("/"):
            object.__setattr__(self, "prefix", self.prefix + "/")
        for name in ("connect_timeout_s", "read_timeout_s", "request_timeout_s", "slow_warning_s"):
            value = getattr(self, name)
            if not value > 0:
                raise ConfigError(f"{name.removesuffix('_s')}: must be positive, got {value!r}")
        if (self.access_key_id is None) != (self.secret_access_key is None):
            raise InvalidArgument(
                "set both access_key_id and secret_access_key, or neither (to use the AWS "
                "credential chain: environment, profile, instance role)"
            )

    @classmethod
    def from_options(cls, options: Mapping[str, Any]) -> S3Settings:
        def optional(name: str) -> Any:
            value = options.get(name)
            return None if value in (None, "") else value

        timeouts: dict[str, Any] = {
            f"{name}_s": parse_duration(options[name], name)
            for name in ("connect_timeout", "read_timeout", "request_timeout", "slow_warning")
            if options.get(name) not in (None, "")
        }
        return cls(
            bucket=str(options["bucket"]),
            prefix=str(options.get("prefix") or ""),
            endpoint_url=optional("endpoint_url"),
            region=optional("region"),
            access_key_id=optional("access_key_id"),
            secret_access_key=optional("secret_access_key"),
            session_token=optional("session_token"),
            max_pool_connections=int(options.get("max_pool_connections") or 32),
            **timeouts,
            create_bucket=bool(options.get("create_bucket") or False),
        )

    def describe(self) -> dict[str, Any]:
        """Settings without secrets, for logs and ``walstream inspect``."""
        return {
            "bucket": self.bucket,
            "prefix": self.prefix,
            "endpoint_url": self.endpoint_url,
            "region": self.region,
            "credentials": "yaml" if self.access_key_id else "aws-chain",
            "max_pool_connections": self.max_pool_connections,
            "connect_timeout_s": self.connect_timeout_s,
            "read_timeout_s": self.read_timeout_s,
            "request_timeout_s": self.request_timeout_s,
        }

    @property
    def endpoint(self) -> str:
        """Where requests go, for messages: the endpoint URL, or AWS S3 and its region."""
        return self.endpoint_url or f"AWS S3 ({self.region or 'default region'})"


class _Retry(enum.Enum):
    NO = "no"
    YES = "yes"
    """Retry; the failed attempt certainly had no effect."""
    YES_MAYBE_APPLIED = "maybe"
    """Retry; the failed attempt may have been applied (a write sent, no answer read)."""


def _status_and_code(exc: ClientError) -> tuple[int, str, str]:
    response: Mapping[str, Any] = exc.response or {}
    status = int(response.get("ResponseMetadata", {}).get("HTTPStatusCode") or 0)
    error = response.get("Error", {}) or {}
    return status, str(error.get("Code") or status), str(error.get("Message") or "")


def classify(exc: BaseException, what: str, bucket: str) -> tuple[WalstreamError, _Retry]:
    """Translate an S3/transport exception into a walstream error and a retry verdict."""
    if isinstance(exc, WalstreamError):
        return exc, _Retry.NO
    if isinstance(exc, ClientError):
        status, code, message = _status_and_code(exc)
        detail = f"S3 {what}: {status} {code}" + (f" ({message})" if message else "")
        if code == "NoSuchBucket":
            # A configuration error, not an outage: retrying cannot make the bucket appear.
            return ConfigError(
                f"{detail}: bucket {bucket!r} does not exist; create it or set create_bucket: true"
            ), _Retry.NO
        if code in _NOT_FOUND_CODES or status == 404:
            return NotFound(f"{detail}: no such object"), _Retry.NO
        if status == 412 or code == "PreconditionFailed":
            return PreconditionFailed(f"{detail}: the object already exists"), _Retry.NO
        if code == "ConditionalRequestConflict" or status == 409:
            return PreconditionFailed(
                f"{detail}: a concurrent conditional write to the same key won"
            ), _Retry.YES
        if status == 416 or code == "InvalidRange":
            return RangeNotSatisfiable(f"{detail}: range starts past the end"), _Retry.NO
        if status in (429, 503) or code in _THROTTLE_CODES:
            return Throttled(
                f"{detail}: S3 is throttling this prefix; lower the request rate or spread "
                "keys over more prefixes"
            ), _Retry.YES
        if status >= 500:
            return BackendUnavailable(
                f"{detail}: S3 server error; retry later"
            ), _Retry.YES_MAYBE_APPLIED
        if code in _CREDENTIAL_CODES or status == 403:
            return BackendUnavailable(
                f"{detail}: S3 refused the credentials; check access_key_id/secret_access_key "
                "or the AWS credential chain and the bucket policy"
            ), _Retry.NO
        return BackendUnavailable(f"{detail}: request refused"), _Retry.NO
    if isinstance(exc, ParamValidationError):
        return InvalidArgument(f"S3 {what}: {exc}"), _Retry.NO
    if isinstance(exc, NoCredentialsError):
        return BackendUnavailable(
            f"S3 {what}: no AWS credentials found; set access_key_id and secret_access_key "
            "(e.g. ${AWS_ACCESS_KEY_ID}) or configure the AWS credential chain"
        ), _Retry.NO
    if isinstance(exc, (EndpointConnectionError, ConnectTimeoutError)):
        return BackendUnavailable(
            f"S3 {what}: cannot connect ({exc}); check endpoint_url and the network"
        ), _Retry.YES
    if isinstance(
        exc,
        (
            ReadTimeoutError,
            ConnectionClosedError,
            ResponseStreamingError,
            HTTPClientError,
            TimeoutError,
            ConnectionError,
        ),
    ):
        return AmbiguousError(
            f"S3 {what}: the connection failed after the request was sent ({exc}); it may "
            "or may not have been applied"
        ), _Retry.YES_MAYBE_APPLIED
    if isinstance(exc, BotoCoreError):
        return BackendUnavailable(f"S3 {what}: {exc}"), _Retry.NO
    if isinstance(exc, OSError):
        return BackendUnavailable(f"S3 {what}: {exc}"), _Retry.YES_MAYBE_APPLIED
    return BackendUnavailable(f"S3 {what}: unexpected {type(exc).__name__}: {exc}"), _Retry.NO


@dataclass
class _LoopClient:
    lock: asyncio.Lock
    client: Any = None
    exit: Callable[..., Awaitable[Any]] | None = None


_LOADERS: dict[str | None, Loader] = {}
"""botocore data loaders by data path, shared by every session of this process."""


def new_session() -> AioSession:
    """A botocore session whose data loader is shared with every other session of the process.

    The loader caches the parsed JSON models (S3's service model, endpoints, partitions); a
    fresh loader parses them again, about 0.3 s of CPU on an idle core and more on a busy one,
    for every store created. A node creates one for each WAL it opens: a failover opens the
    dead node's WAL, so that parse would sit on the recovery path of every failover. Sessions
    stay separate (credentials, configuration); only the read-only model data is shared."""
    session = get_session()
    data_path = session.get_config_variable("data_path")
    loader = _LOADERS.get(data_path)
    if loader is None:
        loader = _LOADERS[data_path] = create_loader(data_path)
    session.register_component("data_loader", loader)
    return session


class S3Client:
    """Async S3 access: one aiobotocore client per event loop, retries, error translation.

    The client of a loop is created on first use and closed by :meth:`close` (called from that
    loop). Its connection pool holds at most ``settings.max_pool_connections`` connections;
    further requests wait for a free one. Retries are done here (botocore's own are off) so
    that every attempt is classified: a write whose attempts may have been applied ends in
    :class:`AmbiguousError`, never in a "definitely failed" error.
    """

    def __init__(
        self,
        settings: S3Settings,
        *,
        rng: random.Random | None = None,
        clock: Clock | None = None,
        session: AioSession | None = None,
    ) -> None:
        self.settings = settings
        self._rng = rng or make_rng(None)
        self._clock: Clock = clock or SystemClock()
        self._session = session or new_session()
        self._clients: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _LoopClient] = (
            weakref.WeakKeyDictionary()
        )
        self._bucket_ready = False
        self.request_counts: dict[str, int] = {}
        """Attempts sent per operation name (cost accounting: PUTs per GiB, LISTs, ...)."""

    def _config(self) -> AioConfig:
        s3_options: dict[str, Any] = {}
        if self.settings.endpoint_url:
            # S3-compatible endpoints (moto, MinIO, ...) rarely resolve virtual-host buckets.
            s3_options["addressing_style"] = "path"
        return AioConfig(
            max_pool_connections=self.settings.max_pool_connections,
            connect_timeout=self.settings.connect_timeout_s,
            read_timeout=self.settings.read_timeout_s,
            retries={"total_max_attempts": 1, "mode": "standard"},
            s3=s3_options,
            request_checksum_calculation="when_required",
            response_checksum_validation="when_required",
        )

    async def raw(self) -> Any:
        """The aiobotocore client of the running loop (created on first use)."""
        loop = asyncio.get_running_loop()
        state = self._clients.get(loop)
        if state is None:
            state = _LoopClient(lock=asyncio.Lock())
            self._clients[loop] = state
        if state.client is None:
            async with state.lock:
                if state.client is None:
                    settings = self.settings
                    context = self._session.create_client(
                        "s3",
                        region_name=settings.region or "us-east-1",
                        endpoint_url=settings.endpoint_url,
                        aws_access_key_id=settings.access_key_id,
                        aws_secret_access_key=settings.secret_access_key,
                        aws_session_token=settings.session_token,
                        config=self._config(),
                    )
                    state.client = await context.__aenter__()
                    state.exit = context.__aexit__
        if not self._bucket_ready and self.settings.create_bucket:
            self._bucket_ready = True
            await self._create_bucket(state.client)
        return state.client

    async def _create_bucket(self, client: Any) -> None:
        params: dict[str, Any] = {"Bucket": self.settings.bucket}
        region = self.settings.region
        if region and region != "us-east-1":
            params["CreateBucketConfiguration"] = {"LocationConstraint": region}
        try:
            await client.create_bucket(**params)
        except ClientError as exc:
            _, code, _ = _status_and_code(exc)
            if code not in {"BucketAlreadyOwnedByYou", "BucketAlreadyExists"}:
                self._bucket_ready = False
                raise classify(exc, "create_bucket", self.settings.bucket)[0] from exc

    async def call(
        self,
        operation: str,
        *,
        write: bool = False,
        read_body: bool = False,
        **params: Any,
    ) -> dict[str, Any]:
        """Run ``client.<operation>(Bucket=..., **params)`` with retries.

        ``write``: the operation changes state (failures after sending are ambiguous).
        ``read_body``: read ``Body`` into bytes inside the retried attempt (a GET whose body
        stream breaks is retried as a whole).
        """
        params.setdefault("Bucket", self.settings.bucket)
        key = params.get("Key")
        what = f"{operation} s3://{params['Bucket']}/{key}" if key else operation
        settings = self.settings
        policy = settings.retry
        # Monotonic wall time, not self._clock: the bound is about a real endpoint answering.
        started = time.monotonic()
        deadline = started + settings.request_timeout_s
        state = {"attempt": 0}
        loop = asyncio.get_running_loop()
        watchdog = loop.call_later(
            settings.slow_warning_s, self._warn_slow, what, params["Bucket"], started, state
        )
        maybe_applied = False
        try:
            while True:
                self.request_counts[operation] = self.request_counts.get(operation, 0) + 1
                state["attempt"] += 1
                attempt_bound = asyncio.timeout(max(0.0, deadline - time.monotonic()))
                try:
                    async with attempt_bound:
                        client = await self.raw()
                        response: dict[str, Any] = await getattr(client, operation)(**params)
                        if read_body:
                            async with response["Body"] as body:
                                response["Body"] = await body.read()
                    return response
                except asyncio.CancelledError:
                    if time.monotonic() - started >= settings.slow_warning_s:
                        log.warning(
                            "abandoned S3 %s at %s (bucket %r) after %.1f s without an answer",
                            what,
                            settings.endpoint,
                            params["Bucket"],
                            time.monotonic() - started,
                        )
                    raise
                except Exception as exc:
                    if attempt_bound.expired():
                        # The operation's bound ran out during this attempt: it was sent and
                        # not answered, so a write may have been applied.
                        raise self._timed_out(
                            what,
                            params["Bucket"],
                            write,
                            write or maybe_applied,
                            state["attempt"],
                            "no answer",
                        ) from exc
                    error, verdict = classify(exc, what, params["Bucket"])
                    if verdict is _Retry.YES_MAYBE_APPLIED and write:
                        maybe_applied = True
                    attempt = state["attempt"]
                    if verdict is _Retry.NO or attempt >= policy.max_attempts:
                        raise self._final_error(error, write, maybe_applied, attempt) from exc
                    delay = policy.delay_s(attempt, isinstance(error, Throttled), self._rng)
                    if time.monotonic() + delay >= deadline:
                        raise self._timed_out(
                            what, params["Bucket"], write, maybe_applied, attempt, str(error)
                        ) from exc
                    log.debug("S3 %s failed (%s); retry %d in %.3fs", what, error, attempt, delay)
                    await self._clock.sleep(delay)
        finally:
            watchdog.cancel()

    def _warn_slow(self, what: str, bucket: str, started: float, state: dict[str, int]) -> None:
        log.warning(
            "waiting for S3 %s at %s (bucket %r): no answer for %.1f s (attempt %d); giving up "
            "after %.0f s (request_timeout)",
            what,
            self.settings.endpoint,
            bucket,
            time.monotonic() - started,
            state["attempt"],
            self.settings.request_timeout_s,
        )

    def _timed_out(
        self, what: str, bucket: str, write: bool, maybe_applied: bool, attempts: int, last: str
    ) -> WalstreamError:
        """The error of an operation whose ``request_timeout`` ran out."""
        detail = (
            f"S3 {what} at {self.settings.endpoint} (bucket {bucket!r}): no success within "
            f"request_timeout {self.settings.request_timeout_s:g} s ({attempts} attempts; last: "
            f"{last}); check that the endpoint is up and reachable"
        )
        if write and maybe_applied:
            return UnansweredWrite(
                f"{detail}; the write may have been applied — read back before retrying", detail
            )
        return BackendUnavailable(detail)

    @staticmethod
    def _final_error(
        error: WalstreamError, write: bool, maybe_applied: bool, attempts: int
    ) -> WalstreamError:
        if isinstance(error, PreconditionFailed) and maybe_applied:
            return ConditionalOutcomeUnknown(
                f"{error}; an earlier attempt of this write may have created it"
            )
        if isinstance(error, (NotFound, PreconditionFailed, InvalidArgument)):
            return error
        if write and (maybe_applied or isinstance(error, AmbiguousError)):
            return AmbiguousError(
                f"{error} (after {attempts} attempts); the write may have been applied — "
                "read back before retrying"
            )
        if isinstance(error, AmbiguousError):
            # A read that kept failing after sending: nothing was changed.
            return BackendUnavailable(f"{error} (after {attempts} attempts); retry later")
        if attempts > 1 and not isinstance(error, Throttled):
            return BackendUnavailable(f"{error} (after {attempts} attempts)")
        return error

    async def close(self) -> None:
        """Close the client of the running loop (others belong to loops that are gone)."""
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            return
        state = self._clients.pop(loop, None)
        if state is not None and state.exit is not None:
            await state.exit(None, None, None)
