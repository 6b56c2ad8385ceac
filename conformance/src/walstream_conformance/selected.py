"""The suites bound to the backends chosen on the command line (``--walstream-wal=NAME`` …).

The plugin adds this file to the run when such an option is given; each class skips when its
backend kind was not chosen.
"""

from __future__ import annotations

from walstream_conformance import MetadataSuite, ObjectStoreSuite, WalSuite


class TestSelectedWal(WalSuite):
    pass


class TestSelectedObjectStore(ObjectStoreSuite):
    pass


class TestSelectedMetadata(MetadataSuite):
    pass
