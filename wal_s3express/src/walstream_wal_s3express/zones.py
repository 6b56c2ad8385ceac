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
(three zones, yields WAL options). Run by hand: ``python -m walstream_wal_s3express.zones PORT``
prints ``PORT <n>`` once listening and serves until its standard input closes.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import tempfile
import threading
from collections.abc import Iterator, Sequence
from typing import Any

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


class ZoneServer:
    """moto's S3 for one availability zone, in a child process, on a port that survives
    restarts."""

    def __init__(self, zone_id: str, bucket_base: str = "walstream") -> None:
        self.zone_id = zone_id
        self.bucket = directory_bucket_name(bucket_base, zone_id)
        self.port = 0
        self._process: subprocess.Popen[str] | None = None
        self._log: Any = None
        self._frozen = False

    @property
    def endpoint_url(self) -> str:
        if not self.port:
            raise RuntimeError(f"zone {self.zone_id} was never started")
        return f"http://127.0.0.1:{self.port}"

    @property
    def running(self) -> bool:
        return self._process is not None and self._process.poll() is None

    def start(self) -> None:
        """Start (or restart after :meth:`kill`) the zone on its port, with an empty bucket."""
        if self.running:
            return
        self._log = tempfile.TemporaryFile(mode="w+")
        self._process = subprocess.Popen(
            [sys.executable, "-m", "walstream_wal_s3express.zones", str(self.port)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self._log,
            text=True,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )
        assert self._process.stdout is not None
        line = self._process.stdout.readline()
        if not line.startswith("PORT "):
            self._reap(kill=True)
            raise RuntimeError(f"zone {self.zone_id} failed to start: {self._read_log()}")
        self.port = int(line.split()[1])
        self._frozen = False
        create_directory_bucket(self.endpoint_url, self.bucket, self.zone_id)

    def kill(self) -> None:
        """SIGKILL the zone: it stops answering at once and its objects are lost."""
        self._reap(kill=True)

    def freeze(self) -> None:
        """SIGSTOP the zone: connections hang until :meth:`thaw`."""
        if self._process is not None and not self._frozen:
            os.kill(self._process.pid, signal.SIGSTOP)
            self._frozen = True

    def thaw(self) -> None:
        if self._process is not None and self._frozen:
            os.kill(self._process.pid, signal.SIGCONT)
            self._frozen = False

    def stop(self) -> None:
        """Shut the zone down (end of a test); its objects are discarded either way."""
        self._reap(kill=True)

    def _reap(self, *, kill: bool) -> None:
        process, self._process = self._process, None
        if process is not None:
            if self._frozen:
                os.kill(process.pid, signal.SIGCONT)
                self._frozen = False
            if kill:
                process.kill()
            else:
                with contextlib.suppress(OSError):
                    assert process.stdin is not None
                    process.stdin.close()
            try:
                process.wait(timeout=5)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
            for stream in (process.stdin, process.stdout):
                with contextlib.suppress(OSError):
                    if stream is not None:
                        stream.close()
        if self._log is not None:
            self._log.close()
            self._log = None

    def _read_log(self) -> str:
        if self._log is None:
            return ""
        self._log.seek(0)
        return str(self._log.read())[-2000:]

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
        sys.exit("usage: python -m walstream_wal_s3express.zones PORT  (0: any free port)")
    from walstream_wal_s3.testing import serve_moto

    serve_moto(int(sys.argv[1]))
