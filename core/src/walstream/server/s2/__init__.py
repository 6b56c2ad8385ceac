"""S2's REST API v1 as an ASGI application over one walstream node.

- :mod:`~walstream.server.s2.app`: the ASGI entry and the route tree;
- :mod:`~walstream.server.s2.context`: the state every route shares and the common answers;
- :mod:`~walstream.server.s2.routes`: one module per resource (basins, streams, records,
  sessions, health and metrics, cluster moves);
- :mod:`~walstream.server.s2.appends` and :mod:`~walstream.server.s2.reads`: S2's rules on top of
  the engine's append and read, shared by the routes, the sessions and the hot path
  (:mod:`~walstream.server.s2.fast_append`);
- :mod:`~walstream.server.s2.routing`, :mod:`~walstream.server.s2.forwarding` and
  :mod:`~walstream.server.s2.forward`: which node owns a stream, and relaying requests there;
- :mod:`~walstream.server.s2.model`: how S2's basins, streams, records and configurations map
  onto walstream's, and S2's own limits;
- :mod:`~walstream.server.s2.wire`: protobuf, S2S framing and JSON forms, and their media types;
- :mod:`~walstream.server.s2.errors`: S2's error answers and the mapping of walstream's errors;
- :mod:`~walstream.server.s2.request`: one HTTP exchange over ASGI;
- :mod:`~walstream.server.s2.openapi`: the OpenAPI document of what is implemented.

Each module imports only modules listed after it (the ``server-acyclic`` and ``s2-layers``
contracts of import-linter check it, function-level and TYPE_CHECKING imports included).
"""
