"""What the connections of one listener share: the application, the bounds, the connection
counts (in all and per remote address), the idle connections that give way to new ones, the
output budget of the whole server, and the per-address reset budgets.

Everything here runs in the node's event loop (no locks). Per remote address the table holds an
entry only while that address has a connection open or a reset budget not yet refilled, so a
crowd of addresses cannot grow it past the connections the server holds.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import Awaitable, Callable
from contextlib import suppress
from typing import TYPE_CHECKING, Any, Protocol

from walstream.server.limits import RESET_WINDOW_S, ServerLimits

if TYPE_CHECKING:
    from walstream.server.node_auth import NodeCredentials

__all__ = [
    "AddressState",
    "OutputBudget",
    "OutputBusy",
    "ServedConnection",
    "ServingState",
    "TokenBucket",
]

log = logging.getLogger("walstream.server.http")

App = Callable[..., Awaitable[None]]


class ServedConnection(Protocol):
    """What the listener asks of a connection (HTTP/1.1 or HTTP/2)."""

    def check_head_deadline(self, now: float) -> None: ...
    def shutdown(self) -> None: ...
    def abort(self) -> None: ...
    def evict(self) -> None: ...


class TokenBucket:
    """``capacity`` tokens that refill at ``capacity`` per :data:`RESET_WINDOW_S`."""

    __slots__ = ("capacity", "stamp", "tokens")

    def __init__(self, capacity: int, now: float) -> None:
        self.capacity = capacity
        self.tokens = float(capacity)
        self.stamp = now

    def refill(self, now: float) -> None:
        elapsed = now - self.stamp
        if elapsed > 0:
            self.tokens = min(
                float(self.capacity), self.tokens + elapsed * self.capacity / RESET_WINDOW_S
            )
            self.stamp = now

    def take(self, now: float) -> bool:
        """Spend one token; False when there was none (the budget is spent)."""
        self.refill(now)
        if self.tokens < 1:
            return False
        self.tokens -= 1
        return True

    def exhausted(self, now: float) -> bool:
        self.refill(now)
        return self.tokens < 1

    def full(self, now: float) -> bool:
        self.refill(now)
        return self.tokens >= self.capacity


class AddressState:
    """One remote address: its open connections and its HTTP/2 reset budget."""

    __slots__ = ("connections", "resets")

    def __init__(self, limits: ServerLimits, now: float) -> None:
        self.connections = 0
        self.resets = TokenBucket(limits.max_resets_per_address, now)


class OutputBusy(TimeoutError):
    """No output room came within ``server.send_timeout``."""


class OutputBudget:
    """Bytes of answers built and not yet taken by clients: reserved by a read before it reads
    (:meth:`reserve`), given back once its answer went out (:meth:`release`). ``limit`` bounds
    the total; a reservation waits (in arrival order) until it fits."""

    __slots__ = ("limit", "used", "waiters")

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.used = 0
        self.waiters: deque[asyncio.Future[None]] = deque()

    def fits(self, size: int) -> bool:
        return self.used + size <= self.limit

    def release(self, size: int) -> None:
        if size <= 0:
            return
        self.used -= size
        waiters = self.waiters
        while waiters:  # each looks again: a smaller reservation may fit where a larger did not
            waiter = waiters.popleft()
            if not waiter.done():
                waiter.set_result(None)

    def wake_all(self) -> None:
        """Wake every waiter (its connection closed: each looks again and sees it is gone)."""
        waiters, self.waiters = self.waiters, deque()
        for waiter in waiters:
            if not waiter.done():
                waiter.set_result(None)

    async def wait(self, loop: asyncio.AbstractEventLoop) -> None:
        waiter = loop.create_future()
        self.waiters.append(waiter)
        try:
            await waiter
        finally:
            if not waiter.done():
                waiter.cancel()
            with suppress(ValueError):
                self.waiters.remove(waiter)


class ServingState:
    """The state the connections of one listener share (see the module's docstring)."""

    def __init__(
        self,
        app: App,
        limits: ServerLimits,
        loop: asyncio.AbstractEventLoop,
        *,
        scheme: str = "http",
        node_credentials: NodeCredentials | None = None,
    ) -> None:
        self.app = app
        self.limits = limits
        self.loop = loop
        self.scheme = scheme
        self.node_credentials = node_credentials
        self.asgi_version = {"version": "3.0", "spec_version": "2.3"}
        self.open = 0
        """Connections being served (refused ones are not counted)."""
        self.refused = 0
        """Connections answered 503 (``max_connections``, ``max_connections_per_address``, or
        an address whose reset budget is spent)."""
        self.evicted = 0
        """Idle keep-alive connections closed to make room for a new one."""
        self.connections: set[Any] = set()
        self.idle: dict[Any, None] = {}
        """Connections with no request in progress, longest idle first."""
        self.addresses: dict[str, AddressState] = {}
        self.output = OutputBudget(limits.max_output_bytes)
        self.closing = False
        self._all_closed: asyncio.Future[None] | None = None

    # -- idle connections ----------------------------------------------------------------------

    def mark_idle(self, connection: Any) -> None:
        idle = self.idle
        if connection in idle:
            del idle[connection]
        idle[connection] = None

    def mark_busy(self, connection: Any) -> None:
        self.idle.pop(connection, None)

    def make_room(self) -> bool:
        """Close the longest-idle connection for a new one; False when none is idle."""
        for connection in self.idle:
            del self.idle[connection]
            self.evicted += 1
            connection.evict()
            return True
        return False

    # -- remote addresses ----------------------------------------------------------------------

    def address(self, host: str) -> AddressState:
        state = self.addresses.get(host)
        if state is None:
            state = self.addresses[host] = AddressState(self.limits, self.loop.time())
        return state

    def forget_address(self, host: str) -> None:
        """Drop an address's entry once it holds nothing (no connection, a full budget)."""
        state = self.addresses.get(host)
        if state is not None and state.connections <= 0 and state.resets.full(self.loop.time()):
            del self.addresses[host]

    def sweep_addresses(self) -> None:
        now = self.loop.time()
        for host in [
            host
            for host, state in self.addresses.items()
            if state.connections <= 0 and state.resets.full(now)
        ]:
            del self.addresses[host]

    # -- closing -------------------------------------------------------------------------------

    def connection_closed(self, connection: Any) -> None:
        self.connections.discard(connection)
        self.idle.pop(connection, None)
        if not self.connections and self._all_closed is not None:
            if not self._all_closed.done():
                self._all_closed.set_result(None)
