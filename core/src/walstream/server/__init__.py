"""The HTTP service (``walstream serve``).

- :mod:`walstream.server.app`: the routes, their answers and error statuses (the service is
  described there);
- :mod:`walstream.server.codec`: request parsing, the JSON and binary forms of records, streams
  and errors, and the error -> HTTP status mapping;
- :mod:`walstream.server.limits`: timeouts and bounds (``ServerLimits``) and the listener's
  connection guard;
- :mod:`walstream.server.serve`: ``serve()`` and ``walstream serve`` (listen address, token,
  node lock, shutdown);
- :mod:`walstream.engine.live`: the node lock and how commands reach a running server.

This package imports nothing itself, so ``walstream.engine.live`` (used by every command) does
not pull in aiohttp.
"""
