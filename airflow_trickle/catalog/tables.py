"""The catalog's Delta tables as delta-rs sees them: open handles, reads, appends, compaction,
retries on a concurrent commit.  ``store.py`` builds the catalog's verbs on top.

The catalog tables are small and touched on every refresh; through Spark each one-row write
costs one to two seconds of job overhead, through delta-rs a few milliseconds.  Two jobs may
write at once: history rows are blind appends, which never conflict; a read-modify-write that
meets a concurrent commit (Delta's conflict check) is retried whole from the read (:meth:`_retry`).
"""
from __future__ import annotations

import logging
import random
import threading
import time
from typing import TYPE_CHECKING, Callable, Iterable

from airflow_trickle.catalog.model import _schemas, utcnow
from airflow_trickle.errors import CatalogError

if TYPE_CHECKING:
    from airflow_trickle.location import Location

log = logging.getLogger(__name__)

TABLES = ("stream_tables", "dependencies", "refresh_history", "consistency_groups")

#: History rows newest first (a row not yet started or ended sorts as the newest).
_NEWEST_FIRST = [("start_time", "descending"), ("end_time", "descending")]
#: Compact a catalog table once it holds more data files than this.
_COMPACT_AFTER_FILES = 64
#: Hours a compacted-away catalog file stays on disk for readers that opened an older snapshot.
_READER_GRACE_HOURS = 1


