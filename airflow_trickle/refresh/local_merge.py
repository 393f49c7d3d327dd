"""Small changes committed by delta-rs instead of Spark's MERGE.

Why: a Delta MERGE run by Spark costs 0.7 s or more however small the change -- it rebuilds
the target's snapshot, materializes the source, finds and rewrites the touched files, about 11
Spark jobs of mostly driver time -- and it is the floor under every keyed DIFFERENTIAL refresh.
delta-rs applies the same change to a table of 10,000 rows in about 20 ms, in this process.

Spark still computes everything.  The MERGE the DVM wrote is turned into a query that resolves
each change against the stored row it matches (:func:`resolved_changes_sql`): for a matched
pair the first ``WHEN MATCHED`` clause whose condition holds says delete or update (and to
what), for an unmatched change row the first ``WHEN NOT MATCHED`` clause says insert (what);
every value is computed by Spark and cast to the stored column's type.  delta-rs then only
applies those resolved rows by the stored row's identity (``__trickle_row_id``,
``__trickle_dup``, unique and never NULL), so no expression of ours is evaluated outside Spark::

    MERGE INTO st AS t USING (Δ) AS s ON t.id = s.id
    WHEN MATCHED AND t.n + s.dn = 0 THEN DELETE
    WHEN MATCHED THEN UPDATE SET t.n = t.n + s.dn
    WHEN NOT MATCHED THEN INSERT (id, n, ...) VALUES (s.id, s.dn, ...)
      ->
    SELECT <each column's resolved value>, <'D' | 'U' | 'I'>, t.row_id, t.dup
    FROM (Δ) AS s LEFT JOIN (SELECT *, TRUE AS present FROM st VERSION AS OF v) AS t ON t.id = s.id
    WHERE <some clause applies>

The stored rows ``t`` are read by delta-rs where it can (:func:`resolve_by_stored_rows`): Spark
reading the table would first rebuild its snapshot, a second of jobs after every delta-rs
commit (which writes no checksum file).  A small table goes to Spark whole, as a local relation
in the query that computes Δ; a larger one only the rows Δ's keys name.  Spark still evaluates
every value.

Safety is the Spark path's: the commit carries the same metadata (frontier, refresh number) and
the same idempotent transaction id -- delta-rs writes the ``txn`` action, and a refresh number
that already landed is skipped, as Spark skips it; the commit is made on the version Spark read,
so any concurrent commit fails it (delta-rs's conflict check) and the refresh retries from the
start.  Used only where delta-rs writes exactly what Spark would: small changes (the cost
model's estimate), tables without column mapping, deletion vectors or other writer features
delta-rs does not write, and columns of primitive types; everything else keeps Spark's MERGE.
"""
from __future__ import annotations

import json
import logging
import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable

import pyarrow as pa
import pyarrow.compute as pc
from sqlglot import exp, parse_one

from airflow_trickle.storage.deltalog import COMMIT_KEY, open_table, why_rows_unreadable
from airflow_trickle.model import DUP, ROW_ID
from airflow_trickle.spark.engine import frame_of
from airflow_trickle.sql.parse import DIALECT
from airflow_trickle.sql.rewrite import hoist_nested_ctes

if TYPE_CHECKING:
    from airflow_trickle.location import Location

log = logging.getLogger(__name__)

#: Names of the resolved rows' own columns (no stored column starts with ``__trickle_merge``).
ACTION, MATCHED_ID, MATCHED_DUP, PRESENT = ("__trickle_merge_action", "__trickle_merge_id", "__trickle_merge_dup",
                                            "__trickle_merge_present")
#: Writer features delta-rs writes as Spark does (``changeDataFeed`` included: it writes the
#: ``_change_data`` files a downstream stream table reads).
WRITABLE_FEATURES = {"appendOnly", "invariants", "checkConstraints", "changeDataFeed", "timestampNtz",
                     "generatedColumns"}
#: Delta primitive types and the Spark SQL type a resolved value is cast to.
_SPARK_TYPES = {"long": "bigint", "integer": "int", "short": "smallint", "byte": "tinyint", "string": "string",
                "boolean": "boolean", "double": "double", "float": "float", "date": "date", "timestamp": "timestamp",
                "timestamp_ntz": "timestamp_ntz", "binary": "binary"}
