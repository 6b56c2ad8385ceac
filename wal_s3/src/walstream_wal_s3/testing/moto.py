"""A real S3 endpoint for tests and benchmarks: moto in server mode, plus a fault proxy.

- :class:`MotoServer` runs moto's S3 server in a child process on ``127.0.0.1`` with a random
  free port; :meth:`MotoServer.reset` wipes its state (``POST /moto-api/reset``).
- :class:`FaultProxy` is an HTTP proxy (child process) between a client and the moto server
  that injects S3 failures and latency, configured at run time over its admin endpoint:
  errors before the write (500), "written but reported failed" (the request reaches moto, the
  client gets a 500 or a dropped connection), ``503 SlowDown`` bursts and a lognormal latency
  model (p50/p99). Randomness is seeded, so a failing run replays.
- both are :class:`~walstream_conformance.harness.child.ChildServer` children; the pytest
  fixtures over them are in :mod:`walstream_wal_s3.testing.fixtures`.

Run by hand: ``python -m walstream_wal_s3.testing.moto moto`` prints ``PORT <n>`` and serves until
its standard input closes.
"""

from __future__ import annotations

import contextlib
import json
import math
import sys
import threading
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from walstream_conformance.harness.child import ChildServer

__all__ = [
    "TEST_CREDENTIALS",
    "FaultConfig",
    "FaultProxy",
    "MotoServer",
    "S3Bucket",
    "provision_moto",
    "serve_moto",
]

TEST_CREDENTIALS = {"access_key_id": "walstream-test", "secret_access_key": "walstream-test"}
_ADMIN_PATH = "/__walstream_faults__"


class _S3ChildServer(ChildServer):
    """A child of ``python -m walstream_wal_s3.testing.moto``: prints ``PORT <n>``, exits when
    its stdin closes."""

    start_hint = "(the S3 test server needs moto[server]: pip install 'walstream-wal-s3[testing]')"

    def __init__(self, name: str, *args: str) -> None:
        super().__init__(name)
        self._args = args

    def command(self) -> list[str]:
        return [sys.executable, "-m", "walstream_wal_s3.testing.moto", self.name, *self._args]

    def _post(self, path: str, payload: bytes = b"") -> bytes:
        request = urllib.request.Request(self.endpoint_url + path, data=payload, method="POST")
        with urllib.request.urlopen(request, timeout=10) as response:
            return bytes(response.read())


class MotoServer(_S3ChildServer):
    """moto's S3 in server mode (a real HTTP endpoint) on 127.0.0.1 and a random port."""

    def __init__(self) -> None:
        super().__init__("moto")

    def __enter__(self) -> MotoServer:
        self.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    def reset(self) -> None:
        """Forget every bucket and object."""
        self._post("/moto-api/reset")

    def create_bucket(self, bucket: str) -> None:
        import boto3  # a moto dependency: present wherever the test server runs

        client = boto3.client(
            "s3",
            endpoint_url=self.endpoint_url,
            region_name="us-east-1",
            aws_access_key_id=TEST_CREDENTIALS["access_key_id"],
            aws_secret_access_key=TEST_CREDENTIALS["secret_access_key"],
        )
        try:
            client.create_bucket(Bucket=bucket)
        finally:
            client.close()


@dataclass
class FaultConfig:
    """What :class:`FaultProxy` does to requests that match ``methods`` and ``path_contains``."""

    seed: int = 0
    methods: list[str] = field(default_factory=lambda: ["PUT", "POST"])
    path_contains: str = ""
    fail_rate: float = 0.0
    """Answer 500 without forwarding (the write definitely did not happen)."""
    written_but_failed_rate: float = 0.0
    """Forward, then answer 500 (the write happened; the client is told it failed)."""
    drop_after_write_rate: float = 0.0
    """Forward, then close the connection without an answer (the client cannot know)."""
    written_but_failed_next: int = 0
    """The next N matching requests are forwarded, then answered 500."""
    throttle_next: int = 0
    """The next N matching requests get ``503 SlowDown``."""
    ignore_conditional: bool = False
    """Drop ``If-None-Match`` (behave like a store that ignores conditional writes)."""
    latency_p50_ms: float = 0.0
    latency_p99_ms: float = 0.0
    """Lognormal latency added to matching requests (0: none)."""


