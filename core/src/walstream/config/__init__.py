"""Configuration: option schemas, the backend factory contract and the engine's own sections.

A backend plugin publishes a :class:`BackendFactory` under one of the entry-point groups
``walstream.wal``, ``walstream.object_store`` or ``walstream.metadata``. Its ``options`` describe
every key its YAML section accepts; :func:`validate_options` checks a section against them and
names the offending key in every error.
"""

from walstream.config.engine import (
    CacheConfig,
    CompactionConfig,
    EngineConfig,
    RecoveryConfig,
    UploadConfig,
)
from walstream.config.factory import (
    CONTRACT_VERSION,
    BackendFactory,
    BackendKind,
    BuildContext,
    validate_options,
)
from walstream.config.options import (
    Option,
    parse_duration,
    parse_size,
)

__all__ = [
    "CONTRACT_VERSION",
    "BackendFactory",
    "BackendKind",
    "BuildContext",
    "CacheConfig",
    "CompactionConfig",
    "EngineConfig",
    "Option",
    "RecoveryConfig",
    "UploadConfig",
    "parse_duration",
    "parse_size",
    "validate_options",
]
