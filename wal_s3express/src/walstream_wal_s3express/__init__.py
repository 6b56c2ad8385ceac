"""walstream WAL over zonal S3 Express directory buckets: every chunk is written to one bucket per
availability zone and acknowledged at a write quorum (2 of 3 by default).

``type: s3express`` in a deployment's ``wal:`` section::

    wal:
      type: s3express
      buckets: [wal--use1-az4--x-s3, wal--use1-az5--x-s3, wal--use1-az6--x-s3]
      region: us-east-1
      max_chunk_bytes: 512KiB

The quorum protocol (fencing, tail resolution, catch-up of a zone that was down) lives in
:mod:`walstream.wal.quorum`; this package stores a replica in a bucket
(:class:`~walstream_wal_s3express.replica.ZonalBucketReplica`) and adds configuration.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from walstream.config import BackendFactory, BuildContext, Option, validate_options
from walstream.errors import ConfigError
from walstream.wal.quorum import (
    QuorumWal,
    quorum_option_set,
    quorum_wal_options,
    write_quorum_of,
)
from walstream_wal_s3.client import RetryPolicy, S3Settings

from .replica import DEFAULT_FENCE_LEASE_S, ZonalBucketReplica, ZonalS3Client

__all__ = [
    "S3EXPRESS_WAL",
    "S3ExpressWal",
    "ZonalBucketReplica",
    "ZonalS3Client",
    "build_replicas",
    "create_wal",
]

DIRECTORY_BUCKET_SUFFIX = "--x-s3"

#: Each S3 request is retried briefly by the client; the quorum WAL retries a zone for longer
#: (up to ``write_timeout``) and in the background, so a dead zone must fail fast here.
ZONE_RETRY = RetryPolicy(
    max_attempts=3, base_delay_s=0.01, max_delay_s=0.1, throttle_base_delay_s=0.05
)
#: Chunks catch-up copies to a returning zone at once: an object store answers each request in
#: milliseconds, not microseconds, so copying one chunk at a time would let a busy writer outrun
#: the zone it is trying to repair.
ZONE_CATCH_UP_PARALLELISM = 8


class S3ExpressWal(QuorumWal):
    """A :class:`QuorumWal` whose replicas are zonal directory buckets (built by
    :func:`create_wal` with :data:`ZONE_CATCH_UP_PARALLELISM`)."""

    def request_counts(self) -> dict[str, dict[str, int]]:
        """S3 requests sent per zone and operation (cost accounting: PUTs per GiB, ...)."""
        return {
            replica.name: dict(replica.client.request_counts)  # type: ignore[attr-defined]
            for replica in self.replicas
        }

    def describe(self) -> dict[str, Any]:
        return {**super().describe(), "type": "s3express"}


def _zone_of(bucket: str) -> str | None:
    """``name--use1-az4--x-s3`` → ``use1-az4``."""
    if not bucket.endswith(DIRECTORY_BUCKET_SUFFIX):
        return None
    parts = bucket[: -len(DIRECTORY_BUCKET_SUFFIX)].rsplit("--", 1)
    return parts[1] if len(parts) == 2 and parts[0] and parts[1] else None


def build_replicas(options: dict[str, Any], node_id: int) -> list[ZonalBucketReplica]:
    buckets: list[str] = list(options["buckets"] or [])
    if not buckets:
        raise ConfigError("wal.buckets: list one S3 Express directory bucket per zone")
    if len(set(buckets)) != len(buckets):
        raise ConfigError("wal.buckets: a bucket is listed twice")
    zones = [_zone_of(bucket) for bucket in buckets]
    for bucket, zone in zip(buckets, zones, strict=True):
        if zone is None:
            raise ConfigError(
                f"wal.buckets: {bucket!r} is not a directory bucket name; S3 Express buckets "
                "are named NAME--ZONE-ID--x-s3 (e.g. wal--use1-az4--x-s3)"
            )
    if len(set(zones)) != len(zones):
        raise ConfigError(
            "wal.buckets: two buckets are in the same availability zone; a quorum over one zone "
            "does not survive losing it — use one bucket per zone"
        )
    endpoints: list[str | None] = list(options.get("endpoint_urls") or [])
    if endpoints and len(endpoints) != len(buckets):
        raise ConfigError(
            f"wal.endpoint_urls: give one endpoint per bucket ({len(buckets)}), got "
            f"{len(endpoints)}"
        )
    if not endpoints:
        endpoints = [None] * len(buckets)
    request_timeout_s = float(options["request_timeout"])
    replicas = []
    for bucket, endpoint in zip(buckets, endpoints, strict=True):
        try:
            settings = S3Settings(
                bucket=bucket,
                prefix=str(options.get("prefix") or ""),
                endpoint_url=endpoint or None,
                region=options.get("region") or None,
                access_key_id=options.get("access_key_id") or None,
                secret_access_key=options.get("secret_access_key") or None,
                session_token=options.get("session_token") or None,
                max_pool_connections=int(options.get("max_pool_connections") or 32),
                connect_timeout_s=min(request_timeout_s, 5.0),
                read_timeout_s=request_timeout_s,
                retry=ZONE_RETRY,
            )
        except ValueError as exc:
            raise ConfigError(f"wal: {exc}") from None
        replicas.append(
            ZonalBucketReplica.from_settings(
                settings,
                node_id=node_id,
                fence_lease_s=float(options.get("fence_lease", DEFAULT_FENCE_LEASE_S)),
            )
        )
    return replicas


def create_wal(options: dict[str, Any], context: BuildContext) -> S3ExpressWal:
    replicas = build_replicas(options, context.node_id)
    write_quorum = write_quorum_of(
        options.get("write_quorum"),
        len(replicas),
        key="wal.write_quorum",
        among=f"the {len(replicas)} buckets",
    )
    return S3ExpressWal(
        replicas,
        log_id=options.get("log_id") or f"node-{context.node_id}",
        write_quorum=write_quorum,
        catch_up_parallelism=ZONE_CATCH_UP_PARALLELISM,
        **quorum_wal_options(options),
    )


@contextlib.contextmanager
def provision(tmp_path: Path | None = None) -> Iterator[dict[str, Any]]:
    """Three throwaway zones (moto servers on 127.0.0.1) with a directory bucket each."""
    from .testing.zones import provision as provision_zones

    with provision_zones(tmp_path) as options:
        yield validate_options(S3EXPRESS_WAL, options, tmp_path or Path.cwd(), "wal")


_QUORUM = quorum_option_set(
    replica="zone",
    log_place="in the buckets",
    acknowledged_by="zones",
    max_chunk_bytes="512KiB",
    max_chunk_bytes_minimum=1,
    max_chunk_delay="5ms",
)

S3EXPRESS_WAL: BackendFactory[S3ExpressWal] = BackendFactory(
    kind="wal",
    name="s3express",
    description="WAL replicated to one S3 Express directory bucket per availability zone, "
    "acknowledged at a write quorum",
    options=(
        Option(
            "buckets", "str_list", "one directory bucket per zone (NAME--ZONE--x-s3)", required=True
        ),
        Option(
            "endpoint_urls",
            "str_list",
            "one S3-compatible endpoint per bucket (unset: AWS; set: no session auth)",
        ),
        Option("region", "str", "AWS region of the buckets"),
        Option("prefix", "str", "key prefix inside every bucket", default=""),
        _QUORUM.log_id,
        _QUORUM.write_quorum,
        *_QUORUM.tuning,
        Option("max_pool_connections", "int", "HTTP connections per zone", default=32, minimum=1),
        Option(
            "fence_lease",
            "duration",
            "a chunk counts towards the quorum without a successor check this long after one "
            "found this writer unsuperseded on its zone; a claim over the writer waits it out "
            "(0: a check after every chunk)",
            default="500ms",
        ),
        Option("access_key_id", "str", "access key (unset: the AWS credential chain); use ${ENV}"),
        Option("secret_access_key", "str", "secret key, with access_key_id; use ${ENV}"),
        Option("session_token", "str", "temporary session token; use ${ENV}"),
    ),
    create=create_wal,
    provision=provision,
)
