"""A MERGE's changes resolved against the stored rows they match: pure rewrites over sqlglot
trees, no Spark, no delta-rs.

The MERGE the DVM wrote is turned into a query that resolves each change against the stored row
it matches (:func:`resolved_changes_sql`): for a matched pair the first ``WHEN MATCHED`` clause
whose condition holds says delete or update (and to what), for an unmatched change row the
first ``WHEN NOT MATCHED`` clause says insert (what); every value is computed by Spark and cast
to the stored column's type.  A committer then only applies those resolved rows by the stored
row's identity (``__trickle_row_id``, ``__trickle_dup``, unique and never NULL), so no
expression of ours is evaluated outside Spark::

    MERGE INTO st AS t USING (Δ) AS s ON t.id = s.id
    WHEN MATCHED AND t.n + s.dn = 0 THEN DELETE
    WHEN MATCHED THEN UPDATE SET t.n = t.n + s.dn
    WHEN NOT MATCHED THEN INSERT (id, n, ...) VALUES (s.id, s.dn, ...)
      ->
    SELECT <each column's resolved value>, <'D' | 'U' | 'I'>, t.row_id, t.dup
    FROM (Δ) AS s LEFT JOIN (SELECT *, TRUE AS present FROM st VERSION AS OF v) AS t ON t.id = s.id
    WHERE <some clause applies>
"""
from __future__ import annotations

import re
from dataclasses import dataclass

import pyarrow as pa
from sqlglot import exp, parse_one

from airflow_trickle.model import DUP, ROW_ID
from airflow_trickle.sql.parse import DIALECT

#: Names of the resolved rows' own columns (no stored column starts with ``__trickle_merge``).
ACTION, MATCHED_ID, MATCHED_DUP, PRESENT = ("__trickle_merge_action", "__trickle_merge_id", "__trickle_merge_dup",
                                            "__trickle_merge_present")
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
                      reads_target=any(same_table(t, target) for t in source.find_all(exp.Table)))


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


def same_table(table: exp.Table, target: exp.Table) -> bool:
    return (table.name.lower(), (table.db or "").lower()) == (target.name.lower(), (target.db or "").lower())


def _has_star(then: exp.Expression) -> bool:
    return (isinstance(then, exp.Update) and any(isinstance(e, exp.Star) for e in then.expressions)) or (
        isinstance(then, exp.Insert) and isinstance(then.this, exp.Star))


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
        if not same_table(read, target):
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


def stored_columns_used(source: exp.Expression, parts: Resolution) -> set[str] | None:
    """The stored columns the resolution of ``parts`` reads: those its clauses and ``ON`` name on
    the stored side, every column named where ``source`` reads the stored table, and the row
    identity; None (all of them) where such a read selects ``*``.  A bag table's change reads
    the identity only, so the stored rows a change names are read as two numbers each."""
    used = {ROW_ID, DUP} | {column.name for expression in (*parts.outputs, parts.on)
                            for column in expression.find_all(exp.Column) if column.table == parts.target_alias}
    for read in source.find_all(exp.Table):
        if same_table(read, parts.target):
            select = read.parent.parent
            if any(isinstance(e, exp.Star) or (isinstance(e, exp.Column) and isinstance(e.this, exp.Star))
                   for e in select.expressions):
                return None
            used |= {column.name for column in select.find_all(exp.Column)}
    return used


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
