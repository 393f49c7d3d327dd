"""One refresh of a stream table at a time per machine: advisory file locks in the warehouse.

Airflow may run a manual refresh while a scheduled run is still in flight (the generated DAG
allows several active runs, so a manual run never queues behind a tick), and two runs may then
reach the same stream table together.  On a local warehouse correctness does not depend on
this lock: Delta commits there by an atomic rename that never replaces a file, so two
refreshes that race anyway are ordered by Delta's optimistic concurrency and the frontier
stored in the commit -- the loser retries, sees the winner's frontier and ends NO_DATA.  The
lock makes the second one *wait* instead of computing a change it would throw away, so an
overlap costs one refresh, not two.

On an object store that ordering does not hold (open-source Delta's S3 log store is exclusive
within one JVM only), and every writer holds a lease kept in the warehouse instead
(``storage/lease.py``), taken by the engine itself wherever it runs; this lock is then not
taken.

Locks live in ``<warehouse>/_trickle_locks/<table>.lock`` (``flock``: released by the kernel
when the holder dies, so a killed task never leaves a table locked).
"""
from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import time
from collections.abc import Callable, Iterator

from airflow_trickle.location import Location

log = logging.getLogger(__name__)

LOCK_DIR = "_trickle_locks"


@contextlib.contextmanager
def refresh_lock(warehouse: str, names: list[str], *,
                 on_wait: Callable[[str], None] | None = None) -> Iterator[float]:
    """Hold the refresh locks of ``names`` (sorted, so two holders never deadlock).

    Yields the seconds spent waiting for another holder; ``on_wait(name)`` is called once
    before waiting for a lock that is taken.
    """
    root = Location(warehouse).local
    if root is None:
        yield 0.0
        return
    directory = os.path.join(root, LOCK_DIR)
    os.makedirs(directory, exist_ok=True)
    waited = 0.0
    with contextlib.ExitStack() as held:
        for name in sorted(set(names)):
            handle = held.enter_context(open(os.path.join(directory, f"{name}.lock"), "a+"))
            try:
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                if on_wait:
                    on_wait(name)
                started = time.monotonic()
                fcntl.flock(handle, fcntl.LOCK_EX)
                waited += time.monotonic() - started
            held.callback(fcntl.flock, handle, fcntl.LOCK_UN)
        yield waited
