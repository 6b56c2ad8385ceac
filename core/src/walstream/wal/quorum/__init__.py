"""The quorum WAL protocol, written once in core and used by every quorum plugin."""
