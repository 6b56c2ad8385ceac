"""Running one node as an HTTP server: :func:`serve` opens the node of a deployment under its
node lock (:mod:`walstream.engine.node_lock`) and serves the S2 API application
(:mod:`walstream.server.s2`) with walstream's HTTP stack (:mod:`walstream.server.http`), over
TLS when ``server.tls`` is set; :func:`run_until_signalled` is ``walstream serve``.

Node credentials: ``WALSTREAM_CLUSTER_SECRET`` (:mod:`walstream.server.node_auth`) signs what
this node forwards to the others and is required of what they forward to it.

Rejoin: with a ``cluster:`` section, a node that lost its lease or was failed over is fenced
(its client latches :class:`~walstream.errors.FencedError` and writes nothing more). The server
then opens a new client of the same node, exactly as a restart would (a new epoch, its WAL
recovered), serves it, and closes the fenced one, retrying with backoff while the metadata
store is unreachable. Other failures (a broken WAL device, a failed upload) are not retried.

Extra listeners: every top-level section of the deployment that an installed listener owns
(:mod:`walstream.config.listeners`; ``kafka:`` for walstream-kafka) is started once the HTTP
listener is bound, in this event loop, on the same client. They are rebound when the node
rejoins, told to begin shutting down with the HTTP service, and closed before the client.

Shutdown (SIGTERM or SIGINT): answer waiting long polls with what they have and end read
sessions, stop accepting connections, let requests in progress finish (up to 10 s), then close
the client, which uploads and commits everything acknowledged.
"""

from __future__ import annotations

import asyncio
import errno
import logging
import os
import signal
import sys
from collections.abc import AsyncIterator, Callable, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from walstream.config.listeners import (
    ExtraListener,
    ListenerContext,
    listener_section_names,
    load_listener,
)
from walstream.engine import node_lock
from walstream.errors import ConfigError, FencedError
from walstream.server.cluster_status import with_cluster_metrics
from walstream.server.limits import (
    DEFAULT_MAX_BODY_BYTES,
    DEFAULT_MAX_WAIT_S,
    ServerLimits,
    limits_from_section,
)
from walstream.server.node_auth import SECRET_ENVIRONMENT_VARIABLE, credentials_from_environment
from walstream.server.s2.app import S2App
from walstream.tuning import tune_gc

if TYPE_CHECKING:
    from walstream.engine.client import Client
    from walstream.server.node_auth import NodeCredentials

__all__ = [
    "DEFAULT_LISTEN",
    "REJOIN_CHECK_S",
    "Listener",
    "RunningServer",
    "parse_listen",
    "run_until_signalled",
    "serve",
]

log = logging.getLogger(__name__)

DEFAULT_LISTEN = "127.0.0.1:7400"
TOKEN_ENVIRONMENT_VARIABLE = "WALSTREAM_TOKEN"
#: How often the server looks for a fenced client to replace (the check reads one attribute).
REJOIN_CHECK_S = 0.2
#: Backoff between attempts to open a new epoch while the metadata store is unreachable.
REJOIN_BACKOFF_S = (0.2, 5.0)
#: How long an extra listener may let its requests in progress finish at shutdown.
EXTRA_LISTENER_GRACE_S = 10.0
#: How long closing a fenced client may take: it uploads nothing as the old epoch, but a WAL or
#: object store that hangs must not keep the old client (and its tasks) forever.
FENCED_CLOSE_S = 10.0


class Listener(Protocol):
    """What serve() needs of a hosting: the bound port and a graceful close."""

    port: int
    refused: int

    async def close(self, grace_s: float = ...) -> None: ...