class FaultProxy(_S3ChildServer):
    """A fault-injecting HTTP proxy in front of an S3 endpoint (see module doc)."""

    def __init__(self, upstream_url: str) -> None:
        super().__init__("proxy", upstream_url)

    def __enter__(self) -> FaultProxy:
        self.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    def configure(self, **settings: Any) -> None:
        """Replace the fault configuration (unknown keys raise); resets the counters."""
        config = FaultConfig(**settings)
        self._post(_ADMIN_PATH, json.dumps(config.__dict__).encode())

    def clear(self) -> None:
        self.configure()

    def stats(self) -> dict[str, int]:
        with urllib.request.urlopen(self.endpoint_url + _ADMIN_PATH, timeout=10) as response:
            return dict(json.loads(response.read()))


@dataclass(frozen=True)
class S3Bucket:
    """A fresh bucket on the test endpoint; :meth:`options` is a YAML section for it."""

    endpoint_url: str
    bucket: str

    def options(self, **overrides: Any) -> dict[str, Any]:
        return {
            "bucket": self.bucket,
            "endpoint_url": self.endpoint_url,
            "region": "us-east-1",
            **TEST_CREDENTIALS,
            **overrides,
        }


@contextlib.contextmanager
def provision_moto(bucket: str = "walstream") -> Iterator[S3Bucket]:
    """Start a moto server with one bucket (for ``walstream conformance`` and benchmarks)."""
    with MotoServer() as server:
        server.create_bucket(bucket)
        yield S3Bucket(server.endpoint_url, bucket)


# -- child processes ---------------------------------------------------------------------------


def serve_moto(port: int = 0) -> None:
    """Serve moto's S3 on 127.0.0.1:``port`` (0: a free one) until stdin closes; prints
    ``PORT n`` first. Also used by the s3express zones."""
    import logging

    from moto.moto_server.werkzeug_app import (
        DomainDispatcherApplication,
        MotoRequestHandler,
        create_backend_app,
    )
    from werkzeug.serving import make_server

    logging.getLogger("werkzeug").setLevel(logging.ERROR)
    app = DomainDispatcherApplication(create_backend_app)
    conditional = threading.Lock()

    def application(environ: dict[str, Any], start_response: Any) -> Any:
        # moto checks "key exists?" and then writes without a lock; real S3 decides a
        # conditional create atomically. Serialising conditional writes restores that.
        if environ.get("HTTP_IF_NONE_MATCH") == "*":
            with conditional:
                return list(app(environ, start_response))
        return app(environ, start_response)

    server = make_server(
        "127.0.0.1", port, application, threaded=True, request_handler=MotoRequestHandler
    )
    print(f"PORT {server.server_port}", flush=True)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    sys.stdin.read()
    server.shutdown()