class DeltaTables:
    """The catalog tables under ``root``, read and written with delta-rs."""

    def __init__(self, root: "Location | str", *, write_attempts: int = 8):
        from airflow_trickle.location import Location

        #: Where the catalog lives, with the options that reach it (a path: a local catalog).
        self.location = Location.of(root)
        self.root = self.location.uri
        self.write_attempts = write_attempts
        self.storage_options = self.location.delta_options
        self._ensured = False
        #: Reads reuse one open handle per catalog table, brought up to date by reading only
        #: the commits since (opening replays the log from its last checkpoint, up to a
        #: hundred commits: tens of milliseconds for each of a refresh's half-dozen reads).
        #: ``table -> (directory identity, handle, the reuse scope it was brought up to date in)``.
        self._handles: dict[str, tuple] = {}
        #: Each data file's rows, read once: Delta never changes a file once written, and a
        #: catalog table that is updated row by row holds one small file per stream table
        #: until it is compacted, so a read of 44 files per select cost ~100 ms (measured).
        self._file_rows = _FileRows()
        self._read_lock = threading.Lock()

    # -- plumbing ---------------------------------------------------------------------------

    def path(self, table: str) -> str:
        return f"{self.root}/{table}"

    def at(self, uri: str) -> "Location":
        """A table's location (as the catalog records it) with the warehouse's storage options:
        what every delta-rs read of a stream table or a source is given."""
        return self.location.at(uri)

    def ensure(self) -> None:
        """Create the catalog tables that do not exist yet (idempotent, safe to race)."""
        if self._ensured:
            return
        from deltalake import DeltaTable

        for table in TABLES:
            schema = _schemas()[table]
            if not DeltaTable.is_deltatable(self.path(table), storage_options=self.storage_options):
                self._retry(lambda t=table, s=schema: DeltaTable.create(
                    self.path(t), schema=s, mode="ignore", storage_options=self.storage_options,
                ), what=f"create catalog table {table}")
            else:
                try:
                    self._add_missing_columns(table, schema)
                except Exception:  # noqa: BLE001 - unreadable: its reads report it, and repair moves it aside
                    continue
        self._ensured = True

    def _add_missing_columns(self, table: str, schema) -> None:
        """A catalog written by an older version gains the columns added since (as nulls), so
        merges and predicates can name them."""
        from deltalake import DeltaTable, Field

        def attempt() -> None:
            dt = DeltaTable(self.path(table), storage_options=self.storage_options)
            present = {f.name for f in dt.schema().fields}
            missing = [Field.from_arrow(f) for f in schema if f.name not in present]
            if missing:
                dt.alter.add_columns(missing)

        self._retry(attempt, what=f"add the new columns of catalog table {table}")

    def _table(self, table: str):
        from deltalake import DeltaTable

        self.ensure()
        return DeltaTable(self.path(table), storage_options=self.storage_options)

    def _rows(self, table: str, filters: list | None = None, **order_and_limit) -> list[dict]:
        with self._read_lock:
            return _select(self._read_handle(table), table, filters, self._file_rows, location=self.location,
                           **order_and_limit)

    def _read_handle(self, table: str, *, newest: bool = False):
        """An up-to-date handle on ``table`` for reading: the one opened before, brought to the
        newest version incrementally -- when the table is local and its directory is still the
        one opened (a catalog table moved aside and made again by a repair is a new directory);
        otherwise, or when that fails, opened afresh.

        Inside one refresh (``storage.deltalog.reused_handles``) a handle is brought up to date
        (or, on an object store, opened) once, and again only after a write through this
        catalog: a refresh reads the catalog a dozen times (its dependencies alone six times,
        two tables each), and each catch-up lists the table's log: together a share of a
        refresh's time outside Spark (benchmarks/README.md, "TPC-H at SF 3, all 22: a refresh's
        bookkeeping halved, and a fairer turn order").  Its reads then see the catalog as
        of its first read, plus its own writes; its own row cannot change meanwhile (one writer
        at a time, ``storage/lease.py``).
        ``newest``: brought up to date whatever the scope (a read-modify-write reads through it)."""
        from airflow_trickle.storage.deltalog import reuse_scope

        scope = reuse_scope()
        identity = _directory_identity(self.path(table))
        kept = self._handles.get(table)
        same = kept is not None and kept[0] == identity
        if same and scope is not None and kept[2] is scope and not newest:
            return kept[1]  # opened or caught up in this refresh already (on an object store too)
        if same and identity is not None:
            try:
                kept[1].update_incremental()
                self._handles[table] = (identity, kept[1], scope)
                return kept[1]
            except Exception:  # noqa: BLE001 - safe: a fresh open below reads the whole log
                log.debug("catalog table %s: reopened", table, exc_info=True)
        handle = self._table(table)
        self._handles[table] = (identity, handle, scope)
        return handle

    def _written(self) -> None:
        """This catalog wrote: every kept handle is brought up to date at its next read."""
        self._handles = {table: (identity, handle, None) for table, (identity, handle, _) in self._handles.items()}

    def _arrow(self, table: str, rows: Iterable[dict]):
        import pyarrow as pa

        schema = _schemas()[table]
        rows = list(rows)
        return pa.Table.from_pylist([{f.name: row.get(f.name) for f in schema} for row in rows], schema=schema)

    def _append(self, table: str, rows: list[dict], what: str) -> None:
        from deltalake import write_deltalake

        self.ensure()
        data = self._arrow(table, rows)

        def attempt() -> None:
            # through the kept handle, brought up to date (opening the table: ~10 ms a write);
            # schema_mode="merge": a catalog written by an older version gains the newer columns
            with self._read_lock:
                write_deltalake(self._read_handle(table, newest=True), data, mode="append", schema_mode="merge")

        self._retry(attempt, what=what)
        self._maybe_compact(table)

    def _maybe_compact(self, table: str) -> None:
        # counted on the kept read handle (brought up to date: ~3 ms) -- opening the table anew
        # after every write replayed its log, ~25 ms of each refresh's two catalog writes
        with self._read_lock:
            files = len(self._read_handle(table).file_uris())
        if files > _COMPACT_AFTER_FILES:
            try:
                dt = self._table(table)
                dt.optimize.compact()
                dt.create_checkpoint()
                # Not 0: a reader in another process may have opened the snapshot before the
                # compaction and still be opening its files.
                dt.vacuum(retention_hours=_READER_GRACE_HOURS, enforce_retention_duration=False, dry_run=False)
            except Exception:  # noqa: BLE001 - housekeeping; a concurrent writer will compact later
                pass
            finally:
                self._written()

    def compact_all(self, *, retention_hours: int = 1) -> list[tuple[str, int, int]]:
        """Compact, checkpoint and vacuum every catalog table now (``trickle maintain``);
        ``(table, active files before, after)`` for each.  Files a reader may still be opening
        are kept for ``retention_hours``."""
        done = []
        for table in TABLES:
            dt = self._table(table)
            before = len(dt.file_uris())
            self._retry(lambda: dt.optimize.compact(), what=f"compact catalog table {table}")
            dt = self._table(table)
            dt.create_checkpoint()
            dt.vacuum(retention_hours=retention_hours, enforce_retention_duration=False, dry_run=False)
            done.append((table, before, len(self._table(table).file_uris())))
        return done

    def _retry(self, action: Callable[[], object], *, what: str):
        """Run ``action`` (a write); on a commit conflict, back off and run it again from the start."""
        try:
            return self._attempts(action, what=what)
        finally:
            self._written()

    def _attempts(self, action: Callable[[], object], *, what: str):
        for attempt in range(1, self.write_attempts + 1):
            try:
                return action()
            except Exception as err:  # noqa: BLE001 - classified below
                if not _is_conflict(err):
                    raise
                if attempt == self.write_attempts:
                    raise CatalogError(f"{what}: gave up after {attempt} conflicting attempts: {err}") from err
                time.sleep(min(1.0, 0.02 * 2 ** attempt) * (0.5 + random.random()))
        raise AssertionError("unreachable")

    def move_aside_unreadable(self) -> list[tuple[str, str, str]]:
        """Move each catalog table that cannot be read to ``<table>.damaged-<time>`` and make it
        again, empty (a local catalog only); ``(table, moved to, error)`` for each."""
        import os
        import shutil

        self._ensured = False  # a catalog table deleted since: made again, empty
        self.ensure()
        moved = []
        for table in TABLES:
            try:
                self._rows(table)
            except Exception as err:  # noqa: BLE001 - unreadable: damaged
                path = self.path(table).removeprefix("file://").removeprefix("file:")
                if "://" in path or not os.path.isdir(path):
                    raise CatalogError(f"catalog table {table} cannot be read and is not local: {err}") from err
                aside = f"{path}.damaged-{utcnow().strftime('%Y%m%dT%H%M%S')}"
                shutil.move(path, aside)
                moved.append((table, aside, str(err)))
        if moved:
            self._ensured = False
            self.ensure()
        return moved


