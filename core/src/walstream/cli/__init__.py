"""The ``walstream`` command line."""

from walstream.cli.commands import main

__all__ = ["main"]