def _serve_proxy(upstream_url: str) -> None:
    import asyncio
    import random

    import aiohttp
    from aiohttp import web

    hop_headers = {"host", "content-length", "transfer-encoding", "connection", "keep-alive"}
    state: dict[str, Any] = {"config": FaultConfig(), "rng": random.Random(0), "stats": {}}

    def count(name: str) -> None:
        stats = state["stats"]
        stats[name] = stats.get(name, 0) + 1

    def s3_error(status: int, code: str) -> web.Response:
        body = (
            f"<?xml version='1.0' encoding='UTF-8'?><Error><Code>{code}</Code>"
            f"<Message>injected by walstream fault proxy</Message></Error>"
        )
        return web.Response(status=status, body=body.encode(), content_type="application/xml")

    async def admin(request: web.Request) -> web.Response:
        if request.method == "POST":
            config = FaultConfig(**json.loads(await request.read() or b"{}"))
            state.update(config=config, rng=random.Random(config.seed), stats={})
        return web.json_response(state["stats"])

    async def handle(request: web.Request) -> web.StreamResponse:
        if request.path == _ADMIN_PATH:
            return await admin(request)
        body = await request.read()
        config: FaultConfig = state["config"]
        rng: random.Random = state["rng"]
        matches = request.method in config.methods and config.path_contains in request.path_qs
        count("requests")
        if matches:
            count("matched")
            state["active"] = state.get("active", 0) + 1
            stats = state["stats"]
            stats["max_concurrent"] = max(stats.get("max_concurrent", 0), state["active"])
        try:
            return await forward(request, body, config, rng, matches)
        finally:
            if matches:
                state["active"] -= 1

    async def forward(
        request: web.Request,
        body: bytes,
        config: FaultConfig,
        rng: random.Random,
        matches: bool,
    ) -> web.StreamResponse:
        if matches:
            if config.latency_p50_ms > 0:
                sigma = (
                    math.log(
                        max(config.latency_p99_ms, config.latency_p50_ms) / config.latency_p50_ms
                    )
                    / 2.326
                )
                await asyncio.sleep(
                    rng.lognormvariate(math.log(config.latency_p50_ms), sigma) / 1000
                )
            if config.throttle_next > 0:
                config.throttle_next -= 1
                count("throttled")
                return s3_error(503, "SlowDown")
            if rng.random() < config.fail_rate:
                count("failed")
                return s3_error(500, "InternalError")
        headers = {k: v for k, v in request.headers.items() if k.lower() not in hop_headers}
        if config.ignore_conditional:
            headers = {k: v for k, v in headers.items() if k.lower() != "if-none-match"}
        session: aiohttp.ClientSession = request.app["session"]
        async with session.request(
            request.method,
            upstream_url + request.path_qs,
            headers=headers,
            data=body,
            allow_redirects=False,
        ) as upstream:
            payload = await upstream.read()
            status = upstream.status
            out_headers = {
                k: v for k, v in upstream.headers.items() if k.lower() not in hop_headers
            }
            length = upstream.headers.get("Content-Length")
        if matches and config.written_but_failed_next > 0:
            config.written_but_failed_next -= 1
            count("written_but_failed")
            return s3_error(500, "InternalError")
        if matches:
            draw = rng.random()
            if draw < config.written_but_failed_rate:
                count("written_but_failed")
                return s3_error(500, "InternalError")
            if draw < config.written_but_failed_rate + config.drop_after_write_rate:
                count("dropped")
                assert request.transport is not None
                request.transport.close()
                return web.Response(status=500)
        if request.method == "HEAD":
            response = web.Response(status=status, headers=out_headers)
            if length is not None:
                response.headers["Content-Length"] = length
            return response
        return web.Response(status=status, body=payload, headers=out_headers)

    async def main() -> None:
        app = web.Application(client_max_size=1 << 30)
        app["session"] = aiohttp.ClientSession(
            auto_decompress=False,
            connector=aiohttp.TCPConnector(limit=256),
            skip_auto_headers=("User-Agent", "Content-Type", "Accept-Encoding"),
        )
        app.router.add_route("*", "/{tail:.*}", handle)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        server = site._server
        assert server is not None
        port = server.sockets[0].getsockname()[1]  # type: ignore[attr-defined]
        print(f"PORT {port}", flush=True)
        await asyncio.get_running_loop().run_in_executor(None, sys.stdin.read)
        await app["session"].close()
        await runner.cleanup()

    asyncio.run(main())


def _main(argv: list[str]) -> None:
    if argv[:1] == ["moto"]:
        serve_moto()
    elif argv[:1] == ["proxy"] and len(argv) == 2:
        _serve_proxy(argv[1])
    else:
        sys.exit("usage: python -m walstream_wal_s3.testing.moto moto | proxy UPSTREAM_URL")


if __name__ == "__main__":
    _main(sys.argv[1:])
