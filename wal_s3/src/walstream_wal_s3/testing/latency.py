"""An in-process latency model for S3 requests (benchmarks): it delays each HTTP attempt of an
:class:`~walstream_wal_s3.client.S3Client` before it is sent, at the cost of one timer.

A proxy process in front of the store would do the same, but every byte would pass through one
more Python HTTP server, which saturates a core long before the store does: the benchmark would
measure the proxy. Here the request still goes over HTTP to the real (moto) server; only the
wait is simulated, in the client's own event loop (aiobotocore awaits ``before-send`` handlers).

    model = LatencyModel(p50_ms=50, p99_ms=150, methods={"PUT", "GET"})
    await model.attach(store.client)

The model's fields can be changed while it is attached (a zone turning slow or unreachable).
"""

from __future__ import annotations

import asyncio
import math
import random
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from botocore.exceptions import EndpointConnectionError

from walstream_wal_s3.client import S3Client

__all__ = ["LatencyModel"]

#: z-score of the 99th percentile of a standard normal distribution.
_Z99 = 2.3263478740408408


@dataclass
class LatencyModel:
    """A lognormal delay (``p50_ms``/``p99_ms``) plus ``extra_ms`` on every request whose HTTP
    method is in ``methods`` and whose URL contains ``url_contains``; with ``down`` every request
    fails as a refused connection. ``requests`` counts the requests seen, by method."""

    p50_ms: float = 0.0
    p99_ms: float = 0.0
    methods: frozenset[str] = frozenset({"PUT", "GET", "POST", "DELETE", "HEAD"})
    url_contains: str = ""
    extra_ms: float = 0.0
    down: bool = False
    seed: int | None = 1
    requests: Counter[str] = field(default_factory=Counter)
    _rng: random.Random = field(init=False, repr=False)

    def __post_init__(self) -> None:
        if self.p50_ms < 0 or self.p99_ms < self.p50_ms:
            raise ValueError(f"need 0 <= p50 <= p99, got {self.p50_ms}/{self.p99_ms}")
        self.methods = frozenset(self.methods)
        self._rng = random.Random(self.seed)

    def sample_s(self) -> float:
        """One delay in seconds."""
        if self.p50_ms <= 0:
            return self.extra_ms / 1000
        sigma = math.log(self.p99_ms / self.p50_ms) / _Z99
        return (self.p50_ms * math.exp(self._rng.gauss(0.0, sigma)) + self.extra_ms) / 1000

    async def attach(self, client: S3Client) -> None:
        """Delay every request ``client`` sends from the running event loop."""
        raw = await client.raw()
        raw.meta.events.register("before-send.s3", self._before_send)

    async def delay(self, method: str, url: str) -> None:
        """Wait what the model says for one request (``url``: its URL or key)."""
        self.requests[method] += 1
        if self.down:
            raise EndpointConnectionError(endpoint_url=url)
        if method in self.methods and self.url_contains in url:
            delay = self.sample_s()
            if delay > 0:
                await asyncio.sleep(delay)

    async def _before_send(self, request: Any, **_: Any) -> None:
        await self.delay(request.method, request.url)
