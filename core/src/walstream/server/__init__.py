"""The HTTP service (``walstream serve``): S2's REST API v1 (s2.dev) over one node, so S2's
SDKs and tools work against walstream.

- :mod:`walstream.server.s2`: the ASGI application (routes, wire forms, errors, sessions,
  the concept mapping, the OpenAPI document);
- :mod:`walstream.server.http`: walstream's HTTP stack on one port (HTTP/1.1 and HTTP/2,
  cleartext or TLS), the bounds that keep hostile clients from exhausting it, graceful shutdown;
- :mod:`walstream.server.limits`: timeouts and bounds (``ServerLimits``, ``TlsSettings``);
- :mod:`walstream.server.node_auth`: node credentials (``WALSTREAM_CLUSTER_SECRET``) for
  forwarded and internal requests;
- :mod:`walstream.server.serve`: ``serve()`` and ``walstream serve`` (listen address, token,
  node lock, shutdown);
- :mod:`walstream.engine.node_lock`: the node lock and how commands reach a running server.

This package imports nothing itself, so ``walstream.engine.node_lock`` (used by every command) does
not pull in the HTTP server.
"""
