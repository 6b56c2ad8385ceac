"""Zonal S3 endpoints for tests and benchmarks: one moto server process per availability zone.

Each :class:`ZoneServer` is a child process running moto's S3 on a fixed ``127.0.0.1`` port
with one directory bucket (``<name>--<zone>--x-s3``). A zone can fail in the three ways a test
needs, and come back on the same port:

- :meth:`ZoneServer.kill` — SIGKILL: the zone is gone *with its storage* (moto keeps objects in
  memory). :meth:`ZoneServer.start` brings up an empty zone and re-creates the bucket, like a
  zone whose data was lost: the WAL must re-replicate everything to it.
- :meth:`ZoneServer.freeze` / :meth:`ZoneServer.thaw` — SIGSTOP/SIGCONT: the zone hangs
  (connections open, nothing answers) and later returns with its data intact.

:func:`zone_servers` starts N of them; :func:`provision` is the factory's provisioning hook
(three zones, yields WAL options). Run by hand:
``python -m walstream_wal_s3express.testing.zones PORT``
prints ``PORT <n>`` once listening and serves until its standard input closes.
"""

from __future__ import annotations

import contextlib
import sys
import threading
from collections.abc import Iterator, Sequence
from typing import Any

from walstream_conformance.harness.child import ChildServer

__all__ = [
    "DEFAULT_ZONES",
    "TEST_CREDENTIALS",
    "ZoneServer",
    "create_directory_bucket",
    "directory_bucket_name",
    "provision",
    "zone_servers",
    "zone_wal_options",
]

TEST_CREDENTIALS = {"access_key_id": "walstream-test", "secret_access_key": "walstream-test"}
DEFAULT_ZONES = ("use1-az4", "use1-az5", "use1-az6")


def directory_bucket_name(base: str, zone_id: str) -> str:
    """S3 Express directory bucket names end in ``--<zone id>--x-s3``."""
    return f"{base}--{zone_id}--x-s3"


def create_directory_bucket(endpoint_url: str, bucket: str, zone_id: str) -> None:
    """Create a directory bucket in ``zone_id`` (idempotent)."""
    import boto3  # a moto dependency: present wherever the test servers run
    from botocore.config import Config
    from botocore.exceptions import ClientError

    client = boto3.client(
        "s3",
        endpoint_url=endpoint_url,
        region_name="us-east-1",
        aws_access_key_id=TEST_CREDENTIALS["access_key_id"],
        aws_secret_access_key=TEST_CREDENTIALS["secret_access_key"],
        config=Config(s3={"disable_s3_express_session_auth": True}),
    )
    try:
        client.create_bucket(
            Bucket=bucket,
            CreateBucketConfiguration={
                "Location": {"Type": "AvailabilityZone", "Name": zone_id},
                "Bucket": {"Type": "Directory", "DataRedundancy": "SingleAvailabilityZone"},
            },
        )
    except ClientError as exc:
        if exc.response.get("Error", {}).get("Code") not in {
            "BucketAlreadyOwnedByYou",
            "BucketAlreadyExists",
        }:
            raise
    finally:
        client.close()


class ZoneServer(ChildServer):
    """moto's S3 for one availability zone, in a child process, on a port that survives
    restarts. :meth:`kill` loses its objects; :meth:`freeze` makes it hang."""

    start_hint = ""

    def __init__(self, zone_id: str, bucket_base: str = "walstream") -> None:
        super().__init__(f"zone {zone_id}")
        self.zone_id = zone_id
        self.bucket = directory_bucket_name(bucket_base, zone_id)

    def command(self) -> list[str]:
        return [sys.executable, "-m", "walstream_wal_s3express.testing.zones", str(self.port)]

    def start(self) -> str:
        """Start (or restart after :meth:`kill`) the zone on its port, with an empty bucket."""
        if not self.running:
            super().start()
            create_directory_bucket(self.endpoint_url, self.bucket, self.zone_id)
        return self.endpoint_url

    def stop(self) -> None:
        """Shut the zone down (end of a test); its objects are discarded either way."""
        self.kill()

    def __enter__(self) -> ZoneServer:
        self.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()


@contextlib.contextmanager
def zone_servers(
    zones: Sequence[str] = DEFAULT_ZONES, bucket_base: str = "walstream"
) -> Iterator[list[ZoneServer]]:
    """Start one :class:`ZoneServer` per zone (in parallel); stop them all at the end."""
    servers = [ZoneServer(zone, bucket_base) for zone in zones]
    errors: list[BaseException] = []

    def start(server: ZoneServer) -> None:
        try:
            server.start()
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=start, args=(server,)) for server in servers]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    try:
        if errors:
            raise errors[0]
        yield servers
    finally:
        for server in servers:
            server.stop()


def zone_wal_options(servers: Sequence[ZoneServer], **overrides: Any) -> dict[str, Any]:
    """The ``wal:`` section (type s3express) for these zones."""
    return {
        "buckets": [server.bucket for server in servers],
        "endpoint_urls": [server.endpoint_url for server in servers],
        "region": "us-east-1",
        **TEST_CREDENTIALS,
        **overrides,
    }


@contextlib.contextmanager
def provision(tmp_path: Any = None) -> Iterator[dict[str, Any]]:
    """Three throwaway zones on 127.0.0.1; yields the WAL options for them."""
    with zone_servers() as servers:
        yield zone_wal_options(servers, request_timeout="1s", write_timeout="3s")


# -- the child process -------------------------------------------------------------------------


if __name__ == "__main__":
    if len(sys.argv) != 2 or not sys.argv[1].isdigit():
        sys.exit("usage: python -m walstream_wal_s3express.testing.zones PORT  (0: any free port)")
    from walstream_wal_s3.testing.moto import serve_moto

    serve_moto(int(sys.argv[1]))
