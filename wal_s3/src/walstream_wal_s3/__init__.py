"""walstream on S3: the S3 object store (:class:`S3ObjectStore`) and the S3 WAL (:class:`S3Wal`).

The client plumbing (:mod:`walstream_wal_s3.client`) is reusable by other S3-based plugins.
"""

from .client import S3Client, S3Settings
from .objects import S3ObjectStore
from .wal import S3Wal

__all__ = ["S3Client", "S3ObjectStore", "S3Settings", "S3Wal"]
