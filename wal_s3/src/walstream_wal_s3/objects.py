"""The S3 object store: :class:`walstream.objects.ObjectStore` on any S3-compatible endpoint.

Keys given by callers are relative; they are stored under ``settings.prefix``. Large objects go
up as multipart uploads whose parts are uploaded concurrently and which are aborted on failure,
so a failed ``put`` leaves neither an object nor billed orphan parts.

``put_if_absent`` relies on ``If-None-Match: *``. Some S3-compatible stores ignore that header
and overwrite; :meth:`S3ObjectStore.probe_conditional_put` detects it (create a probe key twice)
before the first conditional write. The result lands in ``capabilities.conditional_put``; with
``require_conditional_put`` an ignoring store raises :class:`ConfigError` instead.
"""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import AsyncIterator, Iterable
from dataclasses import replace
from typing import Any

from walstream.clock import make_rng
from walstream.errors import (
    AmbiguousError,
    BackendUnavailable,
    ConfigError,
    InvalidArgument,
    NotFound,
    PreconditionFailed,
)
from walstream.objects import ObjectMeta, ObjectStore, ObjectStoreCapabilities, ObjectWriter

from .client import (
    ConditionalOutcomeUnknown,
    RangeNotSatisfiable,
    S3Client,
    S3Settings,
    UnansweredWrite,
)

__all__ = ["MAX_DELETE_KEYS", "MIN_PART_BYTES", "S3ObjectStore", "S3ObjectWriter"]

log = logging.getLogger(__name__)

MIN_PART_BYTES = 5 << 20
"""S3's smallest multipart part (every part but the last)."""
MAX_DELETE_KEYS = 1000
"""S3's limit of keys per DeleteObjects call."""
_PROBE_PREFIX = ".walstream-probe/"


