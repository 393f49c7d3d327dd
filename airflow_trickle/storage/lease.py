"""One writer per stream table on an object store: a lease kept in the warehouse itself.

Why: on S3, open-source Delta's log store (``S3SingleDriverLogStore``) makes a commit exclusive
within one JVM only -- it checks that ``_delta_log/N.json`` is absent, then writes it with a
plain PUT.  A stream table is written by Spark (MERGE, INSERT, overwrite) and by delta-rs (small
changes; its commits are conditional PUTs), from any Airflow worker.  Two writers that both
pass the check both write version N, and the later PUT silently replaces the earlier commit.

The lease makes them take turns.  ``<warehouse>/_trickle/_leases/<table>.json`` is created with
a conditional PUT (``If-None-Match: *``): one writer wins, the others wait.  The holder renews
it (a conditional PUT on its own ETag, ``If-Match``) every quarter of ``lease_seconds`` from a
background thread, and releases it by writing it back marked released.  A holder that is
killed stops renewing; a waiter that has seen the same ETag for ``lease_seconds`` by its own
clock takes the lease over with ``If-Match`` on that ETag -- only one waiter can.  No clocks
are compared between machines.

**Fencing.**  A holder whose lease lapsed (it could not renew for ``lease_seconds``: a pause, a
partition) or was taken must not commit.  :meth:`WriterLease.fence`, called just before each
commit, renews the lease synchronously -- the conditional PUT fails if another writer holds it
-- and raises :class:`LeaseLostError` otherwise, so the commit is not made and the refresh
fails (its retry starts again from the storage table's frontier).  A renewal that fails in the
background also interrupts the holder's Spark work in flight (``on_lost``).  What is left is a
commit that *starts* with a fresh lease and runs longer than ``lease_seconds`` while the holder
cannot renew at all; the renewal thread keeps the lease while the process lives.

On a local warehouse Delta's own log store commits by an atomic rename that never replaces a
file, which orders writers on one filesystem; there the refresh tasks keep their advisory file
lock (``refresh/lock.py``) and no lease is taken.  Other object stores (GCS, Azure) have log
stores with an atomic put-if-absent; the lease is taken there too, untested.
"""
from __future__ import annotations

import json
import logging
import os
import socket
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from functools import cached_property

from airflow_trickle.errors import TrickleError
from airflow_trickle.location import Location

log = logging.getLogger(__name__)

#: Beside the catalog tables: ``<warehouse>/_trickle/_leases/<table>.json``.
LEASE_DIR = "_leases"


class LeaseLostError(TrickleError):
    """This writer's lease lapsed or was taken: it must not commit (the refresh is retried)."""


def needs_lease(catalog: Location, seconds: float) -> bool:
    """Whether writers of the warehouse take leases (an object store, and the lease not off)."""
    return catalog.local is None and seconds > 0


@dataclass
class _Held:
    name: str
    etag: str
    #: ``time.monotonic()`` until which the lease is ours for sure (the last renewal's send time
    #: plus the lease's length: a waiter starts counting only after that renewal landed).
    valid_until: float
    renewals: int = 0
    lost: str | None = None


