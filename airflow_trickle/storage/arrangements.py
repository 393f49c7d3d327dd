"""The arrangements a refresh keeps: one folder per (table, key), bounded in bytes.

An :class:`~airflow_trickle.storage.arrangement.Arrangement` is a cache of one Delta table;
this module decides where it lives, when it is rebuilt, and what is evicted:

* **where**: ``<root>/<id>`` with ``id`` a hash of the table's URI and the key, on the disk of
  the process that refreshes (an Airflow worker, the host of ``trickle serve``'s client); the
  page cache keeps a mapped file warm from one task process to the next;
* **shared**: the stream tables that probe one table by one key share one arrangement, holding
  the union of the columns they read.  One per column set would keep the same key and rows
  several times over, and the copies of one large table overflow the cache, each refresh
  rebuilding what the one before had evicted (benchmarks/README.md, "TPC-H at SF 3, all 22
  queries, with one arrangement per table and key");
* **rebuilt** when the table behind the URI is another one (its Delta id differs), when the
  version asked for is older than the base (vacuumed history makes that fail, and the caller
  scans), when a reader asks for a column it does not hold (widened to hold both readers'), or
  when its runs have grown past :data:`COMPACT_SHARE` of the base;
* **evicted**, least recently used first, when the folders together pass ``max_bytes``; the one
  just used stays.

Builds, catch-ups and opens of one folder hold an exclusive ``flock`` on ``<id>.lock``, so two
refreshes in two processes never read a half-written arrangement; what :meth:`ready` returns is
memory-mapped, and a rebuild by another process later replaces files without touching what is
mapped already.
"""
from __future__ import annotations

import fcntl
import hashlib
import logging
import os
import shutil
import time
from contextlib import contextmanager
from pathlib import Path

from airflow_trickle.storage.arrangement import Arrangement, Stale
from airflow_trickle.storage.errors import UNREADABLE

log = logging.getLogger(__name__)

#: A base is rebuilt when the rows of its runs pass this share of its own.
COMPACT_SHARE = 0.25
#: ... or when it has more runs than this.
MAX_RUNS = 64