def _select(delta_table, name: str, filters: list | None, file_rows: "_FileRows | None" = None, *,
            location: "Location | None" = None, order_by: list[tuple[str, str]] | None = None, limit: int | None = None) -> list[dict]:
    """Rows of a (small) catalog table whose columns equal the given values.

    Local tables are read file by file with pyarrow's own Parquet reader: reading through
    delta-rs's scanners left threads that abort the interpreter at exit (``terminate called
    without an active exception``, seen with deltalake 1.6 / pyarrow 26), and delta-rs writes
    string columns as ``string_view`` in some files, which pyarrow's dataset filters cannot
    compare with a string.  The catalog's writers never write deletion vectors, so the active
    files are the rows.  Files are cast to the catalog schema (and kept in ``file_rows``, when
    given, for the next read); filters, ``order_by`` and ``limit`` run in Arrow.  Files in an
    object store under ``location`` are fetched through it, each once for the same reasons.
    """
    import pyarrow as pa
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    schema = _schemas()[name]
    files = delta_table.file_uris()
    if all("://" not in f or f.startswith("file://") for f in files):
        file_rows = file_rows if file_rows is not None else _FileRows()
        parts = file_rows.read(name, files, lambda f: _conform(pq.read_table(f.removeprefix("file://")), schema))
        data = pa.concat_tables(parts) if parts else schema.empty_table()
    elif location is not None and all(f.startswith(location.uri + "/") for f in files):
        file_rows = file_rows if file_rows is not None else _FileRows()
        prefix = len(location.uri) + 1
        parts = file_rows.read(name, files, lambda f: _conform(
            pq.read_table(pa.BufferReader(location.read(f[prefix:]))), schema))
        data = pa.concat_tables(parts) if parts else schema.empty_table()
    else:
        data = _conform(delta_table.to_pyarrow_table(), schema)
    mask = None
    for column, op, value in filters or []:
        if op != "=":
            raise ValueError(f"unsupported catalog filter {op!r}")
        condition = pc.equal(data[column], value)
        mask = condition if mask is None else pc.and_(mask, condition)
    data = data if mask is None else data.filter(mask)
    if order_by:  # nulls first: with "descending", a missing time counts as the newest
        try:
            data = data.sort_by([(column, order, "at_start") for column, order in order_by])
        except (TypeError, ValueError):  # a pyarrow before per-key null placement (26 deprecates the other)
            data = data.sort_by(order_by, null_placement="at_start")
    return (data if limit is None else data.slice(0, limit)).to_pylist()


class _FileRows:
    """The rows of catalog data files already read, per catalog table and file URI, as Arrow
    tables.

    Sound because a Delta data file is immutable; only the files of the version last read are
    kept, so the cache never outgrows the catalog.
    """

    def __init__(self) -> None:
        self._by_table: dict[str, dict[str, object]] = {}

    def read(self, table: str, files: list[str], read_file: Callable[[str], object]) -> list:
        known = self._by_table.get(table, {})
        current = {f: known[f] if f in known else read_file(f) for f in files}
        self._by_table[table] = current
        return list(current.values())


def _directory_identity(path: str) -> tuple | None:
    """What tells a local table's directory from one made again at the same path: its device
    and inode, and when its first commit was written (a directory deleted and made again may get
    the freed inode back, not the old first commit); None for a remote or missing table."""
    import os

    local = path.removeprefix("file://").removeprefix("file:")
    if "://" in local:
        return None
    try:
        stat = os.stat(local)
    except OSError:
        return None
    try:  # cleaned up with old log entries after a checkpoint: then the inode alone
        first = os.stat(os.path.join(local, "_delta_log", "00000000000000000000.json")).st_mtime_ns
    except OSError:
        first = None
    return stat.st_dev, stat.st_ino, first


def _conform(table, schema):
    """``table`` with exactly ``schema``'s columns and types (absent columns as nulls)."""
    import pyarrow as pa

    columns = [table[f.name].cast(f.type) if f.name in table.column_names else pa.nulls(table.num_rows, f.type)
               for f in schema]
    return pa.Table.from_arrays(columns, schema=schema)


def _is_conflict(err: BaseException) -> bool:
    from deltalake.exceptions import CommitFailedError

    if isinstance(err, CommitFailedError):
        return True
    text = f"{type(err).__name__}: {err}"
    return any(marker in text for marker in ("CommitFailed", "Transaction failed", "already exists", "conflict",
                                             "Conflict", "VersionAlreadyExists"))
