"""Test rigs of the s3express WAL: one moto S3 server per availability zone
(:mod:`.zones`). Runtime modules import it only lazily, from the factory's ``provision`` hook."""

from __future__ import annotations

from .zones import (
    DEFAULT_ZONES,
    TEST_CREDENTIALS,
    ZoneServer,
    create_directory_bucket,
    directory_bucket_name,
    provision,
    zone_servers,
    zone_wal_options,
)

__all__ = [
    "DEFAULT_ZONES",
    "TEST_CREDENTIALS",
    "ZoneServer",
    "create_directory_bucket",
    "directory_bucket_name",
    "provision",
    "zone_servers",
    "zone_wal_options",
]
