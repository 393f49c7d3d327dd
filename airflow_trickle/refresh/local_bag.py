"""A bag table's delta resolved in this process once Spark has computed it.

Why: the bag MERGE (``dvm/bag.bag_merge_sql``) pairs the consolidated delta with the stored
copies of the contents it names, to number new copies after the highest stored one and delete
the highest-numbered ones.  Resolved by Spark (``refresh/stored_reads.resolve_reading_stored_rows``)
that took three statements -- the keys, the change rows over the copies delta-rs read, and their
resolution -- each at Spark's fixed price per statement on two cores: 1.2-2.5 s of a 3 s hop of
a chain of bag tables at 9M stored rows (``benchmarks/README.md``), for ~12k changed rows.

Here Spark computes the consolidated, hashed delta once (every value, the content hash
included, is Spark's, cast by Spark to the stored column's type); delta-rs reads the stored
copies of the contents it names (their identity columns only); the rest is pairing numbers over
a few thousand rows, as the MERGE pairs them:

* a content gaining k copies gets copies ``n+1 .. n+k``, ``n`` its highest stored copy number
  (0 when none is stored);
* a content losing k copies loses its k highest-numbered stored copies.

delta-rs commits the result (``refresh/local_merge.merge_locally``) on the version the copies
were read from; anything this path does not take -- more changed contents than a local commit
takes, a table too large to read the copies from -- keeps the Spark resolution or the MERGE.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from airflow_trickle.dvm.bag import CONTENT_HASH
from airflow_trickle.dvm.base import W
from airflow_trickle.model import DUP, ROW_ID
from airflow_trickle.refresh.plan import StoredRead, stored_read
from airflow_trickle.refresh.writable import writable_columns
from airflow_trickle.refresh.resolution import resolved_rows
from airflow_trickle.refresh.stored_reads import at_most
from airflow_trickle.sql.rewrite import hoist_nested_ctes
from airflow_trickle.storage.deltalog import stored_row_count

log = logging.getLogger(__name__)


def resolved_bag_changes(delta: pa.Table, stored: pa.Table, schema: pa.Schema) -> pa.Table:
    """The resolved changes applying the consolidated bag ``delta`` (its columns, the net copies
    ``W`` and each content's ``__trickle_row_id``) to the ``stored`` copies of its contents
    (``__trickle_row_id``, ``__trickle_dup``), as ``dvm/bag.bag_merge_sql`` applies it.
    ``schema`` is the stored table's.

    >>> schema = pa.schema([("v", pa.int64()), (ROW_ID, pa.int64()), (DUP, pa.int64())])
    >>> stored = pa.table({ROW_ID: [11, 11, 11, 22], DUP: [1, 5, 2, -7]})
    >>> delta = pa.table({"v": [1, 2, 3], W: [-2, 2, 1], ROW_ID: [11, 22, 33]})
    >>> rows = resolved_bag_changes(delta, stored, schema).to_pylist()
    >>> [(r["__trickle_merge_action"], r["v"], r[DUP], r["__trickle_merge_id"], r["__trickle_merge_dup"])
    ...  for r in rows]  # doctest: +NORMALIZE_WHITESPACE
    [('D', None, None, 11, 5), ('D', None, None, 11, 2), ('I', 2, -6, None, None), ('I', 2, -5, None, None),
     ('I', 3, 1, None, None)]
    """
    stored_ids, stored_dups = (stored[c].combine_chunks().to_numpy(zero_copy_only=False) for c in (ROW_ID, DUP))
    order = np.lexsort((-stored_dups, stored_ids))  # by content, then copy number from the highest
    stored_ids, stored_dups = stored_ids[order], stored_dups[order]
    starts = np.flatnonzero(np.r_[True, stored_ids[1:] != stored_ids[:-1]]) if len(order) else np.zeros(0, np.int64)
    counts = np.diff(np.r_[starts, len(order)])
    contents, highest = stored_ids[starts], stored_dups[starts]
    rank = np.arange(len(order)) - np.repeat(starts, counts)  # 0 for a content's highest copy
    ids, weights = (delta[c].combine_chunks().to_numpy(zero_copy_only=False) for c in (ROW_ID, W))
    at = np.searchsorted(contents, ids)  # a stored content's place among them, where found
    found = at < len(contents)
    found[found] = contents[at[found]] == ids[found]
    gaining = np.flatnonzero(weights > 0)
    gained = weights[gaining]
    firsts = np.zeros(len(gaining), np.int64)  # copies follow the highest stored one (or 0)
    firsts[found[gaining]] = highest[at[gaining][found[gaining]]]
    numbers = np.repeat(firsts, gained) + np.arange(gained.sum()) - np.repeat(np.cumsum(gained) - gained, gained) + 1
    losing = np.flatnonzero((weights < 0) & found)
    lost = np.zeros(len(contents), np.int64)
    lost[at[losing]] = -weights[losing]
    deleting = rank < np.repeat(lost, counts)  # each losing content's highest-numbered copies
    return resolved_rows(delta, (np.repeat(gaining, gained), numbers),
                         (stored_ids[deleting], stored_dups[deleting]), schema)


@dataclass(frozen=True)
class LocalBag:
    """A bag MERGE's delta (``hashed_sql``: ``dvm/bag.hashed_delta_sql``), resolved here when
    delta-rs commits it (``resolved``, called by ``merge_locally`` with the table it commits to)."""

    spark: object
    hashed_sql: str
    max_rows: int

    def resolved(self, table) -> pa.Table | bool | None:
        """The resolved changes against the delta-rs ``table``; False when the delta holds more
        than ``max_rows`` contents (Spark's MERGE applies it); None when the stored copies are
        not read here (the caller resolves with Spark)."""
        columns = writable_columns(table)
        if columns is None or stored_read(stored_row_count(table)) is StoredRead.SPARK:
            return None
        schema = pa.schema([pa.field(f.name, f.type) for f in pa.schema(table.schema().to_arrow())])
        typed = ", ".join(f"CAST(__h.`{name}` AS {kind}) AS `{name}`" for name, kind in columns
                          if name not in (ROW_ID, DUP))
        delta = at_most(self.spark.sql(hoist_nested_ctes(
            f"SELECT {typed}, __h.{W}, __h.{CONTENT_HASH} AS `{ROW_ID}` FROM ({self.hashed_sql}) AS __h")), self.max_rows)
        if delta is None or (pc.sum(pc.abs(delta[W])).as_py() or 0) > self.max_rows:
            return False  # more contents, or more copies, than a local commit takes
        keys = pc.unique(delta[ROW_ID].combine_chunks())
        stored = table.to_pyarrow_dataset().to_table(columns=[ROW_ID, DUP], filter=pc.field(ROW_ID).isin(keys))
        log.info("a bag delta of %d changed contents resolved here against %d stored copies",
                 delta.num_rows, stored.num_rows)
        return resolved_bag_changes(delta, stored, schema)
