"""The HTTP service (``walstream serve``)."""