class Arrangements:
    """The arrangements under ``root``, together at most ``max_bytes``."""

    def __init__(self, root: Path | str, max_bytes: int, storage_options: dict | None = None):
        self.root = Path(root)
        self.max_bytes = max_bytes
        self.storage_options = storage_options
        #: What :meth:`ready` did, for the refresh's log: "built", "caught up", "warm"
        self.events: list[str] = []
        #: Seconds :meth:`ready` spent building arrangements (a one-time cost, kept apart)
        self.build_seconds = 0.0

    def folder(self, uri: str, key: str) -> Path:
        digest = hashlib.sha1("\n".join([uri.rstrip("/"), key]).encode()).hexdigest()[:20]
        return self.root / digest

    def ready(self, uri: str, key: str, columns, versions: set[int], *, table_id: str) -> Arrangement:
        """The arrangement of the table at ``uri`` by ``key``, holding at least ``columns`` and
        able to give each of ``versions``: opened warm, caught up, or built at the oldest of
        them (with the columns it held before as well, for its other readers)."""
        folder = self.folder(uri, key)
        oldest = min(versions)
        held: list[str] = []
        with self._locked(folder):
            try:
                arranged = Arrangement.open(folder, storage_options=self.storage_options)
                held = [] if arranged.table_id != table_id else arranged.columns
                why = self._rebuild_because(arranged, oldest, table_id, columns)
            except Stale:
                arranged, why = None, "none kept"
            if why is None:
                before = arranged.latest
                try:
                    _catch_up(arranged, versions)
                except Stale as err:  # a change feed it cannot read (vacuumed, turned off): rebuilt
                    why = str(err)
                else:
                    if not all(arranged.holds(v) for v in versions):
                        why = (f"versions {sorted(versions)} not all held (base {arranged.version}, "
                               f"to {arranged.latest})")
                    else:
                        self.events.append(f"{uri}: warm" if arranged.latest == before
                                           else f"{uri}: caught up {before}->{arranged.latest}")
            if why is not None:
                started = time.monotonic()
                try:
                    arranged = Arrangement.build(folder, uri, key, [*held, *(c for c in columns if c not in held)],
                                                 version=oldest, storage_options=self.storage_options)
                except UNREADABLE:  # a column another reader held may be gone
                    if not held:
                        raise
                    arranged = Arrangement.build(folder, uri, key, list(columns), version=oldest,
                                                 storage_options=self.storage_options)
                _catch_up(arranged, versions)
                self.build_seconds += time.monotonic() - started
                self.events.append(f"{uri}: built at {oldest} ({why}) in {time.monotonic() - started:.1f} s, "
                                   f"{arranged.base.num_rows} rows, {arranged.nbytes} bytes")
            os.utime(folder)
        self.evict(keep=folder)
        return arranged

    def _rebuild_because(self, arranged: Arrangement, oldest: int, table_id: str, columns) -> str | None:
        if arranged.table_id != table_id:
            return "the table was replaced"
        missing = [c for c in columns if c not in arranged.columns]
        if missing:
            return f"widened by {', '.join(missing)}"
        if oldest < arranged.version:
            return f"version {oldest} is older than its base {arranged.version}"
        if len(arranged.runs) > MAX_RUNS or arranged.run_rows() > COMPACT_SHARE * max(arranged.base.num_rows, 1):
            return f"{len(arranged.runs)} runs of {arranged.run_rows()} rows (compacted)"
        return None

    # -- bounds --------------------------------------------------------------------------------

    def usage(self) -> list[tuple[Path, int, float]]:
        """``(folder, bytes, last used)`` of every arrangement kept, most recently used first."""
        if not self.root.is_dir():
            return []
        kept = []
        for folder in self.root.iterdir():
            if folder.is_dir():
                size = sum(p.stat().st_size for p in folder.iterdir() if p.is_file())
                kept.append((folder, size, folder.stat().st_mtime))
        return sorted(kept, key=lambda k: -k[2])

    def kept(self) -> list[dict]:
        """What each arrangement kept holds, most recently used first: the table, key, columns,
        versions, rows, bytes and when it was last used (for ``trickle health``)."""
        import json
        from datetime import datetime, timezone

        shown = []
        for folder, size, used in self.usage():
            try:
                manifest = json.loads((folder / "manifest.json").read_text())
            except (OSError, ValueError):
                continue
            runs = manifest.get("runs") or []
            held = None if manifest.get("rows") is None else manifest["rows"] + (manifest.get("run_rows") or 0)
            shown.append({"table": manifest.get("uri"), "key": manifest.get("key"),
                          "columns": ", ".join(manifest.get("columns") or []),
                          "versions": f"{manifest.get('version')}..{runs[-1][1] if runs else manifest.get('version')}",
                          "runs": len(runs), "rows": manifest.get("rows"), "run_rows": manifest.get("run_rows"),
                          "held_rows": held, "bytes": size,
                          "bytes_per_row": None if held is None else round(size / max(held, 1), 1),
                          "last_used": datetime.fromtimestamp(used, timezone.utc).isoformat(timespec="seconds")})
        return shown

    def evict(self, keep: Path | None = None) -> list[Path]:
        """Remove the least recently used arrangements until the rest fit ``max_bytes``."""
        removed, total = [], 0
        for folder, size, _ in self.usage():
            total += size
            if total > self.max_bytes and folder != keep:
                with self._locked(folder):
                    shutil.rmtree(folder, ignore_errors=True)
                removed.append(folder)
                total -= size
        for folder in removed:
            log.info("arrangement %s evicted (the cache holds at most %s bytes)", folder.name, self.max_bytes)
        return removed

    @contextmanager
    def _locked(self, folder: Path):
        self.root.mkdir(parents=True, exist_ok=True)
        with open(folder.with_suffix(".lock"), "a") as handle:
            fcntl.flock(handle, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(handle, fcntl.LOCK_UN)


def _catch_up(arranged: Arrangement, versions: set[int]) -> None:
    """Catch ``arranged`` up to each of ``versions`` newer than it, one run per version asked:
    a single run to the newest would merge the versions between, and a reader of one of them
    (another stream table, at an older frontier) would find it not held and rebuild."""
    for version in sorted(versions):
        arranged.catch_up(version)
