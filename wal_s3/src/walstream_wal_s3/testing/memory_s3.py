"""An S3 bucket in this process's memory, behind the real :class:`S3Client` (benchmarks).

:class:`MemoryS3Client` is an :class:`S3Client` whose per-loop botocore client is replaced by
:class:`MemoryBucket`: the same calls (``put_object`` with ``IfNoneMatch``, ranged
``get_object``, ``head_object``, ``list_objects_v2`` with ``StartAfter``/``MaxKeys``/
continuation, ``delete_objects``) with S3's answers and errors (botocore ``ClientError`` with
S3's codes and statuses, so retries and error translation run as against S3). Each request first
waits what its :class:`~walstream_wal_s3.testing.latency.LatencyModel` says, then takes effect
at once: the store costs a dictionary operation, so a benchmark measures the WAL and the
latency model, not a Python HTTP server. Everything above the botocore client (retries,
timeouts, request counts) is the production code.

Multipart uploads keep their parts in memory until completed or aborted.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass, field
from typing import Any

from botocore.exceptions import ClientError

from walstream_wal_s3.client import S3Client, S3Settings

from .latency import LatencyModel

__all__ = ["MemoryBucket", "MemoryS3Client"]

_METHODS = {
    "put_object": "PUT",
    "get_object": "GET",
    "head_object": "HEAD",
    "list_objects_v2": "GET",
    "delete_objects": "POST",
    "create_bucket": "PUT",
    "create_multipart_upload": "POST",
    "upload_part": "PUT",
    "complete_multipart_upload": "POST",
    "abort_multipart_upload": "DELETE",
}


def _error(operation: str, status: int, code: str, message: str) -> ClientError:
    return ClientError(
        {
            "Error": {"Code": code, "Message": message},
            "ResponseMetadata": {"HTTPStatusCode": status},
        },
        operation,
    )


class _Body:
    """The ``Body`` of a ``get_object`` answer (an async context manager with ``read``)."""

    def __init__(self, data: bytes) -> None:
        self._data = data

    async def __aenter__(self) -> _Body:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        return None

    async def read(self) -> bytes:
        return self._data


@dataclass
class MemoryBucket:
    """One bucket's objects, sorted by key; ``latency`` delays every request, ``requests``
    counts them by operation."""

    latency: LatencyModel | None = None
    objects: dict[str, bytes] = field(default_factory=dict)
    keys: list[str] = field(default_factory=list)
    requests: dict[str, int] = field(default_factory=dict)
    uploads: dict[str, dict[int, bytes]] = field(default_factory=dict)
    writes: int = 0

    def __getattr__(self, operation: str) -> Any:
        if operation not in _METHODS:
            raise AttributeError(operation)

        async def call(**params: Any) -> dict[str, Any]:
            self.requests[operation] = self.requests.get(operation, 0) + 1
            if self.latency is not None:
                await self.latency.delay(
                    _METHODS[operation], str(params.get("Key") or params.get("Prefix") or "")
                )
            handler = getattr(self, f"_{operation}")
            result: dict[str, Any] = handler(**params)
            return result

        return call

    def _create_bucket(self, **_: Any) -> dict[str, Any]:
        return {}

    def _put_object(
        self, *, Key: str, Body: bytes, IfNoneMatch: str | None = None, **_: Any
    ) -> dict[str, Any]:
        data = bytes(Body)
        if Key in self.objects:
            if IfNoneMatch == "*":
                raise _error(
                    "PutObject",
                    412,
                    "PreconditionFailed",
                    "At least one of the pre-conditions you specified did not hold",
                )
        else:
            bisect.insort(self.keys, Key)
        self.objects[Key] = data
        # Not a digest (hashing every body would cost the rig more than the WAL under test);
        # unique per write, like an ETag.
        self.writes += 1
        return {"ETag": f'"{self.writes:032x}"'}

    def _get_object(self, *, Key: str, Range: str | None = None, **_: Any) -> dict[str, Any]:
        data = self.objects.get(Key)
        if data is None:
            raise _error("GetObject", 404, "NoSuchKey", "The specified key does not exist.")
        if Range is not None:
            spec = Range.removeprefix("bytes=")
            first, _dash, last = spec.partition("-")
            if first == "":
                data = data[-int(last) :] if int(last) else b""
            else:
                start = int(first)
                if start >= len(data):
                    raise _error(
                        "GetObject", 416, "InvalidRange", "The requested range is not satisfiable"
                    )
                data = data[start : int(last) + 1] if last else data[start:]
        return {"Body": _Body(data), "ContentLength": len(data)}

    def _head_object(self, *, Key: str, **_: Any) -> dict[str, Any]:
        data = self.objects.get(Key)
        if data is None:
            raise _error("HeadObject", 404, "404", "Not Found")
        return {"ContentLength": len(data)}

    def _list_objects_v2(
        self,
        *,
        Prefix: str = "",
        StartAfter: str | None = None,
        MaxKeys: int = 1000,
        ContinuationToken: str | None = None,
        **_: Any,
    ) -> dict[str, Any]:
        after = max(StartAfter or "", ContinuationToken or "")
        index = bisect.bisect_right(self.keys, after) if after else 0
        index = max(index, bisect.bisect_left(self.keys, Prefix))
        contents: list[dict[str, Any]] = []
        while index < len(self.keys) and self.keys[index].startswith(Prefix):
            if len(contents) == MaxKeys:
                return {
                    "Contents": contents,
                    "IsTruncated": True,
                    "NextContinuationToken": contents[-1]["Key"],
                }
            key = self.keys[index]
            contents.append({"Key": key, "Size": len(self.objects[key])})
            index += 1
        return {"Contents": contents, "IsTruncated": False}

    def _create_multipart_upload(self, *, Key: str, **_: Any) -> dict[str, Any]:
        upload_id = f"upload-{len(self.uploads)}-{Key}"
        self.uploads[upload_id] = {}
        return {"UploadId": upload_id}

    def _upload_part(
        self, *, UploadId: str, PartNumber: int, Body: bytes, **_: Any
    ) -> dict[str, Any]:
        parts = self.uploads.get(UploadId)
        if parts is None:
            raise _error("UploadPart", 404, "NoSuchUpload", "The upload does not exist")
        parts[PartNumber] = bytes(Body)
        return {"ETag": f'"part-{PartNumber}"'}

    def _complete_multipart_upload(
        self, *, Key: str, UploadId: str, MultipartUpload: dict[str, Any], **params: Any
    ) -> dict[str, Any]:
        parts = self.uploads.get(UploadId)
        if parts is None:
            raise _error(
                "CompleteMultipartUpload", 404, "NoSuchUpload", "The upload does not exist"
            )
        numbers = [part["PartNumber"] for part in MultipartUpload["Parts"]]
        result = self._put_object(
            Key=Key, Body=b"".join(parts[number] for number in numbers), **params
        )
        del self.uploads[UploadId]
        return result

    def _abort_multipart_upload(self, *, UploadId: str, **_: Any) -> dict[str, Any]:
        if self.uploads.pop(UploadId, None) is None:
            raise _error("AbortMultipartUpload", 404, "NoSuchUpload", "The upload does not exist")
        return {}

    def _delete_objects(self, *, Delete: dict[str, Any], **_: Any) -> dict[str, Any]:
        for item in Delete["Objects"]:
            key = item["Key"]
            if self.objects.pop(key, None) is not None:
                del self.keys[bisect.bisect_left(self.keys, key)]
        return {"Errors": []}


class MemoryS3Client(S3Client):
    """An :class:`S3Client` over a :class:`MemoryBucket` (``settings.endpoint_url`` is unused)."""

    def __init__(self, settings: S3Settings, bucket: MemoryBucket) -> None:
        super().__init__(settings)
        self.bucket = bucket

    async def raw(self) -> Any:
        return self.bucket

    async def close(self) -> None:
        return None
