"""Parse a defining query and read facts off its tree: sources, non-deterministic calls."""
from __future__ import annotations

import sqlglot
from sqlglot import exp
from sqlglot.dialects.spark import Spark
from sqlglot.errors import ParseError, TokenError
from sqlglot.optimizer.scope import traverse_scope

from airflow_trickle.errors import InvalidQueryError
from airflow_trickle.names import DEFAULT_DATABASE


class TrickleSpark(Spark):
    """Spark SQL as Spark 3 and later read it.  sqlglot's Spark dialect moves every CTE of a
    subquery up to the statement's own WITH, as Hive needs; the delta of a recursive CTE
    nests several ``WITH RECURSIVE`` subqueries (``dvm/recursive.py``), whose names would clash
    once moved.  Spark itself reads CTEs in subqueries, so they stay where they are."""

    class Generator(Spark.Generator):
        EXPRESSIONS_WITHOUT_NESTED_CTES: set = set()


#: The sqlglot dialect every query is parsed and written in (registered by its class name).
DIALECT = "tricklespark"

#: Functions whose result changes from one evaluation to the next.  A DIFFERENTIAL stream
#: table cannot use them: the old state it subtracts would not be the state it added.
NONDETERMINISTIC_FUNCTIONS = frozenset({
    "rand", "random", "randn", "uuid", "shuffle", "now", "current_timestamp", "current_date",
    "current_time", "localtimestamp", "unix_timestamp", "monotonically_increasing_id",
    "spark_partition_id", "input_file_name", "input_file_block_start", "input_file_block_length",
    "randstr", "uniform", "current_timezone",
})


def parse_query(text: str, *, stream_table: str | None = None) -> exp.Query:
    """Parse ``text`` as one Spark SQL query (SELECT, set operation, or WITH ... SELECT).

    Raises :class:`InvalidQueryError` naming the stream table for anything else.
    """
    if not text or not str(text).strip():
        raise InvalidQueryError("the defining query is empty", stream_table=stream_table)
    misspelled = _misspelled_start(str(text))
    if misspelled:
        raise InvalidQueryError(f"the defining query does not parse: {misspelled}", stream_table=stream_table)
    try:
        statements = [s for s in sqlglot.parse(str(text), read=DIALECT) if s is not None]
    except (ParseError, TokenError) as err:
        raise InvalidQueryError(f"the defining query does not parse: {_parse_failure(err)}",
                                stream_table=stream_table) from err
    if len(statements) != 1:
        raise InvalidQueryError(
            f"the defining query must be one statement, found {len(statements)}", stream_table=stream_table
        )
    query = statements[0]
    if not isinstance(query, exp.Query):
        raise InvalidQueryError(
            f"the defining query must be a SELECT query, found {query.key.upper()}", stream_table=stream_table
        )
    return query


def normalized_sql(text: str, *, stream_table: str | None = None) -> str:
    """``text`` as one canonical line: layout, keyword case and comments are not part of a query.

    Two project files whose queries differ only in these hold the same query (``project/plan.py``).

    >>> written = "select a,  -- the key\\n  sum(b) as s from t group by a"
    >>> normalized_sql(written) == normalized_sql("SELECT a, SUM(b) AS s FROM t GROUP BY a")
    True
    >>> normalized_sql("SELECT a FROM t WHERE a > 1") == normalized_sql("SELECT a FROM t WHERE a > 2")
    False
    """
    return parse_query(text, stream_table=stream_table).sql(DIALECT, comments=False)


def pretty_sql(text: str) -> str:
    """``text`` laid out one clause per line, for docs and the UI; as written if it does not parse.

    >>> print(pretty_sql("select a, sum(b) as s from t where a > 1 group by a"))
    SELECT
      a,
      SUM(b) AS s
    FROM t
    WHERE
      a > 1
    GROUP BY
      a
    """
    try:
        return sqlglot.parse_one(text, read=DIALECT).sql(DIALECT, pretty=True)
    except Exception:  # noqa: BLE001 - a display helper: the text itself is the fallback
        return text.strip()


def conjuncts(condition: exp.Expression | None) -> list[exp.Expression]:
    """The AND-ed terms of ``condition``, parentheses removed at every level.

    >>> from sqlglot import parse_one
    >>> [c.sql() for c in conjuncts(parse_one("(a.k = b.k) AND ((a.x > 1) AND b.y IS NULL)"))]
    ['a.k = b.k', 'a.x > 1', 'b.y IS NULL']
    """
    if condition is None:
        return []
    condition = condition.unnest()
    if isinstance(condition, exp.And):
        return conjuncts(condition.this) + conjuncts(condition.expression)
    return [condition]


def source_tables(query: exp.Expression) -> list[exp.Table]:
    """The table nodes of ``query`` that name stored tables (CTE references excluded), in order.

    ``WITH x AS (SELECT * FROM a) SELECT * FROM x JOIN b`` -> the nodes for ``a`` and ``b``.
    """
    found: dict[int, exp.Table] = {}
    for scope in traverse_scope(query):
        for source in scope.sources.values():
            if isinstance(source, exp.Table) and source.name:
                found.setdefault(id(source), source)
    ordered = [node for node in query.find_all(exp.Table, bfs=False) if id(node) in found]
    return ordered


def table_name(node: exp.Table, *, database: str = DEFAULT_DATABASE) -> str:
    """The qualified lower-case name ``database.table`` of a table node."""
    return f"{(node.db or database).lower()}.{node.name.lower()}"


