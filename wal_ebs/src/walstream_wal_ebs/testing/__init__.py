"""Test rigs of the ebs WAL: :mod:`.crash` (the crash loops run the shared crash writer and
checker of :mod:`walstream_conformance.harness.crash` on :func:`.crash.crash_spec`). Runtime
modules never import this package."""
