"""Test rigs of the S3 WAL: a real S3 endpoint (moto in server mode) and a fault proxy.

Nothing here is imported by the runtime modules except lazily, by the factories' ``provision``
hooks. :mod:`.moto` holds the servers and needs ``moto[server]``; :mod:`.fixtures` holds the
pytest fixtures over them and is the only module here that imports pytest.
"""

from __future__ import annotations

from .moto import TEST_CREDENTIALS, FaultConfig, FaultProxy, MotoServer, S3Bucket, provision_moto

__all__ = [
    "TEST_CREDENTIALS",
    "FaultConfig",
    "FaultProxy",
    "MotoServer",
    "S3Bucket",
    "provision_moto",
]
