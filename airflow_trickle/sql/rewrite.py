"""Rewrites of a whole defining query that every refresh mode needs."""
from __future__ import annotations

from sqlglot import exp

from airflow_trickle.names import DEFAULT_DATABASE
from airflow_trickle.sql.parse import source_tables, table_name


def pin_sources(
    query: exp.Query,
    versions: dict[str, int | None],
    visible_columns: dict[str, list[str]] | None = None,
    *,
    database: str = DEFAULT_DATABASE,
) -> exp.Query:
    """Read every source at a fixed Delta version, and hide ``__trickle_*`` columns of stream tables.

    ``versions`` maps qualified source names to a version (``None``: latest).  A source named in
    ``visible_columns`` (an upstream stream table) is replaced by a subquery that selects only
    those columns, so ``SELECT *`` over a stream table never sees its hidden columns.

    ``SELECT * FROM shop.orders o`` with ``{"shop.orders": 7}`` ->
    ``SELECT * FROM shop.orders VERSION AS OF 7 AS o``
    """
    pinned = query.copy()
    visible_columns = visible_columns or {}
    for node in source_tables(pinned):
        name = table_name(node, database=database)
        version = versions.get(name)
        alias = node.alias or node.name
        bare = exp.Table(this=exp.to_identifier(node.name), db=exp.to_identifier(node.db or database))
        if version is not None:
            bare.set("version", exp.Version(this="VERSION", kind="AS OF", expression=exp.Literal.number(version)))
        if name in visible_columns:
            inner = exp.select(*[exp.column(c, quoted=True) for c in visible_columns[name]]).from_(bare)
            node.replace(inner.subquery(exp.to_identifier(alias)))
        else:
            bare.set("alias", exp.TableAlias(this=exp.to_identifier(alias)))
            node.replace(bare)
    return pinned


def row_hash_sql(columns: list[str], *, qualifier: str | None = None) -> str:
    """A NULL-safe, position-aware 64-bit hash of ``columns`` in Spark SQL (runs in the JVM).

    Spark's ``xxhash64(a, b)`` skips NULL arguments, so ``(1, NULL)`` and ``(NULL, 1)`` would
    collide.  Interleaving a never-NULL ``isnull`` flag before each value anchors every value
    to its position: ``xxhash64(isnull(a), a, isnull(b), b)``.
    """
    prefix = f"{qualifier}." if qualifier else ""
    args = []
    for column in columns:
        ref = f"{prefix}`{column}`"
        args.extend([f"isnull({ref})", ref])
    return f"xxhash64({', '.join(args)})"
