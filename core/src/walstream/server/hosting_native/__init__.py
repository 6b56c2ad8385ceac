"""Running an ASGI application with walstream's own HTTP server (``server.http_stack: native``):
an :class:`asyncio.Protocol` server in the node's process and event loop (uvloop under
``walstream serve``), no other thread. One port answers HTTP/1.1 (parsed by ``httptools``,
:mod:`~walstream.server.hosting_native.http1`) and cleartext HTTP/2 with prior knowledge (h2c,
on the ``h2`` library's state machine, :mod:`~walstream.server.hosting_native.http2`), each
request served by the application in this loop.

The same contract as :mod:`walstream.server.hosting` (hypercorn) and
:mod:`walstream.server.hosting_granian`:

- ``max_connections``: one more connection is answered ``503 unavailable`` (S2's error body,
  ``retry-after-ms: 1000``) and closed.
- ``header_timeout``: a connection that has not sent a complete request head this long after it
  opened or after its previous answer (idle keep-alive) is closed; an HTTP/2 connection without
  a stream for that long gets GOAWAY and is closed.
- The body timeout, body size and long-poll bounds are the application's.
- A request it cannot parse gets ``400`` and a head over 64 KiB ``431``, both in S2's error
  shape (``{"code": "invalid", "message": ...}``), and the connection closes. HTTP/2: a
  header list over 64 KiB gets ``431`` (the connection stays), a malformed request RST_STREAM
  ``PROTOCOL_ERROR``, a protocol error GOAWAY with its code.

Shutdown (:meth:`NativeListener.close`) stops accepting, closes idle connections, lets requests
in progress finish (HTTP/1.1: ``connection: close`` on the answer in progress; HTTP/2: new
streams refused, GOAWAY once the streams in progress ended), and cancels what is left after
``grace_s``.
"""

from walstream.server.hosting_native.listener import NativeListener, open_listener

__all__ = ["NativeListener", "open_listener"]