class S3ObjectStore(ObjectStore):
    """Objects in one S3 bucket under a prefix."""

    def __init__(
        self,
        settings: S3Settings,
        *,
        multipart_threshold_bytes: int = 16 << 20,
        multipart_part_bytes: int = 8 << 20,
        part_concurrency: int = 4,
        require_conditional_put: bool = False,
        client: S3Client | None = None,
        rng: random.Random | None = None,
    ) -> None:
        if multipart_part_bytes < MIN_PART_BYTES:
            raise ConfigError(
                f"multipart_part_size: S3 parts must be at least {MIN_PART_BYTES} bytes, "
                f"got {multipart_part_bytes}"
            )
        self.settings = settings
        self.client = client or S3Client(settings, rng=rng)
        self._owns_client = client is None
        self.multipart_threshold_bytes = max(multipart_threshold_bytes, multipart_part_bytes)
        self.multipart_part_bytes = multipart_part_bytes
        self.part_concurrency = max(1, part_concurrency)
        self.require_conditional_put = require_conditional_put
        self.capabilities = ObjectStoreCapabilities(
            conditional_put=True, list_page_size=1000, extra={"probed": False}
        )
        self._rng = rng or make_rng(None)
        self._probe_result: bool | None = None

    # -- keys -----

    def _full(self, key: str) -> str:
        return self.settings.prefix + key

    def _relative(self, full_key: str) -> str:
        return full_key[len(self.settings.prefix) :]

    # -- the contract -----

    async def put(self, key: str, data: bytes) -> None:
        if len(data) > self.multipart_threshold_bytes:
            await self._put_multipart(self._full(key), data, if_none_match=False)
        else:
            await self.client.call("put_object", write=True, Key=self._full(key), Body=data)

    async def put_if_absent(self, key: str, data: bytes) -> None:
        """Create ``key`` only if it does not exist (``If-None-Match: *``, on the single PUT and
        on the completion of a multipart upload). On an endpoint that ignores the header the
        key is looked up first: that still refuses to replace an object that exists, though two
        concurrent creators can then both succeed (``capabilities.conditional_put`` is False)."""
        supported = await self.ensure_probed()
        full_key = self._full(key)
        if not supported:
            try:
                await self._head_full(full_key)
            except NotFound:
                pass
            else:
                raise PreconditionFailed(f"object {full_key!r} already exists")
        await self._put_if_absent(full_key, bytes(data))

    async def _put_if_absent(self, full_key: str, data: bytes) -> None:
        try:
            if len(data) > self.multipart_threshold_bytes:
                await self._put_multipart(full_key, data, if_none_match=True)
            else:
                await self.client.call(
                    "put_object", write=True, Key=full_key, Body=data, IfNoneMatch="*"
                )
        except ConditionalOutcomeUnknown:
            # An earlier attempt may have created the object: it is ours if it holds our bytes.
            # (Callers that need to tell identical creators apart put a unique token in data.)
            try:
                existing = await self._get_full(full_key, 0, None)
            except NotFound:
                existing = None
            if existing != data:
                raise PreconditionFailed(
                    f"object {full_key!r} already exists (created by another writer)"
                ) from None

    async def get(self, key: str, start: int = 0, end: int | None = None) -> bytes:
        return await self._get_full(self._full(key), start, end)

    async def _get_full(self, full_key: str, start: int, end: int | None) -> bytes:
        if start < 0:
            if end is not None:
                raise InvalidArgument("a suffix read (negative start) takes no end")
            byte_range: str | None = f"bytes={start}"
        elif end is None:
            byte_range = f"bytes={start}-" if start > 0 else None
        elif end <= start:
            await self._head_full(full_key)
            return b""
        else:
            byte_range = f"bytes={start}-{end - 1}"
        params: dict[str, Any] = {"Key": full_key}
        if byte_range is not None:
            params["Range"] = byte_range
        try:
            response = await self.client.call("get_object", read_body=True, **params)
        except RangeNotSatisfiable:
            # The range starts at or past the end (or the object is empty): clamp to nothing.
            await self._head_full(full_key)
            return b""
        body: bytes = response["Body"]
        expected = response.get("ContentLength")
        if expected is not None and expected != len(body):
            raise BackendUnavailable(
                f"S3 get_object {full_key!r}: got {len(body)} of {expected} bytes; retry"
            )
        return body

    async def head(self, key: str) -> ObjectMeta:
        return await self._head_full(self._full(key), relative=key)

    async def _head_full(self, full_key: str, relative: str | None = None) -> ObjectMeta:
        response = await self.client.call("head_object", Key=full_key)
        return ObjectMeta(relative or self._relative(full_key), int(response["ContentLength"]))

    async def delete(self, keys: Iterable[str]) -> None:
        await self._delete_full([self._full(key) for key in keys])

    async def _delete_full(self, full_keys: list[str]) -> None:
        unique = list(dict.fromkeys(full_keys))
        for first in range(0, len(unique), MAX_DELETE_KEYS):
            chunk = unique[first : first + MAX_DELETE_KEYS]
            response = await self.client.call(
                "delete_objects",
                write=True,
                Delete={"Objects": [{"Key": key} for key in chunk], "Quiet": True},
            )
            errors = [
                error for error in response.get("Errors", []) if error.get("Code") != "NoSuchKey"
            ]
            if errors:
                sample = errors[0]
                raise BackendUnavailable(
                    f"S3 delete_objects: {len(errors)} of {len(chunk)} keys not deleted "
                    f"(first: {sample.get('Key')!r}: {sample.get('Code')} "
                    f"{sample.get('Message', '')}); deleting is idempotent, retry"
                )

    async def list(
        self, prefix: str = "", *, start_after: str | None = None, limit: int | None = None
    ) -> AsyncIterator[ObjectMeta]:
        """Keys starting with ``prefix`` in lexicographic order, page by page.

        ``start_after`` (a relative key) skips keys up to and including it; ``limit`` stops
        after that many keys (one small request when ``limit`` is small).
        """
        params: dict[str, Any] = {"Prefix": self._full(prefix)}
        if start_after is not None:
            params["StartAfter"] = self._full(start_after)
        listed = 0
        while True:
            if limit is not None:
                params["MaxKeys"] = max(1, min(1000, limit - listed))
            response = await self.client.call("list_objects_v2", **params)
            for item in response.get("Contents", []):
                yield ObjectMeta(self._relative(item["Key"]), int(item["Size"]))
                listed += 1
                if limit is not None and listed >= limit:
                    return
            token = response.get("NextContinuationToken")
            if not response.get("IsTruncated") or not token:
                return
            params["ContinuationToken"] = token

    def writer(self, key: str, *, if_absent: bool = False) -> ObjectWriter:
        """A streaming multipart writer; with ``if_absent`` its completion carries
        ``If-None-Match: *`` (``PreconditionFailed`` if the key exists, never a replacement)."""
        return S3ObjectWriter(self, self._full(key), if_none_match=if_absent)

    async def close(self) -> None:
        if self._owns_client:
            await self.client.close()

    def describe(self) -> dict[str, Any]:
        return {
            "type": "s3",
            **self.settings.describe(),
            "multipart_threshold_bytes": self.multipart_threshold_bytes,
            "multipart_part_bytes": self.multipart_part_bytes,
            "conditional_put": self._probe_result,
        }

    async def check(self) -> None:
        """The bucket exists and takes writes: the conditional-write probe writes (and deletes)
        one key, so a missing bucket or bad credentials fail the node's start."""
        await self.ensure_probed()

    # -- conditional-write probe -----

    async def ensure_probed(self) -> bool:
        """Probe once whether the endpoint honours ``If-None-Match: *`` (see module doc)."""
        if self._probe_result is None:
            supported = await self.probe_conditional_put()
            self._probe_result = supported
            self.capabilities = replace(
                self.capabilities, conditional_put=supported, extra={"probed": True}
            )
            if not supported:
                message = (
                    f"S3 endpoint {self.settings.endpoint_url or 'AWS'} bucket "
                    f"{self.settings.bucket!r} ignores conditional writes (If-None-Match: *): "
                    "put_if_absent cannot detect a concurrent creator"
                )
                if self.require_conditional_put:
                    raise ConfigError(
                        f"{message}. Use a store that supports conditional writes, or set "
                        "require_conditional_put: false to accept the risk"
                    )
                log.warning("%s; capabilities.conditional_put is False", message)
        return self._probe_result

    async def require_conditional(self, why: str) -> None:
        """Raise :class:`ConfigError` unless conditional writes work (``why`` says who needs
        them)."""
        if not await self.ensure_probed():
            raise ConfigError(
                f"S3 bucket {self.settings.bucket!r} at "
                f"{self.settings.endpoint_url or 'AWS'} ignores conditional writes, but {why}; "
                "use an S3 store that honours If-None-Match"
            )

    async def probe_conditional_put(self) -> bool:
        token = f"{self._rng.getrandbits(64):016x}"
        probe_key = self._full(f"{_PROBE_PREFIX}{token}")
        try:
            await self.client.call(
                "put_object", write=True, Key=probe_key, Body=b"first", IfNoneMatch="*"
            )
        except UnansweredWrite as exc:
            # A throw-away key: whether it was written does not matter, the endpoint is down.
            raise BackendUnavailable(f"{exc.detail} (start-up probe)") from exc
        try:
            await self.client.call(
                "put_object", write=True, Key=probe_key, Body=b"second", IfNoneMatch="*"
            )
            supported = False
        except PreconditionFailed:
            supported = True
        finally:
            try:
                await self._delete_full([probe_key])
            except BackendUnavailable as exc:
                log.warning("could not delete probe object %s: %s", probe_key, exc)
        return supported

    # -- multipart -----

    async def _put_multipart(self, full_key: str, data: bytes, *, if_none_match: bool) -> None:
        writer = S3ObjectWriter(self, full_key, if_none_match=if_none_match)
        async with writer:
            view = memoryview(data)
            part = self.multipart_part_bytes
            for first in range(0, len(data), part):
                await writer.write(view[first : first + part])


