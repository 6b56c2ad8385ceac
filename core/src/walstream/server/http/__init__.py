"""walstream's HTTP stack: one :class:`asyncio.Protocol` server in the node's own process and event
loop (uvloop under ``walstream serve``), no other thread. One port answers HTTP/1.1 (parsed by
``httptools``, :mod:`~walstream.server.http.http1`) and HTTP/2 (the ``h2`` library's state
machine, :mod:`~walstream.server.http.http2`): cleartext with prior knowledge (h2c), or over TLS
(``server.tls``) with ALPN choosing ``h2`` or ``http/1.1``. Each request is served by the ASGI
application in this loop.

The modules, each importing only those below it: ``listener`` (the socket, sweeps, graceful
close) → ``http1`` (every connection starts here) → ``exchange`` (an HTTP/1.1 request) and
``http2`` → ``http2_request``, ``http2_stream``, ``header_codec``, ``frame_guard`` →
``request_body`` →
``state`` (what the connections share: counts, per-address table, budgets), ``flow``,
``framing``, ``tls``.

The bounds (``server.*``, :class:`~walstream.server.limits.ServerLimits`;
``docs/architecture/http.md`` has each with what it protects):

- ``max_connections``: past it the longest-idle connection is closed for the new one; when none
  is idle the new one is answered ``503 unavailable`` (S2's error body, ``retry-after-ms: 1000``)
  and closed. ``max_connections_per_address``: past it a connection's first request must carry
  node credentials, else ``503``.
- ``header_timeout``: a connection that has not sent a complete request head this long after it
  opened or after its previous answer (idle keep-alive) is closed; an HTTP/2 connection without
  a stream for that long gets GOAWAY and is closed. Over TLS, the handshake too.
- ``send_timeout``: an answer the client takes nothing of for this long is abandoned (HTTP/2:
  RST_STREAM ``CANCEL``; HTTP/1.1: the connection closes) and its work cancelled.
- ``max_connection_output`` and ``max_output``: answers built and not yet taken by clients; the
  application reserves room before it builds a large answer (the scope extension
  :data:`~walstream.server.http.request_body.OUTPUT_ROOM`), and gives it back as it goes out.
- ``max_resets_per_connection``, ``max_resets_per_address``, ``max_control_frames``: the HTTP/2
  budgets (:mod:`~walstream.server.http.http2`).
- The body timeout, body size and long-poll bounds are the application's.

A request it cannot parse gets ``400`` and a head over 64 KiB ``431``, both in S2's error shape
(``{"code": "invalid", "message": ...}``), and the connection closes. HTTP/2: a header list over
64 KiB gets ``431`` (the connection stays), a malformed request RST_STREAM ``PROTOCOL_ERROR``, a
protocol error GOAWAY with its code.

Shutdown (:meth:`HttpListener.close`) stops accepting, closes idle connections, lets requests in
progress finish (HTTP/1.1: ``connection: close`` on the answer in progress; HTTP/2: new streams
refused, GOAWAY once the streams in progress ended), and cancels what is left after ``grace_s``.
"""

from walstream.server.http.listener import HttpListener, open_listener
from walstream.server.http.request_body import OUTPUT_ROOM

__all__ = ["OUTPUT_ROOM", "HttpListener", "open_listener"]
