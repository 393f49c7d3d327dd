"""A top-K's refresh finished in this process once Spark has computed its candidates.

Why: after Spark computes the candidates C = S ⊎ ΔQ (the stored top k plus the query's delta,
consolidated: ``dvm/topk.py``), two more Spark statements used to follow -- the boundary probe
(does C still cover the k-th stored row?) and the commit, which ranks C's copies, takes the top
k and diffs them against the stored rows.  Each costs Spark's fixed price per statement, however
few rows change (benchmarks/README.md, "TPC-H at SF 3, all 22 (2026-12-05, evening), and a top-K
decided in the refreshing process").  C is
small (k rows plus the touched groups), so here it is collected once, with each content's bag
identity computed by Spark, and the rest is ordering and counting over a few thousand rows:

* the boundary b is the k-th stored row in the query's order; C covers it when at least k of C's
  copies sort at or before b (:func:`covers_boundary`, exactly the probe's SQL);
* the new top k, T, is the first k copies of C in that order (:func:`top_copies`);
* T ⊎ −S is applied as the bag MERGE would: per content, the copies gained are numbered after
  its highest stored copy, the copies lost are its highest-numbered ones
  (:func:`resolved_top_k_changes`), and delta-rs commits them (``refresh/local_merge.py``).

Every value is Spark's: the candidates' columns and identities are computed by Spark; here rows
are only ordered, counted and paired.  The order is Arrow's, which equals Spark's for the types
accepted (:func:`orderable`: integers, decimals, strings of the binary collation -- both compare
bytes --, dates, timestamps, booleans); a floating-point or nested ORDER BY column keeps Spark's statements.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass

import pyarrow as pa
import pyarrow.compute as pc

from airflow_trickle.model import DUP, ROW_ID
from airflow_trickle.refresh.resolution import ACTION, MATCHED_DUP, MATCHED_ID, resolved_rows  # noqa: F401 - the doctests
from airflow_trickle.sql.rewrite import row_hash_sql

log = logging.getLogger(__name__)

#: The candidates' copy count (``dvm/topk.py``) and the order of the boundary among ties.
COUNT, _MARK = "__n", "__trickle_mark"


def candidates_with_identity_sql(candidates_sql: str, columns: list[str]) -> str:
    """The candidates with each content's bag identity, hashed by Spark as the bag MERGE does.

    >>> candidates_with_identity_sql("SELECT a, 1 AS __n", ["a"])
    'SELECT __c.*, xxhash64(isnull(__c.`a`), __c.`a`) AS `__trickle_row_id` FROM (SELECT a, 1 AS __n) AS __c'
    """
    return f"SELECT __c.*, {row_hash_sql(columns, qualifier='__c')} AS `{ROW_ID}` FROM ({candidates_sql}) AS __c"


def orderable(schema, order) -> bool:
    """Whether Arrow orders every ``order`` column of the Spark ``schema`` (a ``StructType``: the
    candidates', known before they are computed) as Spark does.

    >>> from pyspark.sql import types as T
    >>> from airflow_trickle.dvm.topk import SortKey
    >>> orderable(T.StructType([T.StructField("a", T.LongType()), T.StructField("b", T.StringType())]),
    ...           [SortKey("a"), SortKey("b", True)])
    True
    >>> orderable(T.StructType([T.StructField("x", T.DoubleType())]), [SortKey("x")])  # NaN and -0.0 differ
    False
    >>> orderable(T.StructType([T.StructField("s", T.StringType("UTF8_LCASE"))]), [SortKey("s")])  # not bytes
    False
    """
    from pyspark.sql import types as T

    def fits(kind) -> bool:
        if isinstance(kind, T.StringType):  # Arrow compares bytes: Spark's binary collation
            return getattr(kind, "collation", "UTF8_BINARY") == "UTF8_BINARY"
        return isinstance(kind, (T.IntegralType, T.DecimalType, T.DateType, T.TimestampType, T.TimestampNTZType,
                                 T.BooleanType))

    kinds = {field.name: field.dataType for field in schema.fields}
    return all(key.column in kinds and fits(kinds[key.column]) for key in order)


def _sort_keys(table: pa.Table, order) -> tuple[pa.Table, list[tuple[str, str]]]:
    """``table`` with a validity column per ``order`` key, and Arrow sort keys that order rows as
    Spark's ``ORDER BY`` does, each key's NULLS FIRST/LAST included."""
    keys = []
    for i, key in enumerate(order):
        valid = f"__trickle_valid_{i}"
        table = table.append_column(valid, pc.is_valid(table[key.column]))
        # NULLS FIRST: the invalid (False) sort first
        keys.append((valid, "ascending" if key.nulls_first else "descending"))
        keys.append((key.column, "descending" if key.descending else "ascending"))
    return table, keys


def _sorted(table: pa.Table, order, then: list[tuple[str, str]] = ()) -> pa.Table:
    with_keys, keys = _sort_keys(table, order)
    return table.take(pc.sort_indices(with_keys, sort_keys=keys + list(then)))


def covers_boundary(candidates: pa.Table, stored: pa.Table, order, limit: int) -> bool:
    """Whether the candidates (with their copy counts ``__n``) still cover the boundary of the
    stored top ``limit``: at least ``limit`` copies sort at or before the ``limit``-th stored row
    (ties with it count as before).  True when fewer than ``limit`` rows are stored (they were all
    of the query's rows).  ``dvm/topk.TopK.boundary_probe`` in Arrow.

    >>> from airflow_trickle.dvm.topk import SortKey
    >>> s = pa.table({"v": [1, 2, 3]})
    >>> covers_boundary(pa.table({"v": [1, 3, 5], "__n": [1, 2, 1]}), s, [SortKey("v")], 3)
    True
    >>> covers_boundary(pa.table({"v": [1, 5], "__n": [1, 1]}), s, [SortKey("v")], 3)  # 2 left: below b
    False
    """
    if stored.num_rows < limit:
        return True
    columns = [key.column for key in order]
    boundary = _sorted(stored.select(columns), order).slice(limit - 1, 1)
    marked = pa.concat_tables([
        candidates.select(columns).append_column(COUNT, candidates[COUNT].cast(pa.int64()))
        .append_column(_MARK, pa.array([0] * candidates.num_rows, pa.int8())),
        boundary.cast(candidates.select(columns).schema).append_column(COUNT, pa.array([0], pa.int64()))
        .append_column(_MARK, pa.array([1], pa.int8()))])
    ranked = _sorted(marked, order, then=[(_MARK, "ascending")])
    at = pc.index(ranked[_MARK], 1).as_py()
    return sum(ranked[COUNT].slice(0, at).to_pylist()) >= limit


def top_copies(candidates: pa.Table, order, limit: int) -> pa.Table:
    """The first ``limit`` copies of the candidates in ``order``, one row per copy (``__n``
    dropped).

    >>> from airflow_trickle.dvm.topk import SortKey
    >>> top_copies(pa.table({"v": [3, 1, 2], "__n": [1, 2, 5]}), [SortKey("v", True)], 3)["v"].to_pylist()
    [3, 2, 2]
    """
    ranked = _sorted(candidates, order)
    counts = ranked[COUNT].to_pylist()
    take, left = [], limit
    for i, count in enumerate(counts):
        if left <= 0:
            break
        n = min(int(count), left)
        take.extend([i] * n)
        left -= n
    return ranked.take(pa.array(take, pa.int64())).drop_columns([COUNT])


def resolved_top_k_changes(top: pa.Table, stored: pa.Table, schema: pa.Schema) -> pa.Table:
    """The resolved changes (``refresh/resolution.py``'s rows: each stored column, the action,
    the matched row's identity) turning the ``stored`` rows into the copies ``top``, as the bag
    MERGE of T ⊎ −S does: per content (``__trickle_row_id``), the copies gained are inserted,
    numbered after its highest stored copy; the copies lost are deleted, highest numbers first.

    ``schema`` is the stored table's (the columns written, in their types).

    >>> schema = pa.schema([("v", pa.int64()), (ROW_ID, pa.int64()), (DUP, pa.int64())])
    >>> stored = pa.table({"v": [1, 1, 2], ROW_ID: [11, 11, 22], DUP: [1, 2, 1]}, schema=schema)
    >>> top = pa.table({"v": [1, 3, 3], ROW_ID: [11, 33, 33]})
    >>> rows = resolved_top_k_changes(top, stored, schema).to_pylist()
    >>> [(r[ACTION], r["v"], r[DUP], r[MATCHED_ID], r[MATCHED_DUP]) for r in rows]
    [('D', None, None, 11, 2), ('D', None, None, 22, 1), ('I', 3, 1, None, None), ('I', 3, 2, None, None)]
    """
    stored_copies: dict[int, list[int]] = {}
    for rid, dup in zip(stored[ROW_ID].to_pylist(), stored[DUP].to_pylist()):
        stored_copies.setdefault(rid, []).append(dup)
    wanted: dict[int, list[int]] = {}  # content -> the rows of ``top`` holding its copies
    for i, rid in enumerate(top[ROW_ID].to_pylist()):
        wanted.setdefault(rid, []).append(i)
    deletes: list[tuple[int, int]] = []
    inserts: list[tuple[int, int]] = []  # (row of top, copy number)
    for rid, dups in stored_copies.items():
        lost = len(dups) - len(wanted.get(rid, ()))
        if lost > 0:
            deletes.extend((rid, dup) for dup in sorted(dups, reverse=True)[:lost])
    for rid, rows in wanted.items():
        have = stored_copies.get(rid, [])
        highest = max(have, default=0)
        for n, i in enumerate(rows[len(have):], start=1):
            inserts.append((i, highest + n))
    return resolved_rows(top, ([i for i, _ in inserts], [dup for _, dup in inserts]),
                         ([rid for rid, _ in deletes], [dup for _, dup in deletes]), schema)


@dataclass(frozen=True)
class LocalTopK:
    """A top-K refresh's new rows, decided in this process (``refresh/differential._top_k_here``):
    committed by delta-rs on the stored table's ``version`` if it is still the newest."""

    top: pa.Table
    stored: pa.Table
    version: int

    def resolved(self, table) -> pa.Table | None:
        """The resolved changes against the delta-rs ``table``; None when it moved on since the
        stored rows were read (the caller resolves the SQL with Spark)."""
        if table.version() != self.version:
            return None
        schema = pa.schema([pa.field(f.name, f.type) for f in pa.schema(table.schema().to_arrow())])
        if set(schema.names) != {*self.top.column_names, DUP}:
            return None  # a stored column the candidates do not give
        return resolved_top_k_changes(self.top, self.stored, schema)


def stored_rows(table, columns: list[str]) -> pa.Table:
    """The stored top k of the delta-rs ``table``: ``columns`` and the bag identity."""
    return table.to_pyarrow_dataset().to_table(columns=[*columns, ROW_ID, DUP])