async def open_listener(
    app: S2App,
    host: str,
    port: int,
    limits: ServerLimits,
    node_credentials: NodeCredentials | None = None,
) -> Listener:
    """Serve ``app`` on ``host:port`` with walstream's HTTP stack (imported here, so that other
    commands do not load it). A port in use is a ConfigError."""
    from walstream.server import http

    try:
        return await http.open_listener(app, host, port, limits, node_credentials=node_credentials)
    except OSError as failure:
        if failure.errno != errno.EADDRINUSE:
            raise
        raise ConfigError(
            f"listen: {host}:{port} is already in use; stop the other server or choose "
            "another port (server.listen, --listen)"
        ) from None


def parse_listen(listen: str) -> tuple[str, int]:
    """``host:port`` (``[::1]:7400`` for IPv6) → (host, port); port 0 picks a free one."""
    host, separator, port = listen.rpartition(":")
    host = host.strip("[]")
    if not separator or not host or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise ConfigError(
            f"listen: expected host:port such as 127.0.0.1:7400 or [::1]:7400, got {listen!r}"
        )
    return host, int(port)


@dataclass(frozen=True)
class RunningServer:
    """A node serving HTTP (yielded by :func:`serve`)."""

    client: Client
    host: str
    port: int
    token: str | None
    app: S2App
    limits: ServerLimits = field(default_factory=ServerLimits)
    listener: Listener | None = None
    """The listener (counts ``open`` and ``refused`` connections)."""
    extra_listeners: Mapping[str, ExtraListener] = field(default_factory=dict)
    """The extra listeners started from the deployment's sections, by section (``kafka``)."""

    @property
    def scheme(self) -> str:
        return "http" if self.limits.tls is None else "https"

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{self.scheme}://{host}:{self.port}"


def rejoinable(client: Client) -> bool:
    """True when ``client`` stopped because this node lost its lease or was failed over: it
    runs in a cluster and its latched failure is a :class:`FencedError`. Only a new epoch
    (what a restart registers) can write again; other failures need an operator."""
    return client.cluster is not None and isinstance(client.failure, FencedError)


async def close_fenced(client: Client, timeout_s: float = FENCED_CLOSE_S) -> None:
    """Close a replaced client, waiting at most ``timeout_s``: a fenced client aborts its
    uploads (its streams belong to the new epoch or the node that failed it over)."""
    try:
        await asyncio.wait_for(client.close(), timeout_s)
    except TimeoutError:
        log.warning(
            "closing the fenced client of node %d (epoch %d) took over %.0f s; abandoned it",
            client.node_id,
            client.node_epoch,
            timeout_s,
        )
    except Exception as error:  # the old epoch is gone either way; say why it closed badly
        log.warning(
            "closing the fenced client of node %d (epoch %d) failed: %s",
            client.node_id,
            client.node_epoch,
            error,
        )


async def held_by_another_process(client: Client) -> bool:
    """True when a newer epoch of this node is running with a live lease: a second process
    started with the same ``node.id`` registered it; no failover fenced this one. Rejoining would
    take the node back from that process, which would then take it back in turn."""
    try:
        node = await client.metadata.get_node(client.node_id)
        now_ms = await client.metadata.store_time_ms()
    except Exception:  # unknown: the reopen's own errors say what is wrong
        return False
    return node is not None and node.node_epoch > client.node_epoch and node.live(now_ms)


