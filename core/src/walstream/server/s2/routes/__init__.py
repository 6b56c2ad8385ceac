"""The routes of the S2 service, one module per resource, over :class:`~walstream.server.s2.context.S2Context`."""