_DECIMAL = re.compile(r"decimal\(\d+,\s*\d+\)")


def spark_type(delta_type: str) -> str | None:
    """The Spark SQL type of a Delta primitive type; None for a type this path leaves to Spark.

    >>> spark_type("long"), spark_type("decimal(12,2)"), spark_type("struct")
    ('bigint', 'decimal(12,2)', None)
    """
    return _SPARK_TYPES.get(delta_type) or (delta_type if _DECIMAL.fullmatch(delta_type) else None)


@dataclass(frozen=True)
class Resolution:
    """A MERGE taken apart to resolve its changes: the change rows (its ``USING`` relation), how
    they match a stored row, and the resolved columns over the two (``s`` and ``t``)."""

    #: The change rows' query (the ``USING`` relation) and its alias in the clauses.
    source_sql: str
    source_alias: str
    #: The stored table as the MERGE names it, and its alias.
    target: exp.Table
    target_alias: str
    #: The ``ON`` condition, and the resolved columns (aliased, in order).
    on: exp.Expression
    outputs: tuple[exp.Expression, ...]
    #: The change rows' column the stored ``__trickle_row_id`` must equal (None: ``ON`` does not say).
    key: str | None
    #: Whether the change rows' query reads the stored table itself.
    reads_target: bool


def resolution(merge_sql: str, columns: list[tuple[str, str]]) -> Resolution | None:
    """``merge_sql`` taken apart (:class:`Resolution`); None when the MERGE has a clause this
    rewrite does not resolve (``UPDATE SET *``, ``INSERT *``, ``NOT MATCHED BY SOURCE``) or is
    not a MERGE.  ``columns`` are the target's columns and Spark types, in order."""
    tree = parse_one(merge_sql, dialect=DIALECT)
    if not isinstance(tree, exp.Merge) or tree.args.get("using_cond") or tree.args.get("returning"):
        return None
    whens = tree.args["whens"].expressions
    if any(w.args.get("source") or _has_star(w.args["then"]) for w in whens):
        return None
    target, using = tree.this, tree.args["using"]
    alias = target.alias_or_name
    present = exp.column(PRESENT, table=alias)
    matched = [w for w in whens if w.args.get("matched")]
    unmatched = [w for w in whens if not w.args.get("matched")]

    def resolve(value_of) -> exp.Expression:
        """CASE over the clauses in MERGE order: the first whose condition holds decides."""
        def case(clauses):
            ifs = [exp.If(this=(w.args.get("condition") or exp.true()).copy(), true=value_of(w)) for w in clauses]
            return exp.Case(ifs=ifs) if ifs else exp.null()
        return exp.Case(ifs=[exp.If(this=present.copy(), true=case(matched))], default=case(unmatched))

    def action(w) -> exp.Expression:
        then = w.args["then"]
        return exp.Literal.string("I" if isinstance(then, exp.Insert) else "U" if isinstance(then, exp.Update) else "D")

    outputs = []
    for name, kind in columns:
        def value(w, name=name) -> exp.Expression:
            then = w.args["then"]
            if isinstance(then, exp.Update):
                assigned = {eq.this.name.lower(): eq.expression for eq in then.expressions}
                return (assigned.get(name.lower()) or exp.column(name, table=alias, quoted=True)).copy()
            if isinstance(then, exp.Insert):
                given = dict(zip((c.name.lower() for c in then.this.expressions), then.expression.expressions))
                return (given.get(name.lower()) or exp.null()).copy()
            return exp.null()  # a deleted row: its values are not written
        outputs.append(exp.alias_(exp.cast(resolve(value), exp.DataType.build(kind, dialect=DIALECT)), name, quoted=True))
    outputs += [exp.alias_(resolve(action), ACTION),
                exp.alias_(exp.column(ROW_ID, table=alias, quoted=True), MATCHED_ID),
                exp.alias_(exp.column(DUP, table=alias, quoted=True), MATCHED_DUP)]
    source = using.this if isinstance(using, exp.Subquery) else exp.select(exp.Star()).from_(
        exp.Table(this=using.this.copy(), db=using.args.get("db"), catalog=using.args.get("catalog")))
    on = tree.args["on"]
    return Resolution(source_sql=source.sql(DIALECT), source_alias=using.alias_or_name, target=target,
                      target_alias=alias, on=on, outputs=tuple(outputs),
                      key=_stored_identity_key(on, alias, using.alias_or_name),
                      reads_target=any(_same_table(t, target) for t in source.find_all(exp.Table)))