async def keep_joined(
    app: S2App,
    reopen: Callable[[], Any],
    check_s: float = REJOIN_CHECK_S,
    rebind: Callable[[Client], None] | None = None,
) -> None:
    """Until cancelled: whenever the client ``app`` serves is fenced (:func:`rejoinable`),
    open a new one with ``reopen()`` (retrying with backoff, each failure logged at WARNING),
    swap it into ``app`` and close the old one. A node that another live process registered
    again (:func:`held_by_another_process`) is left fenced and reported once."""
    reported: Client | None = None
    while True:
        await asyncio.sleep(check_s)
        old = app.client
        if not rejoinable(old):
            continue
        if await held_by_another_process(old):
            if old is not reported:
                reported = old
                log.error(
                    "node %d (epoch %d) is fenced by another live process registered as node "
                    "%d; not rejoining: give each process its own node.id",
                    old.node_id,
                    old.node_epoch,
                    old.node_id,
                )
            continue
        log.warning(
            "node %d (epoch %d) is fenced (%s); opening a new epoch",
            old.node_id,
            old.node_epoch,
            old.failure,
        )
        delay, longest = REJOIN_BACKOFF_S
        attempt = 0
        while True:
            attempt += 1
            try:
                new: Client = await reopen()
                break
            except Exception as error:  # metadata store unreachable, WAL busy: try again
                log.warning(
                    "node %d: rejoin attempt %d failed (%s: %s); retrying in %.1f s",
                    old.node_id,
                    attempt,
                    type(error).__name__,
                    error,
                    delay,
                )
                await asyncio.sleep(delay)
                delay = min(delay * 2, longest)
        app.replace_client(new)
        if rebind is not None:
            rebind(new)
        log.warning(
            "node %d rejoined with epoch %d (was %d)", new.node_id, new.node_epoch, old.node_epoch
        )
        await close_fenced(old)


def _choose_token(
    explicit: str | None, configured: str | None, environ: Mapping[str, str]
) -> str | None:
    """``--token`` wins, then ``WALSTREAM_TOKEN``, then ``server.token``; empty means none."""
    for candidate in (explicit, environ.get(TOKEN_ENVIRONMENT_VARIABLE), configured):
        if candidate:
            return candidate
    return None