class S3ObjectWriter(ObjectWriter):
    """Streaming multipart upload: parts go up concurrently as they fill; ``close`` completes
    (nothing is visible before), ``abort`` or any failure aborts the upload."""

    def __init__(self, store: S3ObjectStore, full_key: str, *, if_none_match: bool = False) -> None:
        self._store = store
        self._client = store.client
        self._key = full_key
        self._if_none_match = if_none_match
        self._buffer = bytearray()
        self._size = 0
        self._upload_id: str | None = None
        self._parts: dict[int, str] = {}
        self._tasks: list[asyncio.Task[None]] = []
        self._slots = asyncio.Semaphore(store.part_concurrency)
        self._finished = False

    async def write(self, data: bytes | memoryview) -> None:
        if self._finished:
            raise InvalidArgument("write() after close()/abort()")
        self._buffer += data
        self._size += len(data)
        part_bytes = self._store.multipart_part_bytes
        while len(self._buffer) >= part_bytes:
            part = bytes(self._buffer[:part_bytes])
            del self._buffer[:part_bytes]
            await self._start_part(part)

    async def _start_part(self, part: bytes) -> None:
        self._raise_part_failure()
        if self._upload_id is None:
            response = await self._client.call("create_multipart_upload", write=True, Key=self._key)
            self._upload_id = str(response["UploadId"])
        await self._slots.acquire()  # back-pressure: at most part_concurrency parts in memory
        number = len(self._tasks) + 1
        self._tasks.append(asyncio.create_task(self._upload_part(number, part)))

    async def _upload_part(self, number: int, part: bytes) -> None:
        try:
            response = await self._client.call(
                "upload_part",
                write=True,
                Key=self._key,
                UploadId=self._upload_id,
                PartNumber=number,
                Body=part,
            )
            self._parts[number] = str(response["ETag"])
        finally:
            self._slots.release()

    def _raise_part_failure(self) -> None:
        for task in self._tasks:
            if task.done() and not task.cancelled() and task.exception() is not None:
                raise task.exception()  # type: ignore[misc]

    async def close(self) -> ObjectMeta:
        if self._finished:
            raise InvalidArgument("close() after close()/abort()")
        try:
            if self._upload_id is None:
                params: dict[str, Any] = {"Key": self._key, "Body": bytes(self._buffer)}
                if self._if_none_match:
                    params["IfNoneMatch"] = "*"
                await self._client.call("put_object", write=True, **params)
            else:
                if self._buffer or not self._tasks:
                    await self._start_part(bytes(self._buffer))
                self._buffer = bytearray()
                await asyncio.gather(*self._tasks)
                params = {
                    "Key": self._key,
                    "UploadId": self._upload_id,
                    "MultipartUpload": {
                        "Parts": [
                            {"PartNumber": number, "ETag": self._parts[number]}
                            for number in sorted(self._parts)
                        ]
                    },
                }
                if self._if_none_match:
                    params["IfNoneMatch"] = "*"
                await self._client.call("complete_multipart_upload", write=True, **params)
        except BaseException:
            # Aborting is harmless even when an ambiguous completion did happen: S3 answers
            # NoSuchUpload and the object stays.
            await self._abort_quietly()
            raise
        finally:
            self._finished = True
            self._buffer = bytearray()
        return ObjectMeta(self._store._relative(self._key), self._size)

    async def abort(self) -> None:
        if self._finished:
            return
        self._finished = True
        self._buffer = bytearray()
        await self._abort_quietly()

    async def _abort_quietly(self) -> None:
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        if self._upload_id is None:
            return
        upload_id, self._upload_id = self._upload_id, None
        try:
            await self._client.call(
                "abort_multipart_upload", write=True, Key=self._key, UploadId=upload_id
            )
        except NotFound:
            pass
        except BackendUnavailable as exc:
            log.warning(
                "could not abort multipart upload %s of %s (%s); a bucket lifecycle rule "
                "for incomplete uploads will remove it",
                upload_id,
                self._key,
                exc,
            )
        except AmbiguousError as exc:
            log.warning("abort of multipart upload %s of %s unclear: %s", upload_id, self._key, exc)
