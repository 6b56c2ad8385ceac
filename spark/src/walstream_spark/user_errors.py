"""User errors that reach the Spark user as one line, not as a Python traceback.

Spark runs the data source's code in Python worker processes and reports an exception there as
the worker's formatted traceback, wrapped in a JVM error (``[PYTHON_DATA_SOURCE_ERROR] Failed to
generate Python data source read partitions: Traceback (most recent call last): ...``), which
PySpark raises again in the driver. For a user error (an unknown stream, a bad option, a bad
deployment file) that is dozens of lines of walstream and Spark internals before the message.

PySpark's worker formats the exception alone, without the traceback, when the worker's
environment has ``SPARK_HIDE_TRACEBACK`` set at the moment it handles the exception (it is read
then, in ``pyspark.util.handle_worker_exception``). :func:`user_errors` sets it just before a
user error leaves a data source method; a worker exits after reporting an exception, so the
setting never outlives the error it shortens. Only a Spark worker (a process whose main module
is one of PySpark's) is changed: code calling the reader directly in a driver keeps its
environment. The user then sees Spark's prefix followed by
``walstream.errors.StreamNotFound: no stream 'nope' in the deployment ...: list its streams
with ...`` on the same first line. Other errors (corruption, an unreachable backend, bugs) keep their traceback.
"""

from __future__ import annotations

import contextlib
import functools
import os
import sys
from collections.abc import Callable, Iterator
from typing import ParamSpec, TypeVar

from walstream.errors import ConfigError, DataLossError, InvalidArgument, StreamNotFound

__all__ = ["USER_ERRORS", "in_spark_worker", "shortened", "user_errors"]

P = ParamSpec("P")
T = TypeVar("T")

USER_ERRORS: tuple[type[Exception], ...] = (
    ConfigError,
    InvalidArgument,
    StreamNotFound,
    DataLossError,
)
"""Errors whose message says everything the user needs: reported without a traceback."""


def user_errors(method: Callable[P, T]) -> Callable[P, T]:
    """Wrap a data source method so that a :data:`USER_ERRORS` error it raises is reported by
    the Spark worker as ``ErrorClass: message`` only (the error itself is unchanged)."""

    @functools.wraps(method)
    def wrapper(*args: P.args, **kwargs: P.kwargs) -> T:
        with shortened():
            return method(*args, **kwargs)

    return wrapper


@contextlib.contextmanager
def shortened() -> Iterator[None]:
    """The block's :data:`USER_ERRORS` are reported without a traceback (see the module doc);
    for generators, whose body runs after the method returned."""
    try:
        yield
    except USER_ERRORS:
        if in_spark_worker():
            os.environ["SPARK_HIDE_TRACEBACK"] = "1"
        raise


def in_spark_worker() -> bool:
    """True in a PySpark worker process (``python -m pyspark.…``: the planner, streaming source
    and task workers, and the daemon that forks them)."""
    spec = getattr(sys.modules.get("__main__"), "__spec__", None)
    return spec is not None and str(spec.name).startswith("pyspark.")
