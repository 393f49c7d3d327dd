"""A process's own output sent to a log file for a while: for tools whose noise is not the user's.

Why file descriptors and not ``sys.stdout``: what prints there includes a JVM this process
starts (Spark's Ivy resolving jars) and Airflow's structlog handlers, which write through
descriptors 1 and 2 whatever Python's ``sys.stdout`` is.
"""
from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Iterator
from pathlib import Path


@contextlib.contextmanager
def output_to(path: str | Path) -> Iterator[None]:
    """This process's standard output and error appended to ``path`` until the block ends."""
    sys.stdout.flush()
    sys.stderr.flush()
    saved = os.dup(1), os.dup(2)
    log = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    try:
        os.dup2(log, 1)
        os.dup2(log, 2)
        yield
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os.dup2(saved[0], 1)
        os.dup2(saved[1], 2)
        for fd in (log, *saved):
            os.close(fd)