def source_names(query: exp.Expression, *, database: str = DEFAULT_DATABASE) -> list[str]:
    """Distinct qualified names of the stored tables ``query`` reads, sorted."""
    return sorted({table_name(t, database=database) for t in source_tables(query)})


def nondeterministic_calls(query: exp.Expression) -> list[str]:
    """Names of non-deterministic functions called anywhere in ``query``, in order of appearance."""
    names = []
    for node in query.find_all(exp.Func):
        name = (node.name if isinstance(node, exp.Anonymous) else node.sql_name()).lower()
        if name in NONDETERMINISTIC_FUNCTIONS:
            names.append(name)
    return list(dict.fromkeys(names))


def _first_line(err: Exception) -> str:
    return str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__


#: Words a query (or a statement someone may mistake for one) starts with.
_STATEMENT_WORDS = ("SELECT", "WITH", "FROM", "VALUES", "TABLE", "INSERT", "UPDATE", "DELETE", "MERGE", "CREATE",
                    "DROP", "ALTER", "SHOW", "DESCRIBE", "EXPLAIN", "SET", "USE", "CACHE")


def _misspelled_start(text: str) -> str | None:
    """Why a text whose first word is no statement keyword is no query (``SELEC id`` parses as
    an aliased column); None when it starts with one."""
    import difflib

    words = text.lstrip().lstrip("(").split(None, 1)
    word = words[0].upper() if words else ""
    if not word.isalpha() or word in _STATEMENT_WORDS:
        return None
    close = difflib.get_close_matches(word, ("SELECT", "WITH", "FROM"), n=1, cutoff=0.6)
    return (f"it starts with {words[0]!r}, not SELECT or WITH"
            + (f" (did you mean {close[0]}?)" if close else ""))


def _parse_failure(err: Exception) -> str:
    """Where and why a text does not parse, in words: the token, its line and column, and the
    text around it -- not the parser's internals (``Required keyword: 'this' missing for <class …>``)."""
    if isinstance(err, TokenError):
        return f"it cannot be split into tokens (is a quote not closed?): {_first_line(err)}"
    where = (getattr(err, "errors", None) or [{}])[0]
    token = where.get("highlight")
    if not token:
        return _first_line(err)
    description = str(where.get("description") or "")
    if description.startswith("Expecting "):
        why = f"expected {description.removeprefix('Expecting ').strip()} before {token!r}"
    elif description.startswith("Required keyword") or "missing" in description:
        why = f"incomplete at {token!r}"
    else:
        why = f"unexpected {token!r}"
    shown = f"{where.get('start_context', '')}>>>{token}<<<{where.get('end_context', '')}".strip()
    return f"{why} (line {where.get('line')}, column {where.get('col')}): {shown}"


def columns_used(qualified: exp.Expression, *, database: str = DEFAULT_DATABASE) -> dict[str, list[str]]:
    """Column-level lineage of a *qualified* query: ``{source name: [columns read]}``.

    ``SELECT o.id FROM shop.orders AS o WHERE o.amt > 1`` -> ``{"shop.orders": ["amt", "id"]}``.
    """
    used: dict[str, set[str]] = {}
    for scope in traverse_scope(qualified):
        for column in scope.columns:
            source = scope.sources.get(column.table)
            if isinstance(source, exp.Table) and source.name:
                used.setdefault(table_name(source, database=database), set()).add(column.name.lower())
    return {name: sorted(cols) for name, cols in used.items()}


def non_monotone_constructs(query: exp.Expression) -> list[str]:
    """Operators of ``query`` that can remove output rows when input rows are added.

    A cycle of stream tables converges to a fixpoint only through monotone queries (seed 002
    §5): selections, projections, inner joins and UNION ALL.  Aggregates, DISTINCT / UNION,
    EXCEPT, INTERSECT, outer, semi and anti joins, NOT EXISTS / NOT IN, window functions and
    LIMIT are not.

    >>> non_monotone_constructs(parse_query("SELECT a FROM t JOIN u ON t.k = u.k UNION ALL SELECT a FROM v"))
    []
    >>> non_monotone_constructs(parse_query("SELECT k, COUNT(*) FROM t GROUP BY k"))
    ['aggregate COUNT', 'GROUP BY']
    """
    found: list[str] = []

    def add(text: str) -> None:
        if text not in found:
            found.append(text)

    for node in query.walk():
        if isinstance(node, exp.AggFunc):
            add(f"aggregate {node.sql_name()}")
        elif isinstance(node, exp.Group):
            add("GROUP BY")
        elif isinstance(node, exp.Window):
            add("window function")
        elif isinstance(node, exp.Distinct):
            add("DISTINCT")
        elif isinstance(node, exp.Except):
            add("EXCEPT")
        elif isinstance(node, exp.Intersect):
            add("INTERSECT")
        elif isinstance(node, exp.Union) and node.args.get("distinct"):
            add("UNION (distinct)")
        elif isinstance(node, exp.Join) and (node.side or str(node.kind or "").upper() in ("ANTI", "SEMI")):
            add(f"{' '.join(p for p in (node.side, node.kind) if p).upper()} JOIN")
        elif isinstance(node, exp.Not) and isinstance(node.this, (exp.Exists, exp.In)):
            add("NOT EXISTS" if isinstance(node.this, exp.Exists) else "NOT IN")
        elif isinstance(node, (exp.Limit, exp.Offset)):
            add("LIMIT")
    return found
