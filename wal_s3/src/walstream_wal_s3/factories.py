"""Entry points: ``s3`` in ``walstream.object_store`` and ``s3`` in ``walstream.wal``.

YAML examples::

    object_store: {type: s3, bucket: data, endpoint_url: http://127.0.0.1:9000}
    wal: {type: s3, bucket: wal, endpoint_url: http://127.0.0.1:9000,
          max_batch_bytes: 8MiB, max_batch_interval: 250ms}

Credentials come from the AWS chain (environment, profile, instance role) unless
``access_key_id``/``secret_access_key`` (and ``session_token``) are set, typically as
``${ENV}`` references that the deployment loader expands.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from walstream.config import BackendFactory, BuildContext, Option, validate_options

from .client import S3Settings
from .objects import S3ObjectStore
from .wal import S3Wal

__all__ = ["CONNECTION_OPTIONS", "S3_OBJECT_STORE", "S3_WAL"]

CONNECTION_OPTIONS: tuple[Option, ...] = (
    Option("bucket", "str", "S3 bucket name", required=True),
    Option("prefix", "str", "key prefix inside the bucket", default=""),
    Option("endpoint_url", "str", "S3-compatible endpoint (unset: AWS S3)"),
    Option("region", "str", "AWS region (unset: the AWS chain's, else us-east-1)"),
    Option("access_key_id", "str", "access key (unset: the AWS credential chain); use ${ENV}"),
    Option("secret_access_key", "str", "secret key, with access_key_id; use ${ENV}"),
    Option("session_token", "str", "temporary session token; use ${ENV}"),
    Option("max_pool_connections", "int", "HTTP connections per event loop", default=32,
           minimum=1),
    Option("create_bucket", "bool", "create the bucket if it does not exist", default=False),
    Option("connect_timeout", "duration", "bound of one connect", default="5s"),
    Option("read_timeout", "duration", "bound of each read of an answer", default="10s"),
    Option("request_timeout", "duration",
           "bound of one S3 operation, all attempts included; then BackendUnavailable (or "
           "AmbiguousError for a write that may have been applied)", default="30s"),
    Option("slow_warning", "duration",
           "log a WARNING naming the endpoint and operation after this long without an answer",
           default="5s"),
)

_STORE_OPTIONS: tuple[Option, ...] = (
    Option("multipart_threshold", "size", "objects larger than this use multipart upload",
           default="16MiB"),
    Option("multipart_part_size", "size", "multipart part size (S3 minimum 5MiB)",
           default="8MiB", minimum=5 << 20),
    Option("require_conditional_put", "bool",
           "fail at start if the store ignores If-None-Match (else warn)", default=False),
)

_WAL_OPTIONS: tuple[Option, ...] = (
    Option("max_batch_bytes", "size", "a WAL object is cut at this size", default="8MiB",
           minimum=1),
    Option("max_batch_interval", "duration",
           "while PUTs are in flight, appends wait at most this long for company",
           default="250ms"),
    Option("max_inflight", "int", "WAL object PUTs in flight at once", default=8, minimum=1),
    Option("fence_lease", "duration",
           "acknowledge without a LIST of epoch markers this long after one showed this writer "
           "the owner; a new owner waits it out unless the writer closed cleanly (0: a LIST "
           "after every group)", default="1s"),
)


def _make_store(options: dict[str, Any], context: BuildContext) -> S3ObjectStore:
    return S3ObjectStore(
        S3Settings.from_options(options),
        multipart_threshold_bytes=options["multipart_threshold"],
        multipart_part_bytes=options["multipart_part_size"],
        require_conditional_put=bool(options["require_conditional_put"]),
    )


def _make_wal(options: dict[str, Any], context: BuildContext) -> S3Wal:
    return S3Wal(
        S3ObjectStore(S3Settings.from_options(options), require_conditional_put=True),
        max_batch_bytes=options["max_batch_bytes"],
        max_batch_interval_s=options["max_batch_interval"],
        max_inflight=options["max_inflight"],
        fence_lease_s=options["fence_lease"],
    )


def _provisioner(factory_name: str) -> Any:
    @contextlib.contextmanager
    def provision(tmpdir: Path) -> Iterator[dict[str, Any]]:
        """A throwaway moto S3 server with one bucket; yields validated options."""
        from .testing.moto import provision_moto

        with provision_moto() as bucket:
            factory = S3_WAL if factory_name == "wal" else S3_OBJECT_STORE
            yield validate_options(factory, bucket.options(), tmpdir, factory_name)

    return provision


S3_OBJECT_STORE: BackendFactory[S3ObjectStore] = BackendFactory(
    kind="object_store",
    name="s3",
    description="objects in an S3 bucket (AWS S3 or any S3-compatible endpoint)",
    options=CONNECTION_OPTIONS + _STORE_OPTIONS,
    create=_make_store,
    provision=_provisioner("object_store"),
)

S3_WAL: BackendFactory[S3Wal] = BackendFactory(
    kind="wal",
    name="s3",
    description="WAL of batched S3 objects, fenced with conditional creates",
    options=CONNECTION_OPTIONS + _WAL_OPTIONS,
    create=_make_wal,
    provision=_provisioner("wal"),
)