@dataclass
class WriterLease:
    """The leases of ``names`` kept beside the catalog at ``catalog``, held together (taken in
    sorted order)."""

    catalog: Location
    names: list[str]
    seconds: float = 60.0
    #: Called once with a table's name before waiting for it.
    on_wait: Callable[[str], None] | None = None
    #: Called (from the renewal thread) when a lease is lost while held.
    on_lost: Callable[[str], None] | None = None
    holder: str = field(default_factory=lambda: f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}")
    _held: dict[str, _Held] = field(default_factory=dict, init=False, repr=False)
    _stop: threading.Event = field(default_factory=threading.Event, init=False, repr=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, init=False, repr=False)
    waited: float = field(default=0.0, init=False)

    # -- the object -------------------------------------------------------------------------

    @cached_property
    def _root(self) -> Location:
        return self.catalog.child(LEASE_DIR)

    def _body(self, name: str, *, released: bool = False, renewals: int = 0) -> bytes:
        # a fresh nonce in every write: an ETag is the content's hash on many stores, and two
        # writes of the same bytes must not share one
        return json.dumps({"table": name, "holder": self.holder, "seconds": self.seconds, "released": released,
                           "renewals": renewals, "written_at": time.time(), "nonce": uuid.uuid4().hex}).encode()

    def _store(self):
        return self._root._store

    # -- acquire, renew, release -------------------------------------------------------------

    def acquire(self) -> "WriterLease":
        import obstore
        from obstore.exceptions import AlreadyExistsError, PreconditionError

        poll = max(0.05, min(1.0, self.seconds / 20))
        for name in sorted(set(self.names)):
            path = f"{name}.json"
            watched: tuple[str, float] | None = None  # (etag, first seen at)
            told = False
            started = time.monotonic()
            while True:
                sent = time.monotonic()
                try:
                    put = obstore.put(self._store(), path, self._body(name), mode="create")
                    self._held[name] = _Held(name, put["e_tag"], sent + self.seconds)
                    break
                except AlreadyExistsError:
                    pass
                asked = time.monotonic()
                try:
                    current = obstore.get(self._store(), path)
                except FileNotFoundError:
                    continue
                etag = current.meta["e_tag"]
                try:
                    state = json.loads(bytes(current.bytes()))
                except ValueError:
                    state = {}
                if self._names_us(state):
                    # our own create or takeover landed, its answer lost and the retry refused;
                    # sent no earlier than this wait began (what "ours for sure" may count from)
                    self._held[name] = _Held(name, etag, started + self.seconds)
                    break
                if watched is None or watched[0] != etag:
                    watched = (etag, time.monotonic())
                # the lease was unrenewed from (at the latest) the answer that first showed this
                # version to (at the earliest) the asking of the one that shows it still: a slow
                # answer -- a store or a host under load -- must not count as the holder's silence
                if state.get("released") or asked - watched[1] >= float(state.get("seconds") or self.seconds):
                    sent = time.monotonic()
                    try:
                        put = obstore.put(self._store(), path, self._body(name), mode={"e_tag": etag})
                    except (PreconditionError, AlreadyExistsError):
                        continue  # another waiter took it first
                    if not state.get("released"):
                        log.warning("took over the lease of %s from %s, which stopped renewing it",
                                    name, state.get("holder"))
                    self._held[name] = _Held(name, put["e_tag"], sent + self.seconds)
                    break
                if not told:
                    told = True
                    log.info("waiting for %s's writer lease (held by %s)", name, state.get("holder"))
                    if self.on_wait:
                        self.on_wait(name)
                time.sleep(poll)
            self.waited += time.monotonic() - started
        self._renewer = threading.Thread(target=self._renew_loop, name="trickle-lease", daemon=True)
        self._renewer.start()
        return self

    def _renew(self, held: _Held) -> None:
        import obstore
        from obstore.exceptions import PreconditionError

        with self._lock:
            if held.lost:
                raise LeaseLostError(held.lost, stream_table=held.name)
            sent = time.monotonic()
            try:
                put = obstore.put(self._store(), f"{held.name}.json", self._body(held.name, renewals=held.renewals + 1),
                                  mode={"e_tag": held.etag})
            except PreconditionError:
                landed = self._still_ours(held.name)
                if landed is None:
                    held.lost = "its writer lease was taken by another writer (this one stopped renewing it)"
                    raise LeaseLostError(held.lost, stream_table=held.name) from None
                put = {"e_tag": landed}  # our renewal landed; its answer was lost and the retry refused
            except Exception as err:  # noqa: BLE001 - the store is unreachable: held until valid_until
                if time.monotonic() >= held.valid_until:
                    held.lost = f"its writer lease lapsed: it could not be renewed ({err})"
                    raise LeaseLostError(held.lost, stream_table=held.name) from err
                raise
            held.etag, held.valid_until, held.renewals = put["e_tag"], sent + self.seconds, held.renewals + 1

    def _still_ours(self, name: str) -> str | None:
        """The lease object's ETag when it still names this holder (not released), else None.

        A conditional PUT whose answer is lost -- a connection reset by a proxy or a store under
        load -- is retried by the client, and the retry is refused (412) because the first try
        landed: the object then holds our own write, which must not pass for a takeover."""
        import obstore

        try:
            current = obstore.get(self._store(), f"{name}.json")
            state = json.loads(bytes(current.bytes()))
        except (FileNotFoundError, ValueError):
            return None
        return current.meta["e_tag"] if self._names_us(state) else None

    def _names_us(self, state: dict) -> bool:
        """Whether a lease object's content is this holder's, and not released."""
        return state.get("holder") == self.holder and not state.get("released")

    def _renew_loop(self) -> None:
        while not self._stop.wait(self.seconds / 4):
            for held in list(self._held.values()):
                try:
                    self._renew(held)
                except LeaseLostError as err:
                    log.error("%s", err)
                    if self.on_lost:
                        self.on_lost(held.name)
                except Exception as err:  # noqa: BLE001 - retried on the next beat
                    log.warning("could not renew the writer lease of %s: %s", held.name, err)

    def fence(self, name: str | None = None) -> None:
        """Renew now, or raise :class:`LeaseLostError`: call just before a commit."""
        for held in ([self._held[name]] if name else list(self._held.values())):
            self._renew(held)

    def release(self) -> None:
        import obstore

        self._stop.set()
        for held in self._held.values():
            if held.lost:
                continue
            try:
                with self._lock:
                    obstore.put(self._store(), f"{held.name}.json", self._body(held.name, released=True),
                                mode={"e_tag": held.etag})
            except Exception as err:  # noqa: BLE001 - it lapses by itself
                log.warning("could not release the writer lease of %s (it lapses in %.0f s): %s",
                            held.name, self.seconds, err)
        self._held.clear()


