"""A FULL refresh of a large bag table applied as its difference, computed once and committed
like a DIFFERENTIAL refresh's small change.

Why: a FULL refresh of a stream table that a DIFFERENTIAL stream table reads must change only
what changed (its change feed stays small: ``refresh/full.py``).  Written as one MERGE of the
difference, Spark joined every recomputed row with every stored one, scanned the target twice to
delete the rows that are gone, and rewrote the files those lay in: 30-40 s for a 9M-row table on
two cores (``benchmarks/cascade.py``, 10M rows), where its DIFFERENTIAL refresh takes 3 s.

Here Spark computes the difference once, consolidated per content (the recomputed rows +1, the
stored ones -1, what both hold cancels out), reading the stored table at the version the commit
will be made on.  At most ``local_commit_max_rows`` changed contents come back, become a local
relation, and are applied as a DIFFERENTIAL refresh applies a bag delta
(:func:`~airflow_trickle.dvm.bag.bag_merge_sql`): its copies numbered against the stored ones
that delta-rs reads by their keys, the change committed by delta-rs (``refresh/local_merge.py``),
or by Spark's MERGE of those few rows where delta-rs does not write the table.

Safety is the DIFFERENTIAL commit's: the same metadata and idempotent transaction id, the writer
lease fenced before the commit, and a commit on another version than the difference read fails
(retried from the start: the difference is computed again).
"""
from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Callable

from airflow_trickle.dvm.bag import bag_merge_sql
from airflow_trickle.refresh.commit_tag import NotApplicable
from airflow_trickle.refresh.full import bag_difference_sql
from airflow_trickle.refresh.stored_reads import at_most
from airflow_trickle.storage.deltalog import open_table

if TYPE_CHECKING:
    from airflow_trickle.location import Location

log = logging.getLogger(__name__)


def apply_difference(spark, engine, location: "Location", result_sql: str, *, target: str, columns: list[str],
                     dup_type: str, max_rows: int, merge: Callable[..., dict | None | NotApplicable],
                     commit: Callable[[str], dict | None]):
    """Apply the difference between ``result_sql``'s rows and those stored in the bag table
    ``target`` (at ``location``; ``columns``: its visible ones, ``dup_type`` its copy numbers'
    type) as a bag delta.

    ``merge(sql, expected_version=v)`` commits a MERGE through delta-rs (:class:`NotApplicable`:
    it does not apply, then ``commit(sql)`` runs it on Spark).  Returns the commit's MERGE-shaped
    metrics (None: the transaction had landed already), or :class:`NotApplicable` when the
    difference holds more than ``max_rows`` changed contents (not brought into this process):
    the caller runs the whole statement on Spark.
    """
    version = open_table(location, fresh=True).version()
    frame = spark.sql(bag_difference_sql(result_sql, target, columns, version=version, consolidated=True))
    rows = at_most(frame, max_rows)
    if rows is None:
        return NotApplicable(f"the difference holds more than {max_rows:,} changed rows (local_commit_max_rows)")
    view = f"__trickle_difference_{version}_{id(rows)}"
    engine.local_relation(rows, view, schema=frame.schema)
    try:
        delta = bag_merge_sql(target, columns, f"SELECT * FROM {view}", dup_type)
        metrics = merge(delta, expected_version=version)
        return commit(delta) if isinstance(metrics, NotApplicable) else metrics
    finally:
        engine.drop_view(view)