def resolved_changes_sql(merge_sql: str, columns: list[tuple[str, str]], *, version: int) -> str | None:
    """The query whose rows are ``merge_sql``'s effect on the target read at ``version``: each
    stored column's new value, the action (``D``, ``U``, ``I``) and the matched row's identity.

    ``columns`` are the target's columns and Spark types, in order.  None when the MERGE has a
    clause this rewrite does not resolve (:func:`resolution`).
    """
    parts = resolution(merge_sql, columns)
    if parts is None:
        return None
    target = parts.target
    stored = exp.Table(this=target.this.copy(), db=target.args.get("db") and target.args["db"].copy(),
                       catalog=target.args.get("catalog") and target.args["catalog"].copy(),
                       version=exp.Version(this="VERSION", kind="AS OF", expression=exp.Literal.number(version)))
    marked = exp.select(exp.Star(), exp.alias_(exp.true(), PRESENT)).from_(stored).subquery(parts.target_alias)
    source = parse_one(parts.source_sql, dialect=DIALECT).subquery(parts.source_alias)
    inner = (exp.select(*(o.copy() for o in parts.outputs)).from_(source)
             .join(marked, on=parts.on.copy(), join_type="LEFT"))
    return (exp.select(exp.Star()).from_(inner.subquery("__resolved"))
            .where(exp.column(ACTION).is_(exp.null()).not_()).sql(DIALECT))


def _stored_identity_key(on: exp.Expression, target_alias: str, source_alias: str) -> str | None:
    """The change rows' column that ``on`` equates with the stored ``__trickle_row_id`` (one of
    its top-level conjuncts), or None.

    >>> on = parse_one("t.`__trickle_row_id` = s.__key AND t.`__trickle_dup` = 1", dialect=DIALECT)
    >>> _stored_identity_key(on, "t", "s")
    '__key'
    >>> _stored_identity_key(parse_one("t.a = s.a", dialect=DIALECT), "t", "s") is None
    True
    """
    for conjunct in on.flatten() if isinstance(on, exp.And) else [on]:
        if not isinstance(conjunct, exp.EQ):
            continue
        for stored, change in ((conjunct.this, conjunct.expression), (conjunct.expression, conjunct.this)):
            if (isinstance(stored, exp.Column) and isinstance(change, exp.Column) and stored.name == ROW_ID
                    and stored.table == target_alias and change.table == source_alias):
                return change.name
    return None


def _same_table(table: exp.Table, target: exp.Table) -> bool:
    return (table.name.lower(), (table.db or "").lower()) == (target.name.lower(), (target.db or "").lower())


def _has_star(then: exp.Expression) -> bool:
    return (isinstance(then, exp.Update) and any(isinstance(e, exp.Star) for e in then.expressions)) or (
        isinstance(then, exp.Insert) and isinstance(then.this, exp.Star))


def writable_columns(table) -> list[tuple[str, str]] | None:
    """The columns and Spark types of the delta-rs ``table``, or None when delta-rs should not
    write it (:func:`why_not_writable`)."""
    return None if why_not_writable(table) else [
        (field.name, spark_type(field.type.type)) for field in table.schema().fields]


