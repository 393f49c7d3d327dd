"""Rows computed by Spark and written by delta-rs instead of Spark's INSERT OVERWRITE (a FULL
refresh's small result) or INSERT (a small DIFFERENTIAL append).

Why: Spark's ``INSERT OVERWRITE`` of a Delta table has a fixed price however few rows it
writes -- it rebuilds the target's snapshot, plans and runs the write job, collects the file
statistics and commits, in jobs of mostly driver time.  A FULL refresh of an aggregate writes a
handful of rows, and that price can double its time (benchmarks/README.md, "TPC-H at SF 3, all
22: a FULL refresh's small result written by delta-rs").  delta-rs replaces a small table's
files in this process, without those jobs.  The same holds for a DIFFERENTIAL delta that only
adds rows (a filter or an inner join over sources that only gained rows): Spark's INSERT of a
few rows costs most of a small refresh (:func:`append_locally`).

Spark still computes every row, hidden columns included (the statement is the overwrite's own
``SELECT``); only the rows travel, at most ``local_commit_max_rows`` of them, and only for a
table that held at most that many rows before (a result that turns out larger is written by
Spark's overwrite, which computes it again: once, since the table is large from then on).

Safety is the Spark path's (``refresh/apply.py``): the commit carries the refresh's metadata
(frontier, refresh number) and its idempotent transaction id (a refresh number that landed
already is skipped, as Spark skips it); the writer lease is fenced just before; a concurrent
commit fails delta-rs's conflict check and the refresh retries.  Tables delta-rs does not write
as Spark does (``refresh/writable.why_not_writable``) keep Spark's overwrite.  The change feed of
the replaced table is read from its added and removed files, as after Spark's overwrite (neither
writes change files for it).
"""
from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Literal

import pyarrow as pa
from deltalake import write_deltalake
from deltalake.exceptions import CommitFailedError, DeltaError

from airflow_trickle.refresh.commit_tag import CommitTag, NotApplicable
from airflow_trickle.refresh.stored_reads import at_most
from airflow_trickle.refresh.writable import why_not_writable
from airflow_trickle.sql.rewrite import hoist_nested_ctes
from airflow_trickle.storage.deltalog import open_table, stored_row_count

if TYPE_CHECKING:
    from airflow_trickle.location import Location

log = logging.getLogger(__name__)


def overwrite_locally(spark, location: "Location", rows_sql: str, *, tag: CommitTag,
                      max_rows: int) -> None | NotApplicable:
    """Replace the rows of the storage table at ``location`` with those of ``rows_sql`` (every
    stored column, by name), computed by Spark and written by delta-rs under ``tag``.

    None when written, or when the refresh's transaction had landed already (nothing written,
    as Spark skips it); :class:`NotApplicable` when this path does not apply and the caller
    runs Spark's overwrite: delta-rs does not write the table as Spark does, it holds more than
    ``max_rows`` rows, or the result does (then not brought into this process beyond
    ``max_rows + 1`` rows).
    """
    return _write_locally(spark, location, rows_sql, tag=tag, max_rows=max_rows, mode="overwrite")


def append_locally(spark, location: "Location", rows_sql: str, *, tag: CommitTag,
                   max_rows: int) -> None | NotApplicable:
    """Append the rows of ``rows_sql`` (every stored column, by name), computed by Spark, to the
    storage table at ``location`` with delta-rs under ``tag``.

    None when written, or when the refresh's transaction had landed already; :class:`NotApplicable`
    when the caller runs Spark's INSERT: delta-rs does not write the table as Spark does, it is
    partitioned, or there are more than ``max_rows`` rows (not brought into this process beyond
    ``max_rows + 1``).  Like Spark's append it writes no change files: the change feed reads its
    inserts from the added files.
    """
    return _write_locally(spark, location, rows_sql, tag=tag, max_rows=max_rows, mode="append")


def _write_locally(spark, location: "Location", rows_sql: str, *, tag: CommitTag, max_rows: int,
                   mode: Literal["overwrite", "append"]) -> None | NotApplicable:
    """The rows of ``rows_sql`` written in delta-rs's ``mode``, or why Spark writes them instead."""
    table = open_table(location, fresh=True)
    why_not = why_not_writable(table)
    if why_not:
        return NotApplicable(f"delta-rs does not write this table: {why_not}")
    if mode == "append" and table.metadata().partition_columns:
        return NotApplicable("a partitioned table")
    if tag.landed_in(table):
        return None
    if mode == "overwrite" and stored_row_count(table) > max_rows:
        return NotApplicable(f"the table holds more than {max_rows:,} rows (local_commit_max_rows)")
    rows = at_most(spark.sql(hoist_nested_ctes(rows_sql)), max_rows)
    if rows is None:
        return NotApplicable(f"more than {max_rows:,} rows to {mode} (local_commit_max_rows)")
    if mode == "append" and rows.num_rows == 0:
        return None  # nothing to write; the catalog records the new frontier
    try:
        rows = as_stored(rows, pa.schema(table.schema().to_arrow()))
    except (KeyError, pa.ArrowException) as err:  # a value Spark's store assignment would decide about
        return NotApplicable(f"the rows do not fit the stored columns as computed ({err})")
    tag.fence()
    try:
        write_deltalake(table, rows, mode=mode, commit_properties=tag.delta_rs_properties())
    except CommitFailedError:
        raise  # a concurrent commit: the refresh retries from the start
    except DeltaError as err:  # delta-rs commits last: nothing landed, and Spark's statement is safe
        log.warning("delta-rs could not %s the rows (%s); written by Spark", mode, str(err)[:300])
        return NotApplicable(f"delta-rs could not write it: {str(err)[:300]}")
    log.info("%d rows written by delta-rs (%s)", rows.num_rows, mode)
    return None


def as_stored(rows: pa.Table, schema: pa.Schema) -> pa.Table:
    """``rows`` (as Spark handed them over) in the stored table's column order and Arrow types.

    Spark computed each value in the stored column's type already (the storage table was made
    from the same query); what differs is Arrow's rendering -- a timestamp's zone name, a
    field's nullability -- which the cast settles without changing a value.

    >>> spark_rows = pa.table({"n": pa.array([1], pa.int64()), "k": pa.array(["a"])})
    >>> as_stored(spark_rows, pa.schema([pa.field("k", pa.string()), pa.field("n", pa.int64())])).column_names
    ['k', 'n']
    """
    by_name = {name.lower(): name for name in rows.column_names}
    return pa.Table.from_arrays([rows.column(by_name[field.name.lower()]).combine_chunks().cast(field.type)
                                 for field in schema], schema=schema)