# -- per process: who holds what ---------------------------------------------------------------

#: The leases this process holds, by (warehouse URI, table): a refresh inside a group refresh,
#: or a create inside a job that holds the table already, reuses the lease it holds.
_HELD: dict[tuple[str, str], tuple[WriterLease, int]] = {}
_HELD_LOCK = threading.Lock()


@contextmanager
def writer_lease(catalog: Location, names: list[str], *, seconds: float,
                 on_wait: Callable[[str], None] | None = None,
                 on_lost: Callable[[str], None] | None = None) -> Iterator[WriterLease | None]:
    """Hold the writer leases of ``names`` (nothing on a local catalog or with the lease off)."""
    if not needs_lease(catalog, seconds):
        yield None
        return
    with _HELD_LOCK:
        missing = sorted({n for n in names if (catalog.uri, n) not in _HELD})
        for n in set(names) - set(missing):
            lease, count = _HELD[(catalog.uri, n)]
            _HELD[(catalog.uri, n)] = (lease, count + 1)
    lease = WriterLease(catalog, missing, seconds, on_wait=on_wait, on_lost=on_lost).acquire() if missing else None
    with _HELD_LOCK:
        for n in missing:
            _HELD[(catalog.uri, n)] = (lease, 1)
    try:
        yield lease
    finally:
        with _HELD_LOCK:
            for n in set(names):
                held, count = _HELD[(catalog.uri, n)]
                if count > 1:
                    _HELD[(catalog.uri, n)] = (held, count - 1)
                else:
                    del _HELD[(catalog.uri, n)]
        if lease is not None:
            lease.release()


def lease_of(env, names: list[str]):
    """:func:`writer_lease` of ``names`` for an environment (a ``Trickle``: catalog, config,
    engine): a lost lease interrupts the environment's Spark work in flight."""
    engine = getattr(env, "engine", None)
    return writer_lease(env.catalog.location, names, seconds=env.config.lease_seconds,
                        on_lost=(lambda _: engine.interrupt()) if engine is not None else None)


def fence(catalog: Location, name: str, seconds: float) -> None:
    """Before a commit to ``name``'s storage: renew its lease, or raise.  A commit on an object
    store made without the lease is refused (a code path that forgot to take it)."""
    if not needs_lease(catalog, seconds):
        return
    with _HELD_LOCK:
        entry = _HELD.get((catalog.uri, name))
    if entry is None:
        raise LeaseLostError("a commit to its storage was attempted without its writer lease", stream_table=name)
    entry[0].fence(name)