def why_not_writable(table) -> str | None:
    """Why delta-rs should not write the delta-rs ``table`` (None: it may): a writer feature it
    does not write as Spark does, column mapping, a column type other than a primitive one, no
    row identity."""
    protocol = table.protocol()
    features = set(protocol.writer_features or []) - WRITABLE_FEATURES
    if protocol.min_writer_version > 7 or features:
        return f"table features {', '.join(sorted(features)) or f'of writer version {protocol.min_writer_version}'}"
    if protocol.min_writer_version > 4 and protocol.writer_features is None:
        return "column mapping"  # writer versions 5 and 6 imply it
    unreadable = why_rows_unreadable(table)
    if unreadable:
        return unreadable
    for field in table.schema().fields:
        if spark_type(getattr(field.type, "type", "")) is None:
            return f"column {field.name} is not of a primitive type"
    if not {ROW_ID, DUP} <= {field.name for field in table.schema().fields}:
        return "no row identity columns"
    return None


def describe(location: "Location", max_rows: int) -> str:
    """How a DIFFERENTIAL refresh of the storage table at ``location`` commits (for explain)."""
    if max_rows <= 0:
        return "Spark's MERGE (local_commit_max_rows is 0)"
    why_not = why_not_writable(open_table(location))
    if why_not:
        return f"Spark's MERGE (delta-rs does not write this table: {why_not})"
    return (f"delta-rs, for changes expected to touch at most {max_rows:,} stored rows (Spark resolves "
            "them against the stored rows); Spark's MERGE above that")


def merge_locally(spark, location: "Location", merge_sql: str, *, metadata: dict, txn_app_id: str, txn_version: int,
                  max_rows: int, before_commit: Callable[[], None], resolved=None,
                  expected_version: int | None = None) -> dict | None | bool:
    """Apply ``merge_sql`` to the storage table at ``location`` through delta-rs.

    Returns MERGE-shaped metrics; None when the transaction ``(txn_app_id, txn_version)`` had
    landed already (nothing written, as Spark skips it); False when this path does not apply
    (the caller runs the MERGE on Spark): the table, or more than ``max_rows`` resolved rows
    (the estimate was wrong; they are not brought into this process).  ``before_commit`` runs
    just before delta-rs commits (the writer lease's fence).  ``resolved(table)``, when given,
    returns the MERGE's resolved changes computed already (a top-K's: ``refresh/local_topk.py``),
    or None when they do not apply to ``table`` as opened (then Spark resolves ``merge_sql``).
    ``expected_version``, when given, is the version ``merge_sql``'s change was computed on (a
    FULL refresh's difference): a table found at another raises ``CommitFailedError`` (retried).
    """
    from deltalake.exceptions import CommitFailedError, DeltaError

    table = open_table(location, fresh=True)
    if expected_version is not None and table.version() != expected_version:
        raise CommitFailedError(f"the table moved from version {expected_version} to {table.version()} "
                                "since the change was computed")
    columns = writable_columns(table)
    if columns is None:
        return False
    if (table.transaction_version(txn_app_id) or -1) >= txn_version:
        return None
    changes = resolved(table) if resolved is not None else None
    if changes is None:
        changes = _resolve(spark, table, merge_sql, columns, max_rows)
    if changes is False:
        return False
    if changes is None or changes.num_rows > max_rows:
        log.info("more than %d resolved changes: committed by Spark's MERGE", max_rows)
        return False
    counts = {"num_inserted_rows": 0, "num_updated_rows": 0, "num_deleted_rows": 0}
    if changes.num_rows == 0:
        return counts  # nothing to write; the catalog records the new frontier
    quoted = {f'"{name}"': f's."{name}"' for name, _ in columns}
    identity = f't."{ROW_ID}" = s."{MATCHED_ID}" AND t."{DUP}" = s."{MATCHED_DUP}"'
    before_commit()
    try:
        done = _merge(table, changes, identity, quoted, metadata, txn_app_id, txn_version)
    except CommitFailedError:
        raise  # a concurrent commit: the refresh retries from the start
    except DeltaError as err:
        # Nothing landed (delta-rs commits last), or it did and Spark's MERGE is skipped by the
        # transaction id: either way Spark's MERGE is safe, and a delta-rs limit costs speed only.
        log.warning("delta-rs could not commit the change (%s); committed by Spark's MERGE", str(err)[:300])
        return False
    log.info("committed %d resolved changes with delta-rs in %s ms", changes.num_rows, done.get("execution_time_ms"))
    return {"num_inserted_rows": done.get("num_target_rows_inserted", 0),
            "num_updated_rows": done.get("num_target_rows_updated", 0),
            "num_deleted_rows": done.get("num_target_rows_deleted", 0)}


