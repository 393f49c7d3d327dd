"""The bag applier: a stream table that may hold duplicate rows (no aggregate at the top).

The delta is consolidated per row content; a row whose count goes from n to n+k gets copies
``n+1..n+k`` inserted, from n to n−k loses its k highest-numbered copies.  Row identity is the
content hash plus the copy number (``storage.py``).  A window in which every changed source
only gained rows, under a monotone query, is applied as an append instead (:func:`bag_append_sql`).
"""
from __future__ import annotations

from airflow_trickle.dvm.base import W
from airflow_trickle.dvm.sqltext import column_list as _list
from airflow_trickle.model import DUP, ROW_ID
from airflow_trickle.names import quote_name
from airflow_trickle.sql.rewrite import row_hash_sql


#: Copies appended by refresh number ``seq`` are numbered ``seq * SPARSE_STRIDE + i``: unique
#: without reading the stored copies, so an append never reads its target.
SPARSE_STRIDE = 2 ** 31


#: The content hash column of :func:`hashed_delta_sql`'s rows.
CONTENT_HASH = "__rid"


def hashed_delta_sql(columns: list[str], delta_sql: str) -> str:
    """The bag delta consolidated per row content (``W`` = net copies, never 0), with the content
    hash ``__rid`` (the stored ``__trickle_row_id`` of its copies)."""
    cols = ", ".join(f"`{c}`" for c in columns)
    consolidated = (f"SELECT {cols}, SUM({W}) AS {W} FROM ({delta_sql}) AS __d GROUP BY {cols} "
                    f"HAVING SUM({W}) <> 0")
    return f"SELECT __c.*, {row_hash_sql(columns, qualifier='__c')} AS __rid FROM ({consolidated}) AS __c"


def _stored_copies(target: str, hashed: str) -> str:
    """The stored copy numbers of the contents in ``hashed``, ranked from the highest, with that
    highest number (``__n``)."""
    return (f"SELECT `{ROW_ID}` AS __rid, `{DUP}` AS __dup, "
            f"row_number() OVER (PARTITION BY `{ROW_ID}` ORDER BY `{DUP}` DESC) AS __rank, "
            f"MAX(`{DUP}`) OVER (PARTITION BY `{ROW_ID}`) AS __n "
            f"FROM {quote_name(target)} WHERE `{ROW_ID}` IN (SELECT __rid FROM ({hashed}) AS __h0)")


def _inserted_copies(columns: list[str], hashed: str, stored: str, dup_type: str) -> str:
    """+k copies of a content: numbered after its highest stored copy number (unique)."""
    cols = ", ".join(f"`{c}`" for c in columns)
    top = f"SELECT __rid, MAX(__dup) AS __n FROM ({stored}) AS __s GROUP BY __rid"
    numbered = (f"SELECT __h.*, CAST(COALESCE(__k.__n, 0) AS BIGINT) AS __n FROM ({hashed}) AS __h "
                f"LEFT JOIN ({top}) AS __k ON __h.__rid = __k.__rid WHERE __h.{W} > 0")
    return (f"SELECT {cols}, __rid AS `{ROW_ID}`, CAST(__dup AS {dup_type}) AS `{DUP}` FROM ({numbered}) AS __x "
            f"LATERAL VIEW explode(sequence(__n + 1, __n + {W})) AS __dup")


def bag_append_sql(target: str, columns: list[str], delta_sql: str, *, seq: int, dup_type: str = "bigint") -> str:
    """An INSERT applying a delta that only adds rows: an append, no MERGE.

    A Delta append commits in a fraction of a MERGE's time (it neither rewrites files nor, here,
    reads the target: with BIGINT copy numbers the copies of refresh ``seq`` are numbered
    ``seq * 2^31 + i``, unique without looking at the stored ones).  It is exact when every
    weight is positive, which holds for a monotone query (filters, projections, inner joins,
    UNION ALL) over sources that only gained rows.  A table with INT copy numbers (created by an
    older version) numbers its copies after the stored ones instead.
    """
    all_cols = columns + [ROW_ID, DUP]
    hashed = hashed_delta_sql(columns, delta_sql)
    if dup_type == "bigint":
        cols = ", ".join(f"`{c}`" for c in columns)
        copies = (f"SELECT {cols}, __rid AS `{ROW_ID}`, CAST({seq} AS BIGINT) * {SPARSE_STRIDE} + __i AS `{DUP}` "
                  f"FROM ({hashed}) AS __x LATERAL VIEW explode(sequence(1, {W})) AS __i WHERE {W} > 0")
    else:
        copies = _inserted_copies(columns, hashed, _stored_copies(target, hashed), dup_type)
    return f"INSERT INTO {quote_name(target)} ({_list(all_cols)}) SELECT {_list(all_cols)} FROM ({copies})"


def bag_merge_sql(target: str, columns: list[str], delta_sql: str, dup_type: str = "bigint") -> str:
    """The MERGE applying a bag delta: per content, +k copies numbered after the highest stored
    number, or the k highest-numbered stored copies deleted (numbers need not be dense: appends
    number copies per refresh).

    The consolidated delta is joined once with the stored copies of the contents it names, and
    that one join yields both the inserted and the deleted copies: the delta (which may join a
    whole source) is computed twice -- once to find the stored copies, once joined with them --
    rather than once per use.
    """
    cols = ", ".join(f"`{c}`" for c in columns)
    stored = _stored_copies(target, "SELECT * FROM __trickle_hashed")
    # A gained content keeps one row (its top copy, or none stored) to number the new copies
    # from; a lost content keeps the copies it loses, each deleted by its own number.
    paired = (f"SELECT __h.*, __s.__dup, CAST(COALESCE(__s.__n, 0) AS BIGINT) AS __n FROM __trickle_hashed AS __h "
              f"LEFT JOIN ({stored}) AS __s ON __h.__rid = __s.__rid "
              f"WHERE (__h.{W} > 0 AND COALESCE(__s.__rank, 1) = 1) OR (__h.{W} < 0 AND __s.__rank <= -__h.{W})")
    copies = (f"SELECT {cols}, __rid AS `{ROW_ID}`, CAST(__copy AS {dup_type}) AS `{DUP}`, "
              f"IF({W} > 0, 'I', 'D') AS __op FROM ({paired}) AS __p "
              f"LATERAL VIEW explode(IF({W} > 0, sequence(__n + 1, __n + {W}), array(__dup))) AS __copy")
    ops = f"WITH __trickle_hashed AS ({hashed_delta_sql(columns, delta_sql)}) {copies}"
    all_cols = columns + [ROW_ID, DUP]
    return (f"MERGE INTO {quote_name(target)} AS t USING ({ops}) AS s "
            f"ON t.`{ROW_ID}` = s.`{ROW_ID}` AND t.`{DUP}` = s.`{DUP}` "
            f"WHEN MATCHED AND s.__op = 'D' THEN DELETE "
            f"WHEN NOT MATCHED AND s.__op = 'I' THEN INSERT ({_list(all_cols)}) VALUES ({_list(all_cols, 's.')})")
