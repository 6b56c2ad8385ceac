"""On-disk formats, pure: bytes in, values out, no I/O (``batch``, ``object``)."""