def _resolve(spark, table, merge_sql: str, columns: list[tuple[str, str]], max_rows: int):
    """``merge_sql``'s resolved changes against the delta-rs ``table``, computed by Spark (the
    stored rows read by delta-rs where the MERGE allows it); None when there are more than
    ``max_rows``; False when the MERGE cannot be resolved (a clause it does not take apart)."""
    parts = resolution(merge_sql, columns)
    if parts is None:
        return False
    changes, stored_rows = False, stored_row_count(table)
    if parts.key is not None and stored_rows <= STORED_READ_MAX_ROWS:
        whole = stored_rows <= STORED_SHIPPED_WHOLE_ROWS
        changes = (resolve_reading_stored_rows(spark, table, parts, columns, max_rows, whole=whole)
                   if parts.reads_target else resolve_by_stored_rows(spark, table, parts, columns, max_rows,
                                                                     whole=whole))
    if changes is False:
        sql = resolved_changes_sql(merge_sql, columns, version=table.version())
        changes = spark.sql(hoist_nested_ctes(sql)).limit(max_rows + 1).toArrow()
    return changes


#: Stored rows up to which the rows a change matches are read by delta-rs (beyond, Spark reads them),
#: and up to which all of them are, shipped whole to Spark with the query computing the changes.
STORED_READ_MAX_ROWS, STORED_SHIPPED_WHOLE_ROWS = 20_000_000, 20_000


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
    from airflow_trickle.spark.engine import expression

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
    from airflow_trickle.spark.engine import SparkEngine

    source_tree = parse_one(hoist_nested_ctes(parts.source_sql), dialect=DIALECT)
    key_queries = keyed_stored_reads(source_tree, parts.target)
    if key_queries is None:
        return False
    used = _stored_columns_used(source_tree, parts)
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
            if _same_table(read, parts.target):
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


def _stored_columns_used(source: exp.Expression, parts: Resolution) -> set[str] | None:
    """The stored columns the resolution of ``parts`` reads: those its clauses and ``ON`` name on
    the stored side, every column named where ``source`` reads the stored table, and the row
    identity; None (all of them) where such a read selects ``*``.  A bag table's change reads
    the identity only, so the stored rows a change names are read as two numbers each."""
    used = {ROW_ID, DUP} | {column.name for expression in (*parts.outputs, parts.on)
                            for column in expression.find_all(exp.Column) if column.table == parts.target_alias}
    for read in source.find_all(exp.Table):
        if _same_table(read, parts.target):
            select = read.parent.parent
            if any(isinstance(e, exp.Star) or (isinstance(e, exp.Column) and isinstance(e.this, exp.Star))
                   for e in select.expressions):
                return None
            used |= {column.name for column in select.find_all(exp.Column)}
    return used


def keyed_stored_reads(source: exp.Expression, target: exp.Table) -> list[str] | None:
    """The queries of the keys by which ``source`` (a change rows' query) reads the stored
    table ``target``, each ``WITH <source's CTEs> SELECT <key> FROM (<subquery>)``; None when
    some read of ``target`` is not ``SELECT … FROM target WHERE … __trickle_row_id IN (<subquery>)``
    (then every stored row may matter).

    >>> q = parse_one("WITH h AS (SELECT 1 AS r) SELECT * FROM h LEFT JOIN (SELECT x FROM st "
    ...               "WHERE __trickle_row_id IN (SELECT r FROM h)) AS s ON TRUE", dialect=DIALECT)
    >>> keyed_stored_reads(q, exp.to_table("st"))
    ['WITH h AS (SELECT 1 AS r) SELECT __k.* FROM (SELECT r FROM h) AS __k']
    >>> keyed_stored_reads(parse_one("SELECT * FROM st", dialect=DIALECT), exp.to_table("st")) is None
    True
    """
    ctes = source.args.get("with_")
    queries = []
    for read in source.find_all(exp.Table):
        if not _same_table(read, target):
            continue
        select = read.parent.parent if isinstance(read.parent, exp.From) else None
        if not isinstance(select, exp.Select) or select.args.get("joins") or not select.args.get("where"):
            return None
        condition = select.args["where"].this
        subqueries = [c.args["query"] for c in (condition.flatten() if isinstance(condition, exp.And) else [condition])
                      if isinstance(c, exp.In) and isinstance(c.this, exp.Column) and c.this.name == ROW_ID
                      and c.this.table in ("", read.alias_or_name) and isinstance(c.args.get("query"), exp.Subquery)]
        if not subqueries:
            return None
        keys = exp.select("__k.*").from_(subqueries[0].this.copy().subquery("__k"))
        if ctes is not None:
            keys.set("with_", ctes.copy())
        queries.append(keys.sql(DIALECT))
    return queries


