"""An arrangement: a join input's columns sorted by its join key, probed by a change's keys.

A delta term such as ``Δorders ⋈ lineitem_old`` needs the few line items of the changed orders;
Spark finds them by scanning ``lineitem`` (Delta has no index, and random keys defeat file
skipping: ``benchmarks/README.md``).  An arrangement keeps the columns a query reads of such an
input sorted by the key, in an Arrow IPC file the refresh's process memory-maps -- the page
cache keeps it warm from one task process to the next -- so that the rows of k keys cost k
binary searches and a gather, not a scan.

It is a **cache, never the truth**:

* it holds the input at one Delta version (its *base*), plus *runs* of the change rows of later
  versions, read from the table's change feed with delta-rs (``catch_up``), each with its signed
  weight; a probe names the version it wants, and gets exactly the table's rows at that version
  whose key it asks for, as a bag (base rows and runs consolidated), or :class:`Stale` when the
  arrangement cannot give that version (older than its base, or a change feed it cannot read) --
  the caller then rebuilds it or scans;
* rows whose key is NULL are left out: an equality join never matches them;
* the key must be an integer or a date (a sorted NumPy view of the mapped column); anything else
  is refused at build.

Measured beside today's scans in ``benchmarks/arrangement_spike.py`` (``benchmarks/README.md``).
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from airflow_trickle.storage.deltalog import why_rows_unreadable
from airflow_trickle.storage.errors import UNREADABLE

#: The signed multiplicity of a run's row (+1 inserted, -1 deleted).
WEIGHT = "__trickle_w"
_INSERTED = pa.array(["insert", "update_postimage"])


class Stale(LookupError):
    """The arrangement cannot give the version asked for; rebuild it or scan the table."""


def why_key_unarrangeable(table, key: str) -> str | None:
    """Why the delta-rs ``table`` cannot be arranged by ``key`` (None: it can): only integers and
    dates are, whose order and equality Arrow and Spark agree on.  Read from the log's schema,
    so the plan checks it before a build is attempted."""
    kind = pa.schema(table.schema().to_arrow()).field(key).type
    if pa.types.is_integer(kind) or pa.types.is_date(kind):
        return None
    return f"cannot arrange by {key} of type {kind} (integers and dates only)"


class Unarrangeable(LookupError):
    """The table cannot be arranged or its change read here: a key of a type arrangements do
    not hold, or a table delta-rs does not read as Spark does.  The caller has Spark scan it."""


@dataclass
class Arrangement:
    """The rows of ``columns`` of one Delta table, sorted by ``key``, at ``version`` plus ``runs``."""

    folder: Path
    uri: str
    key: str
    columns: list[str]
    version: int
    base: pa.Table
    keys: np.ndarray
    #: ``(old, new, rows with WEIGHT)``: the change rows of versions ``(old, new]``, contiguous
    runs: list[tuple[int, int, pa.Table]] = field(default_factory=list)
    storage_options: dict | None = None
    #: The Delta table's id (its metadata's): a table replaced at the same URI is another table.
    table_id: str = ""

    # -- making and opening --------------------------------------------------------------------

    @classmethod
    def build(cls, folder: Path, uri: str, key: str, columns: list[str], *, version: int | None = None,
              storage_options: dict | None = None) -> "Arrangement":
        """Read ``columns`` of the table at ``uri`` (``version``, else its newest) with delta-rs,
        sort them by ``key`` and write the arrangement into ``folder`` (replacing one there)."""
        from deltalake import DeltaTable

        if key not in columns:
            columns = [key, *columns]
        table = DeltaTable(uri, version=version, storage_options=storage_options)
        why_not = why_rows_unreadable(table)
        if why_not:
            raise Unarrangeable(f"{uri}: delta-rs does not read its rows as Spark does ({why_not})")
        why_not = why_key_unarrangeable(table, key)  # checked before anything is read
        if why_not:
            raise Unarrangeable(f"{uri}: {why_not}")
        rows = table.to_pyarrow_dataset().to_table(columns=columns)
        rows = rows.filter(pc.is_valid(rows[key]))
        rows = rows.take(pc.sort_indices(rows, sort_keys=[(key, "ascending")])).combine_chunks()
        folder.mkdir(parents=True, exist_ok=True)
        # the new base under its own name, then the manifest naming it, then the old files: a
        # build killed at any point leaves the old arrangement whole, or one that cannot open
        _write(folder / _base_name(table.version()), rows)
        cls(folder, uri, key, columns, table.version(), rows, np.array([]),
            table_id=table.metadata().id)._write_manifest()
        for old in [*folder.glob("run-*.arrow"), *folder.glob("base-*.arrow")]:
            if old.name != _base_name(table.version()):
                old.unlink()
        return cls.open(folder, storage_options=storage_options)

    @classmethod
    def open(cls, folder: Path, *, storage_options: dict | None = None) -> "Arrangement":
        """The arrangement kept in ``folder``, its files memory-mapped; :class:`Stale` if none."""
        try:
            manifest = json.loads((folder / "manifest.json").read_text())
            base = _read(folder / _base_name(int(manifest["version"])))
            runs = [(old, new, _read(folder / f"run-{old}-{new}.arrow")) for old, new in manifest["runs"]]
        except (OSError, ValueError, KeyError, pa.ArrowInvalid) as err:
            raise Stale(f"no arrangement in {folder}: {err}") from None
        key = manifest["key"]
        keys = (np.asarray(base[key].chunk(0).to_numpy(zero_copy_only=False)) if base.num_rows
                else np.array([], dtype="int64"))
        return cls(folder, manifest["uri"], key, list(manifest["columns"]), int(manifest["version"]), base, keys,
                   runs, storage_options, manifest.get("table_id", ""))

    @property
    def latest(self) -> int:
        """The newest version the arrangement can give."""
        return self.runs[-1][1] if self.runs else self.version

    @property
    def nbytes(self) -> int:
        """Bytes of its files (the base is mapped, not copied)."""
        return sum(p.stat().st_size for p in self.folder.glob("*.arrow"))

    # -- keeping up ----------------------------------------------------------------------------

    def catch_up(self, version: int) -> None:
        """Add the change feed's rows up to ``version`` as a run (delta-rs); :class:`Stale` when
        the feed cannot be read (not enabled, or vacuumed)."""
        if version <= self.latest:
            return
        try:
            rows = change_rows(self.uri, self.latest, version, self.columns, self.storage_options)
        except (Unarrangeable, *UNREADABLE) as err:  # a feed that cannot be read means: rebuild
            raise Stale(f"{self.uri}: change feed ({self.latest}, {version}] unreadable: {err}") from None
        self.add_run(self.latest, version, rows)

    def add_run(self, old: int, new: int, changes: pa.Table) -> None:
        """Keep ``changes`` -- the table's change rows of versions ``(old, new]``, ``columns`` plus
        :data:`WEIGHT` -- as a run (a caller that read them already saves a second read)."""
        if new <= self.latest:
            return
        if old != self.latest:
            raise Stale(f"{self.uri}: arranged up to {self.latest}, changes from {old}")
        run = changes.select([*self.columns, WEIGHT]).cast(self._weighted_schema())
        run = run.filter(pc.is_valid(run[self.key]))
        _write(self.folder / f"run-{old}-{new}.arrow", run)
        self.runs.append((old, new, _read(self.folder / f"run-{old}-{new}.arrow")))
        self._write_manifest()

    def run_rows(self) -> int:
        return sum(r.num_rows for _, _, r in self.runs)

    def holds(self, version: int) -> bool:
        """Whether :meth:`probe` can give ``version``: the base's, or the end of a run."""
        return version == self.version or any(new == version for _, new, _ in self.runs)

    # -- probing -------------------------------------------------------------------------------

    def base_rows_of(self, wanted) -> int:
        """How many rows of the base hold a key among ``wanted`` (two binary searches a key:
        what a probe would gather, before it does)."""
        return int(self._spans(wanted)[2].sum())

    def _spans(self, wanted):
        """``(wanted keys, distinct; where each one's rows start in the base; how many)``."""
        wanted = np.unique(np.asarray(wanted, dtype=self.keys.dtype if self.keys.size else None))
        low = np.searchsorted(self.keys, wanted, "left")
        return wanted, low, np.searchsorted(self.keys, wanted, "right") - low

    def probe(self, wanted, version: int, columns: list[str] | None = None) -> pa.Table:
        """The table's rows at ``version`` whose key is among ``wanted``: a bag of ``columns``
        (default: all it holds).  A reader of some of the columns gets them projected before
        the rows are gathered -- an arrangement shared by several readers holds all theirs."""
        if not self.holds(version):
            raise Stale(f"{self.uri}: arranged at {self.version} with runs to {self.latest}; "
                        f"version {version} asked")
        columns = list(columns or self.columns)
        wanted, low, lengths = self._spans(wanted)
        total = int(lengths.sum())
        starts = np.repeat(low - np.cumsum(lengths) + lengths, lengths)
        base = self.base.select(columns)
        taken = base.take(pa.array(np.arange(total) + starts)) if total else base.slice(0, 0)
        value_set = pa.array(wanted, type=self.base.schema.field(self.key).type)
        runs = [rows.filter(pc.is_in(rows[self.key], value_set=value_set)).select([*columns, WEIGHT])
                for _, new, rows in self.runs if new <= version]
        runs = [r for r in runs if r.num_rows]
        if not runs:
            return taken
        # a projection of a bag with signed weights is the bag of the projections: exact
        weighted = taken.append_column(WEIGHT, pa.array(np.ones(total, "int64"))).cast(runs[0].schema)
        net = pa.concat_tables([weighted, *runs]).group_by(columns, use_threads=False).aggregate(
            [(WEIGHT, "sum")])
        counts = net[f"{WEIGHT}_sum"].to_numpy()
        if (counts < 0).any():
            raise Stale(f"{self.uri}: its runs delete rows its base does not hold")
        return net.select(columns).take(pa.array(np.repeat(np.arange(net.num_rows), counts)))

    def _write_manifest(self) -> None:
        """What :meth:`open` needs besides the files, written atomically."""
        manifest = {"uri": self.uri, "key": self.key, "columns": self.columns, "version": self.version,
                    "table_id": self.table_id, "runs": [[old, new] for old, new, _ in self.runs],
                    "rows": self.base.num_rows, "run_rows": sum(rows.num_rows for _, _, rows in self.runs)}
        partial = self.folder / "manifest.partial"
        partial.write_text(json.dumps(manifest))
        os.replace(partial, self.folder / "manifest.json")

    def _weighted_schema(self) -> pa.Schema:
        return pa.schema([*(f.with_nullable(True) for f in self.base.schema), pa.field(WEIGHT, pa.int64())])


