"""A MERGE's changes resolved by Spark, with the stored rows they match read by delta-rs
where the MERGE allows it (``refresh/resolution.py`` takes the MERGE apart).

Why: Spark reading the stored table would first rebuild its snapshot, a second of jobs after
every delta-rs commit (which writes no checksum file).  A small table goes to Spark whole, as a
local relation in the query that computes Δ; a larger one only the rows Δ's keys name.  Spark
still evaluates every value.  Every read into this process is bounded first: at most
``max_rows + 1`` change rows or keys, and stored rows only where the planner's rule says so (``refresh/plan.stored_read``).
"""
from __future__ import annotations

import logging
import re

import pyarrow.compute as pc
from sqlglot import exp, parse_one

from airflow_trickle.model import ROW_ID
from airflow_trickle.refresh.plan import StoredRead, stored_read
from airflow_trickle.refresh.resolution import (ACTION, PRESENT, Resolution, keyed_stored_reads, resolution,
                                                resolved_changes_sql, same_table, stored_columns_used)
from airflow_trickle.spark.engine import SparkEngine, expression, frame_of
from airflow_trickle.sql.parse import DIALECT
from airflow_trickle.sql.rewrite import hoist_nested_ctes
from airflow_trickle.storage.deltalog import stored_row_count

log = logging.getLogger(__name__)


def resolve_changes(spark, table, merge_sql: str, columns: list[tuple[str, str]], max_rows: int):
    """``merge_sql``'s resolved changes against the delta-rs ``table``, computed by Spark (the
    stored rows read by delta-rs where the MERGE allows it); None when there are more than
    ``max_rows``; False when the MERGE cannot be resolved (a clause it does not take apart)."""
    parts = resolution(merge_sql, columns)
    if parts is None:
        return False
    changes, how = False, stored_read(stored_row_count(table))
    if parts.key is not None and how is not StoredRead.SPARK:
        whole = how is StoredRead.WHOLE
        changes = (resolve_reading_stored_rows(spark, table, parts, columns, max_rows, whole=whole)
                   if parts.reads_target else resolve_by_stored_rows(spark, table, parts, columns, max_rows,
                                                                     whole=whole))
    if changes is False:
        sql = resolved_changes_sql(merge_sql, columns, version=table.version())
        changes = spark.sql(hoist_nested_ctes(sql)).limit(max_rows + 1).toArrow()
    return changes


def resolve_by_stored_rows(spark, table, parts: Resolution, columns: list[tuple[str, str]], max_rows: int, *,
                           whole: bool):
    """The resolved changes, with the stored rows they match read by delta-rs, not Spark.

    Why: Spark reading the stored table first rebuilds its snapshot -- a commit delta-rs made
    has no checksum file, so Spark replays the log in jobs of its own, about a second on two
    cores.  Here delta-rs reads the stored rows from the very version it will commit on, and
    Spark resolves the change rows against them as a local relation, every value still computed
    by Spark.  A small table is shipped ``whole``, in the one query that computes the changes; a
    larger one only the rows the change rows name, once Spark has computed those.  None when
    there are more than ``max_rows`` change rows (they are not brought into this process).
    """
    names = [name for name, _ in columns]
    source = spark.sql(hoist_nested_ctes(parts.source_sql))
    if whole:
        stored = table.to_pyarrow_dataset().to_table(columns=names)
    else:
        changes = at_most(source, max_rows)
        if changes is None or changes.num_rows == 0:
            return changes
        ids = pc.unique(_identities(changes, parts))
        stored = table.to_pyarrow_dataset().to_table(columns=names, filter=pc.field(ROW_ID).isin(ids))
        source = frame_of(spark, changes, schema=source.schema)
    return _resolved(spark, source, frame_of(spark, stored, schema=spark_schema(columns)), parts, max_rows)


def at_most(frame, max_rows: int):
    """The rows of the DataFrame ``frame`` as Arrow; None when there are more than ``max_rows``
    (they are not brought into this process)."""
    rows = frame.limit(max_rows + 1).toArrow()
    return None if rows.num_rows > max_rows else rows


def _identities(changes, parts: Resolution):
    """The stored row identities the change rows name (their ``parts.key`` column, NULLs dropped)."""
    key = next(name for name in changes.column_names if name.lower() == parts.key.lower())
    return pc.drop_null(changes.column(key))