def stored_row_count(table) -> float:
    """Rows in ``table`` by its files' statistics (infinite where a file has none)."""
    counts = table.get_add_actions(flatten=True).column("num_records").to_pylist()
    return float("inf") if None in counts else sum(counts)


def spark_schema(columns: list[tuple[str, str]]):
    """The Spark schema of ``columns`` (names and the Spark SQL types :func:`spark_type` gives)."""
    from pyspark.sql import types as T

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


def _merge(table, changes, identity: str, quoted: dict, metadata: dict, txn_app_id: str, txn_version: int) -> dict:
    from deltalake import CommitProperties, Transaction

    return (table.merge(changes, identity, source_alias="s", target_alias="t",
                        commit_properties=CommitProperties(
                            custom_metadata={"userMetadata": json.dumps({COMMIT_KEY: metadata}, sort_keys=True,
                                                                        default=str)},
                            app_transactions=[Transaction(txn_app_id, int(txn_version))]))
            .when_matched_delete(predicate=f"s.\"{ACTION}\" = 'D'")
            .when_matched_update(quoted, predicate=f"s.\"{ACTION}\" = 'U'")
            .when_not_matched_insert(quoted, predicate=f"s.\"{ACTION}\" = 'I'")
            .execute())


def resolved_rows(rows, inserted: tuple, deleted: tuple, schema):
    """Resolved changes (this module's rows: each stored column, the action, the matched row's
    identity) decided in this process: ``deleted`` holds the stored identities ``(row ids,
    copies)``, ``inserted`` the copies ``(rows of rows, copy numbers)`` -- a copy's values are
    that row's (its ``__trickle_row_id`` included), cast to the stored ``schema``'s types.

    >>> schema = pa.schema([("v", pa.int64()), (ROW_ID, pa.int64()), (DUP, pa.int64())])
    >>> rows = resolved_rows(pa.table({"v": [7], ROW_ID: [70]}), ([0], [3]), ([11], [2]), schema).to_pylist()
    >>> [(r[ACTION], r["v"], r[ROW_ID], r[DUP], r[MATCHED_ID], r[MATCHED_DUP]) for r in rows]
    [('D', None, None, None, 11, 2), ('I', 7, 70, 3, None, None)]
    """
    picked, copies = (pa.array(values, pa.int64()) for values in inserted)
    deleted = [pa.array(values, pa.int64()) for values in deleted]
    n_deleted, n_inserted = len(deleted[0]), len(picked)

    def column(values, kind):
        return pa.chunked_array([pa.nulls(n_deleted, kind), values.cast(kind)], kind)

    columns = [column(copies if field.name == DUP else rows[field.name].take(picked), field.type) for field in schema]
    columns.append(pa.chunked_array([pa.array(["D"] * n_deleted + ["I"] * n_inserted, pa.string())]))
    for values, kind in zip(deleted, (schema.field(ROW_ID).type, schema.field(DUP).type)):
        columns.append(pa.chunked_array([values.cast(kind), pa.nulls(n_inserted, kind)], kind))
    return pa.Table.from_arrays(columns, names=[field.name for field in schema] + [ACTION, MATCHED_ID, MATCHED_DUP])
