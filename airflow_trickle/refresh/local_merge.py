"""Small changes committed by delta-rs instead of Spark's MERGE.

Why: a Delta MERGE run by Spark costs 0.7 s or more however small the change -- it rebuilds
the target's snapshot, materializes the source, finds and rewrites the touched files, about 11
Spark jobs of mostly driver time -- and it is the floor under every keyed DIFFERENTIAL refresh.
delta-rs applies the same change to a table of 10,000 rows in about 20 ms, in this process.

Spark still computes everything: the MERGE the DVM wrote is resolved into rows, each change
against the stored row it matches (``refresh/resolution.py``; the stored rows read by delta-rs
where it can, ``refresh/stored_reads.py``), and delta-rs only applies those resolved rows by the
stored row's identity.

Safety is the Spark path's: the commit carries the same metadata (frontier, refresh number) and
the same idempotent transaction id -- delta-rs writes the ``txn`` action, and a refresh number
that already landed is skipped, as Spark skips it; the commit is made on the version Spark read,
so any concurrent commit fails it (delta-rs's conflict check) and the refresh retries from the
start.  Used only where delta-rs writes exactly what Spark would: small changes (the cost
model's estimate), tables without column mapping, deletion vectors or other writer features
delta-rs does not write, and columns of primitive types; everything else keeps Spark's MERGE.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from deltalake.exceptions import CommitFailedError, DeltaError

from airflow_trickle.model import DUP, ROW_ID
from airflow_trickle.refresh.commit_tag import CommitTag, NotApplicable
from airflow_trickle.refresh.resolution import ACTION, MATCHED_DUP, MATCHED_ID
from airflow_trickle.refresh.stored_reads import resolve_changes
from airflow_trickle.refresh.writable import spark_columns, why_not_writable
from airflow_trickle.storage.deltalog import open_table

if TYPE_CHECKING:
    from airflow_trickle.location import Location

log = logging.getLogger(__name__)

def describe(location: "Location", max_rows: int) -> str:
    """How a DIFFERENTIAL refresh of the storage table at ``location`` commits (for explain)."""
    if max_rows <= 0:
        return "Spark's MERGE (local_commit_max_rows is 0)"
    why_not = why_not_writable(open_table(location))
    if why_not:
        return f"Spark's MERGE (delta-rs does not write this table: {why_not})"
    return (f"delta-rs, for changes expected to touch at most {max_rows:,} stored rows (Spark resolves "
            "them against the stored rows; a change that only adds rows is appended); Spark's MERGE or INSERT "
            "above that")


def merge_locally(spark, location: "Location", merge_sql: str, *, tag: CommitTag, max_rows: int, resolved=None,
                  expected_version: int | None = None) -> dict | None | NotApplicable:
    """Apply ``merge_sql`` to the storage table at ``location`` through delta-rs, under ``tag``.

    Returns MERGE-shaped metrics; None when the refresh's transaction had landed already
    (nothing written, as Spark skips it); :class:`NotApplicable` when this path does not apply
    (the caller runs the MERGE on Spark): the table, or more than ``max_rows`` resolved rows
    (the estimate was wrong; they are not brought into this process).  ``resolved(table)``, when given,
    returns the MERGE's resolved changes computed already (a top-K's: ``refresh/local_topk.py``),
    or None when they do not apply to ``table`` as opened (then Spark resolves ``merge_sql``).
    ``expected_version``, when given, is the version ``merge_sql``'s change was computed on (a
    FULL refresh's difference): a table found at another raises ``CommitFailedError`` (retried).
    """
    table = open_table(location, fresh=True)
    if expected_version is not None and table.version() != expected_version:
        raise CommitFailedError(f"the table moved from version {expected_version} to {table.version()} "
                                "since the change was computed")
    why_not = why_not_writable(table)
    if why_not:
        return NotApplicable(f"delta-rs does not write this table: {why_not}")
    columns = spark_columns(table)
    if tag.landed_in(table):
        return None
    changes = resolved(table) if resolved is not None else None
    if changes is None:
        changes = resolve_changes(spark, table, merge_sql, columns, max_rows)
    if changes is False:
        return NotApplicable("a MERGE clause this path does not resolve")
    if changes is None or changes.num_rows > max_rows:
        return NotApplicable(f"more than {max_rows:,} resolved changes (local_commit_max_rows)")
    counts = {"num_inserted_rows": 0, "num_updated_rows": 0, "num_deleted_rows": 0}
    if changes.num_rows == 0:
        return counts  # nothing to write; the catalog records the new frontier
    quoted = {f'"{name}"': f's."{name}"' for name, _ in columns}
    identity = f't."{ROW_ID}" = s."{MATCHED_ID}" AND t."{DUP}" = s."{MATCHED_DUP}"'
    tag.fence()
    try:
        done = _merge(table, changes, identity, quoted, tag)
    except CommitFailedError:
        raise  # a concurrent commit: the refresh retries from the start
    except DeltaError as err:
        # Nothing landed (delta-rs commits last), or it did and Spark's MERGE is skipped by the
        # transaction id: either way Spark's MERGE is safe, and a delta-rs limit costs speed only.
        log.warning("delta-rs could not commit the change (%s); committed by Spark's MERGE", str(err)[:300])
        return NotApplicable(f"delta-rs could not commit it: {str(err)[:300]}")
    log.info("committed %d resolved changes with delta-rs in %s ms", changes.num_rows, done.get("execution_time_ms"))
    return {"num_inserted_rows": done.get("num_target_rows_inserted", 0),
            "num_updated_rows": done.get("num_target_rows_updated", 0),
            "num_deleted_rows": done.get("num_target_rows_deleted", 0)}


def _merge(table, changes, identity: str, quoted: dict, tag: CommitTag) -> dict:
    return (table.merge(changes, identity, source_alias="s", target_alias="t",
                        commit_properties=tag.delta_rs_properties())
            .when_matched_delete(predicate=f"s.\"{ACTION}\" = 'D'")
            .when_matched_update(quoted, predicate=f"s.\"{ACTION}\" = 'U'")
            .when_not_matched_insert(quoted, predicate=f"s.\"{ACTION}\" = 'I'")
            .execute())