def _resolved(spark, source, stored, parts: Resolution, max_rows: int):
    """The change rows (the DataFrame ``source``) resolved against ``stored`` (a DataFrame of at
    least every stored row they match, in the stored columns' Spark types), at most
    ``max_rows + 1`` of them."""
    target = stored.selectExpr("*", f"TRUE AS {PRESENT}").alias(parts.target_alias)
    resolved = (source.alias(parts.source_alias).join(target, expression(spark, parts.on.sql(DIALECT)), "left")
                .selectExpr(*(o.sql(DIALECT) for o in parts.outputs))
                .where(f"{ACTION} IS NOT NULL"))
    return resolved.limit(max_rows + 1).toArrow()


def resolve_reading_stored_rows(spark, table, parts: Resolution, columns: list[tuple[str, str]], max_rows: int, *,
                                whole: bool):
    """The resolved changes of a MERGE whose change rows read the stored table themselves (a
    bag table's: the stored copies of the contents the delta names, to number new copies after
    them and delete the highest), with the stored rows read by delta-rs, not Spark.

    Why: Spark reading the stored table rebuilds its snapshot after a delta-rs commit and scans
    every stored row to find the few the change names (a hop of a chain of bag tables paid 2 s
    at 900k rows; delta-rs reads the matching rows in 0.1 s).  It applies where every read of the
    stored table in the change rows' query keeps only the rows whose ``__trickle_row_id`` is in a
    subquery (:func:`keyed_stored_reads`): Spark computes those keys first (from the change,
    small), delta-rs reads the stored rows they name, and the change rows' query runs over those
    rows as a local relation.  A small table is shipped ``whole`` without the keys' query.  The
    rows found serve the resolution too, so they must hold every stored row a change row
    matches: checked on the change rows' identity column.  None when there are more than
    ``max_rows`` keys or change rows; False when the query reads the stored table otherwise (or
    the check fails): the caller resolves with Spark.
    """
    source_tree = parse_one(hoist_nested_ctes(parts.source_sql), dialect=DIALECT)
    key_queries = keyed_stored_reads(source_tree, parts.target)
    if key_queries is None:
        return False
    used = stored_columns_used(source_tree, parts)
    columns = [(name, kind) for name, kind in columns if used is None or name in used]
    names = [name for name, _ in columns]
    if whole:
        stored = table.to_pyarrow_dataset().to_table(columns=names)
        keys = None
    else:
        union = " UNION ".join(f"SELECT * FROM ({query}) AS __keys{i}" for i, query in enumerate(key_queries))
        keys = spark.sql(union).limit(max_rows + 1).toArrow()
        if keys.num_rows > max_rows:
            return None
        keys = pc.drop_null(keys.column(0))
        stored = table.to_pyarrow_dataset().to_table(columns=names, filter=pc.field(ROW_ID).isin(keys))
    engine, view = SparkEngine(spark), f"__trickle_stored_{table.version()}_{id(stored)}"
    stored_frame = engine.local_relation(stored, view, schema=spark_schema(columns))
    try:
        for read in list(source_tree.find_all(exp.Table)):
            if same_table(read, parts.target):
                read.replace(exp.Table(this=exp.to_identifier(view), alias=read.args.get("alias")))
        frame = spark.sql(source_tree.sql(DIALECT))
        changes = at_most(frame, max_rows)
        if changes is None or changes.num_rows == 0:
            return changes
        if keys is not None and not pc.all(pc.is_in(_identities(changes, parts), value_set=keys)).as_py():
            log.info("a change row names a stored row outside the keys read: resolved by Spark")
            return False
        return _resolved(spark, frame_of(spark, changes, schema=frame.schema), stored_frame, parts, max_rows)
    finally:
        engine.drop_view(view)


def spark_schema(columns: list[tuple[str, str]]):
    """The Spark schema of ``columns`` (names and the Spark SQL types
    ``refresh/resolution.spark_type`` gives)."""
    from pyspark.sql import types as T  # the engine's: imported where a schema is built

    simple = {"bigint": T.LongType, "int": T.IntegerType, "smallint": T.ShortType, "tinyint": T.ByteType,
              "string": T.StringType, "boolean": T.BooleanType, "double": T.DoubleType, "float": T.FloatType,
              "date": T.DateType, "timestamp": T.TimestampType, "timestamp_ntz": T.TimestampNTZType,
              "binary": T.BinaryType}

    def of(kind: str):
        if kind in simple:
            return simple[kind]()
        precision, scale = re.fullmatch(r"decimal\((\d+),\s*(\d+)\)", kind).groups()
        return T.DecimalType(int(precision), int(scale))

    return T.StructType([T.StructField(name, of(kind), True) for name, kind in columns])
