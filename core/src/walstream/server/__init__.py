"""The HTTP service (``walstream serve``): S2's REST API v1 (s2.dev) over one node, so S2's
SDKs and tools work against walstream.

- :mod:`walstream.server.s2`: the ASGI application (routes, wire forms, errors, sessions,
  the concept mapping, the OpenAPI document);
- :mod:`walstream.server.hosting_granian`, :mod:`walstream.server.hosting` (hypercorn) and
  :mod:`walstream.server.hosting_native` (walstream's own): the HTTP server on one port
  (HTTP/1.1 and h2c), the connection bound, graceful shutdown (``server.http_stack`` chooses);
- :mod:`walstream.server.limits`: timeouts and bounds (``ServerLimits``);
- :mod:`walstream.server.serve`: ``serve()`` and ``walstream serve`` (listen address, token,
  node lock, shutdown);
- :mod:`walstream.engine.node_lock`: the node lock and how commands reach a running server.

This package imports nothing itself, so ``walstream.engine.node_lock`` (used by every command) does
not pull in the HTTP server.
"""
