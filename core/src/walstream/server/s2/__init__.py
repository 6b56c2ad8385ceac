"""S2's REST API v1 as an ASGI application over one walstream node.

- :mod:`~walstream.server.s2.app`: routing, authentication, basins and streams, health, metrics;
- :mod:`~walstream.server.s2.records`: append, read, check tail;
- :mod:`~walstream.server.s2.sessions`: SSE and S2S read sessions, S2S append sessions;
- :mod:`~walstream.server.s2.model`: how S2's basins, streams, records and configurations map
  onto walstream's;
- :mod:`~walstream.server.s2.wire`: protobuf, S2S framing and JSON forms;
- :mod:`~walstream.server.s2.errors`: S2's error answers and the mapping of walstream's errors;
- :mod:`~walstream.server.s2.asgi`: the request/response toolkit;
- :mod:`~walstream.server.s2.openapi`: the OpenAPI document of what is implemented.
"""