def change_rows(uri: str, after: int, up_to: int, columns: list[str], storage_options: dict | None = None) -> pa.Table:
    """The change feed of the table at ``uri`` over versions ``(after, up_to]`` (delta-rs):
    ``columns`` plus :data:`WEIGHT`, +1 for an insert or post-image, -1 for a delete or pre-image.

    Refused (:class:`Unarrangeable`; the caller has Spark read the feed) for a table delta-rs does not read
    as Spark does: with deletion vectors, delta-rs 1.6.6 derives a delete's rows from the vectors
    and, where one names rows past a file's first row group, panics in a thread that cannot
    unwind -- the whole process aborts, beyond any ``except``."""
    from deltalake import DeltaTable

    table = DeltaTable(uri, storage_options=storage_options)
    why_not = why_rows_unreadable(table)
    if why_not:
        raise Unarrangeable(f"{uri}: delta-rs does not read its change feed as Spark does ({why_not})")
    rows = pa.table(table.load_cdf(after + 1, up_to, columns=[*columns, "_change_type"]))
    inserted = pc.is_in(rows["_change_type"].cast(pa.string()), value_set=_INSERTED)
    weight = pc.if_else(inserted, pa.scalar(1, pa.int64()), pa.scalar(-1, pa.int64()))
    return rows.select(columns).append_column(WEIGHT, weight)


def _base_name(version: int) -> str:
    return f"base-{version}.arrow"


def _write(path: Path, rows: pa.Table) -> None:
    """Write ``rows`` as one record batch (one contiguous column each, mapped whole), atomically."""
    partial = path.with_suffix(".partial")
    with pa.OSFile(str(partial), "wb") as sink, pa.ipc.new_file(sink, rows.schema) as writer:
        writer.write_table(rows.combine_chunks(), max_chunksize=max(rows.num_rows, 1))
    os.replace(partial, path)


def _read(path: Path) -> pa.Table:
    return pa.ipc.open_file(pa.memory_map(str(path))).read_all()
