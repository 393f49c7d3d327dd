"""FULL refresh applied as a diff, for a stream table other stream tables read.

FULL recomputes the defining query at the new frontier.  When a DIFFERENTIAL stream table reads
this one, it applies only the difference to the storage table: rows that are new are inserted,
rows that are gone deleted, equal rows left alone.  The storage table's change feed then holds
only real changes, so a FULL refresh upstream never looks like a full rewrite to a downstream
stream table.  Otherwise the recomputed rows simply replace the stored ones (an INSERT
OVERWRITE, cheaper by the diff's join; ``refresh.writers.full_overwrites``).

A keyed table (an aggregate) diffs by key (:func:`full_merge_sql`).  A bag table diffs by
content (:func:`bag_full_merge_sql`): the difference is a bag delta, applied as a DIFFERENTIAL
refresh applies one -- through delta-rs when it is small.
"""
from __future__ import annotations

from airflow_trickle.dvm.base import W
from airflow_trickle.model import SourceType
from airflow_trickle.names import quote_name
from airflow_trickle.sql.rewrite import row_hash_sql
from airflow_trickle.storage.tables import DUP, ROW_ID


def numbered_rows_sql(result_sql: str, columns: list[str], *, stable: bool = True) -> str:
    """Rows of ``result_sql`` with their bag identity: content hash and copy number.

    ``SELECT a FROM t`` giving ``1, 1, 2`` -> ``(1, h1, 1), (1, h1, 2), (2, h2, 1)``.

    The copies are numbered ``-1 - monotonically_increasing_id()``: unique without a shuffle,
    and negative, so never equal to an appended copy's ``seq * 2^31 + i`` nor to a merged-in
    copy's (numbered after its content's highest: ``dvm/bag.py``).  That needs a BIGINT copy
    number column; a table created with INT ones (by an older version) has its copies numbered
    ``stable``: each copy's rank among the copies of its content (1, 2, ...), a shuffle and sort
    of all the rows (a FULL refresh of 4.8M rows took 3.5 s instead of 0.8 s).  No FULL refresh
    matches copies by number any more: one applied as a diff compares contents
    (:func:`bag_full_merge_sql`).
    """
    if stable:
        number = f"CAST(row_number() OVER (PARTITION BY `{ROW_ID}` ORDER BY `{ROW_ID}`) AS INT)"
    else:
        number = "-1 - monotonically_increasing_id()"
    return (
        f"SELECT *, {number} AS `{DUP}` "
        f"FROM (SELECT __q.*, {row_hash_sql(columns, qualifier='__q')} AS `{ROW_ID}` FROM ({result_sql}) AS __q) AS __h"
    )


def bag_difference_sql(result_sql: str, target: str, columns: list[str], *, version: int | None = None,
                       consolidated: bool = False) -> str:
    """The bag delta turning the stored rows of ``target`` (at ``version``, else as the
    statement reads it) into ``result_sql``'s: each result row with weight +1, each stored row
    -1 (``columns``: the visible ones).  The bag applier consolidates them per content, so what
    both hold cancels out; ``consolidated`` does it here (one row per changed content).

    >>> print(bag_difference_sql("SELECT a FROM s.t", "s.st", ["a"], version=4, consolidated=True))
    SELECT `a`, SUM(__trickle_w) AS __trickle_w FROM (SELECT `a`, CAST(1 AS BIGINT) AS __trickle_w FROM (SELECT a FROM s.t) AS __trickle_new UNION ALL SELECT `a`, CAST(-1 AS BIGINT) AS __trickle_w FROM `s`.`st` VERSION AS OF 4) AS __trickle_both GROUP BY `a` HAVING SUM(__trickle_w) <> 0
    """
    listed = ", ".join(f"`{c}`" for c in columns)
    stored = quote_name(target) + (f" VERSION AS OF {int(version)}" if version is not None else "")
    both = (f"SELECT {listed}, CAST(1 AS BIGINT) AS {W} FROM ({result_sql}) AS __trickle_new "
            f"UNION ALL SELECT {listed}, CAST(-1 AS BIGINT) AS {W} FROM {stored}")
    if not consolidated:
        return both
    return f"SELECT {listed}, SUM({W}) AS {W} FROM ({both}) AS __trickle_both GROUP BY {listed} HAVING SUM({W}) <> 0"


def bag_full_merge_sql(target: str, result_sql: str, columns: list[str], dup_type: str = "bigint") -> str:
    """The MERGE applying a FULL refresh of the bag table ``target`` as a diff: the difference
    between ``result_sql``'s rows and the stored ones, as a bag delta (:func:`bag_difference_sql`).

    Why not the keyed diff (:func:`full_merge_sql` over ranked copies): its MERGE joins every
    recomputed row with every stored one, then rewrites the files of the rows it deletes, and
    deleting unmatched stored rows makes Spark scan the target twice; ranking the copies to get
    stable identities shuffles every row once more.  A FULL refresh of 9M rows took 30-40 s
    that way on two cores (``benchmarks/cascade.py``, 10M rows).  Consolidated per content, the
    difference is one aggregation over both; the MERGE then touches only the changed copies,
    and a small one is committed by delta-rs (``refresh/local_merge.py``).
    """
    from airflow_trickle.dvm.bag import bag_merge_sql

    return bag_merge_sql(target, columns, bag_difference_sql(result_sql, target, columns), dup_type)


def full_merge_sql(target: str, source_sql: str, columns: list[str]) -> str:
    """MERGE ``source_sql`` (rows with identity columns) into ``target`` as a diff.

    Rows are matched by identity; a matched row whose visible columns differ (a keyed row whose
    aggregate changed) is updated, an unmatched source row inserted, an unmatched target row
    deleted.
    """
    differs = " OR ".join(f"NOT (t.`{c}` <=> s.`{c}`)" for c in columns) or "false"
    return (
        f"MERGE INTO {quote_name(target)} AS t USING ({source_sql}) AS s "
        f"ON t.`{ROW_ID}` = s.`{ROW_ID}` AND t.`{DUP}` = s.`{DUP}` "
        f"WHEN MATCHED AND ({differs}) THEN UPDATE SET * "
        f"WHEN NOT MATCHED THEN INSERT * "
        f"WHEN NOT MATCHED BY SOURCE THEN DELETE"
    )


def pinned_query_sql(env, st, versions: dict[str, int]) -> str:
    """The defining query reading each source at ``versions``, hidden columns of upstreams removed."""
    from airflow_trickle.sql.parse import DIALECT, parse_query
    from airflow_trickle.sql.rewrite import pin_sources

    hidden = {}
    for dep in env.catalog.dependencies(st.name):
        if dep.source_type == SourceType.STREAM_TABLE:
            upstream = env.catalog.get(dep.source_name)
            if upstream is not None:
                hidden[dep.source_name] = upstream.output_columns
    return pin_sources(parse_query(st.defining_query, stream_table=st.name), versions, hidden).sql(DIALECT)