@asynccontextmanager
async def serve(
    config: Any = None,
    *,
    listen: str | None = None,
    token: str | None = None,
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
    max_wait_s: float = DEFAULT_MAX_WAIT_S,
    limits: ServerLimits | None = None,
    environ: Mapping[str, str] | None = None,
) -> AsyncIterator[RunningServer]:
    """Open the node of ``config`` (a deployment YAML path, mapping, Deployment, or None for
    the embedded default) and serve it over HTTP until the context exits; then stop accepting,
    answer long polls, and close the client (which uploads everything acknowledged).

    ``listen``, ``token`` and ``limits`` override the deployment's ``server`` section (port 0:
    any free port, see :attr:`RunningServer.port`). ``environ`` (default ``os.environ``) gives
    ``WALSTREAM_TOKEN`` and ``WALSTREAM_CLUSTER_SECRET``.

    While serving, the process holds the node lock of the deployment (:mod:`walstream.engine.node_lock`)
    with its URL in it, so `walstream` commands on the same deployment use this server instead
    of taking the node over. Raises :class:`~walstream.engine.node_lock.NodeBusy` (a ConfigError) naming
    the running process when another live process already runs the node.
    """
    import walstream
    from walstream.config.host import find_host

    plugin_host = find_host("walstream serve reads its deployment through the plugin host")
    deployment = plugin_host.load_deployment(config)
    server_section = deployment.sections["server"]
    host, port = parse_listen(listen or server_section["listen"] or DEFAULT_LISTEN)
    chosen_limits = limits or limits_from_section(server_section)
    environment = os.environ if environ is None else environ
    chosen_token = _choose_token(token, server_section.get("token"), environment)
    credentials = credentials_from_environment(environment, deployment.node_id)
    if credentials is None and deployment.sections.get("cluster") is not None:
        log.warning(
            "node %d runs in a cluster without %s: requests between nodes are not "
            "authenticated, so a client can send the forwarding header and, with the service "
            "token, call /cluster routes; give every node the same secret",
            deployment.node_id,
            SECRET_ENVIRONMENT_VARIABLE,
        )
    if chosen_token is None and host not in ("127.0.0.1", "::1", "localhost"):
        log.warning(
            "serving %s:%d without a token: anyone who reaches it can write and "
            "delete streams (set server.token or WALSTREAM_TOKEN)",
            host,
            port,
        )
    hooks = plugin_host.make_hooks(deployment.disabled_hooks)
    render_metrics = plugin_host.metrics_renderer(hooks)
    # The node lock is taken before the node is opened: a second server of the same node must
    # refuse before it registers a new epoch and fences the running one (NodeBusy, exit 2).
    path = node_lock.lock_path(deployment)
    held = (
        None
        if path is None
        else node_lock.NodeLock.acquire(path, deployment.node_id, "walstream serve")
    )
    try:
        client = await walstream.open(deployment, hooks=hooks)
    except BaseException:
        if held is not None:
            held.release()
        raise
    listener: Listener | None = None
    app: S2App | None = None
    rejoin: asyncio.Task[None] | None = None
    extras: dict[str, ExtraListener] = {}

    def rebind_extras(new: Client) -> None:
        for extra in extras.values():
            extra.rebind(new)
    try:
        app = S2App(
            client,
            token=chosen_token,
            render_metrics=None,
            max_body_bytes=max_body_bytes,
            max_wait_s=max_wait_s,
            limits=chosen_limits,
            node_credentials=credentials,
        )
        served = app
        app.render_metrics = with_cluster_metrics(
            render_metrics, lambda: (served.client, served.rejoins)
        )
        if client.cluster is not None:
            rejoin = asyncio.create_task(
                keep_joined(
                    app,
                    lambda: walstream.open(deployment, hooks=hooks),
                    rebind=rebind_extras,
                ),
                name="walstream-serve-rejoin",
            )
        listener = await open_listener(app, host, port, chosen_limits, credentials)
        for name in listener_section_names():
            section = deployment.sections.get(name)
            if section is None:
                continue
            extras[name] = await load_listener(name).start(
                ListenerContext(
                    client=client,
                    section=section,
                    token=chosen_token,
                    node_id=deployment.node_id,
                    deployment=deployment,
                )
            )
        running = RunningServer(
            client, host, listener.port, chosen_token, app, chosen_limits, listener, extras
        )
        if held is not None:
            # Where `walstream` commands on this deployment send their writes and live reads.
            held.record(node_id=deployment.node_id, command="walstream serve", url=running.url)
        yield running
    finally:
        if rejoin is not None:
            rejoin.cancel()
            try:
                await rejoin
            except asyncio.CancelledError:
                pass
        if app is not None:
            client = app.client
        try:
            if app is not None:
                app.begin_shutdown()  # long polls answer now, read sessions end
            for extra in extras.values():
                extra.begin_shutdown()
            if listener is not None:
                await listener.close()
            for name, extra in extras.items():
                try:
                    await extra.close(EXTRA_LISTENER_GRACE_S)
                except Exception as error:  # the client must still close and upload
                    log.warning("closing the %s listener failed: %s", name, error)
        finally:
            try:
                await client.close()
            finally:
                if held is not None:
                    held.release()


async def run_until_signalled(
    config: Any = None,
    *,
    listen: str | None = None,
    token: str | None = None,
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
    max_wait_s: float = DEFAULT_MAX_WAIT_S,
    announce: Callable[[RunningServer], None] | None = None,
) -> None:
    """``walstream serve``: serve until SIGTERM or SIGINT, then shut down gracefully."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    signals = (signal.SIGTERM, signal.SIGINT)
    for signal_number in signals:
        loop.add_signal_handler(signal_number, stop.set)
    try:
        async with serve(
            config,
            listen=listen,
            token=token,
            max_body_bytes=max_body_bytes,
            max_wait_s=max_wait_s,
        ) as server:
            # This process is the node's: its start-up is done, tune the garbage collector
            # for a steady event loop (walstream.tuning).
            tune_gc()
            if announce is not None:
                announce(server)
            await stop.wait()
            print(
                "walstream serve: stopping (closing the node uploads everything acknowledged)",
                file=sys.stderr,
                flush=True,
            )
    finally:
        for signal_number in signals:
            loop.remove_signal_handler(signal_number)
