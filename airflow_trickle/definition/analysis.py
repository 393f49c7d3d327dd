"""Validate a stream table definition completely before anything is created.

Static checks (name, mode, schedule, SQL syntax, non-determinism) need no Spark; the rest
(sources exist and are Delta tables, the query analyses, output columns are storable, no cycle)
asks Spark and the catalog, but writes nothing.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field

from sqlglot import exp
from sqlglot.errors import OptimizeError, SqlglotError
from sqlglot.optimizer.qualify import qualify

from airflow_trickle.errors import (
    AlreadyExistsError,
    CycleError,
    InvalidQueryError,
    UnknownSourceError,
    UnsupportedConstructError,
)
from airflow_trickle.graph import build_graph, cycle_members
from airflow_trickle.model import RefreshMode, SourceType
from airflow_trickle.names import HIDDEN_PREFIX, DEFAULT_DATABASE, qualify_name, split_name
from airflow_trickle.schedule import Schedule, parse_schedule
from airflow_trickle.sql.parse import (
    DIALECT,
    columns_used,
    non_monotone_constructs,
    nondeterministic_calls,
    parse_query,
    source_names,
)
from airflow_trickle.spark.delta import schema_fingerprint, visible_columns
from airflow_trickle.sql.rewrite import name_outputs, ordered_outputs, pin_sources, restored_names

#: Characters no stored column name may hold (others that Delta refuses, such as the parentheses
#: of ``sum(x)``, are stored with Delta column mapping: ``storage.column_mapping_properties``).
_BAD_COLUMN_CHARS = re.compile(r"[`\n\t]")


@dataclass
class SourceInfo:
    """A table a stream table reads, as seen at definition time."""

    name: str
    kind: SourceType
    columns: list[tuple[str, str]]  # visible (name, Spark type) pairs

    @property
    def fingerprint(self) -> str:
        return schema_fingerprint(self.columns)


@dataclass
class Definition:
    """A fully validated stream table definition, ready to be created."""

    name: str
    original_query: str
    defining_query: str
    schedule: Schedule
    refresh_mode: RefreshMode
    effective_mode: RefreshMode
    mode_reason: str | None
    sources: dict[str, SourceInfo]
    output_columns: list[tuple[str, str]]
    columns_used: dict[str, list[str]] = field(default_factory=dict)
    #: Why DIFFERENTIAL cannot maintain the query (empty when it can).
    blockers: list[str] = field(default_factory=list)


def check_static(name: str, query: str, schedule: str | None,
                 refresh_mode: str) -> tuple[str, exp.Query, Schedule, RefreshMode]:
    """Checks that need neither Spark nor the catalog; returns the normalised parts."""
    qualified = qualify_name(name)
    mode = RefreshMode.parse(refresh_mode, what="refresh mode", stream_table=qualified)
    parsed_schedule = parse_schedule(schedule, stream_table=qualified)
    ast = parse_query(query, stream_table=qualified)
    if qualified in source_names(ast):
        raise CycleError(
            "the defining query reads the stream table itself", cycle=[qualified, qualified], stream_table=qualified
        )
    return qualified, ast, parsed_schedule, mode


def analyze(
    spark,
    *,
    name: str,
    query: str,
    schedule: str | None,
    refresh_mode: str,
    stream_tables: dict[str, list[str]],
    edges: list[tuple[str, str]],
    replacing: str | None = None,
    allow_circular: bool = False,
    queries: dict[str, str] | None = None,
) -> Definition:
    """Validate a new definition against Spark and the catalog.

    ``stream_tables`` maps each registered stream table to its visible columns; ``edges`` are
    the registered dependencies ``(source, stream table)``.  ``replacing`` names the stream
    table whose query this definition replaces (ALTER).  With ``allow_circular``, a cycle is
    accepted when every query on it (``queries`` holds the registered ones) is monotone.
    """
    from airflow_trickle.dvm import differential_blockers
    from airflow_trickle.spark.delta import is_delta, table_exists

    qualified, ast, parsed_schedule, mode = check_static(name, query, schedule, refresh_mode)
    if qualified in stream_tables and qualified != replacing:
        raise AlreadyExistsError("a stream table of this name already exists", stream_table=qualified)
    if qualified != replacing and table_exists(spark, qualified):
        raise AlreadyExistsError(
            "a table of this name already exists", stream_table=qualified, hint="drop it or choose another name"
        )

    sources: dict[str, SourceInfo] = {}
    for source in source_names(ast):
        if source in stream_tables:
            columns = visible_columns(spark, source)
            sources[source] = SourceInfo(source, SourceType.STREAM_TABLE, columns)
            continue
        if not table_exists(spark, source):
            raise UnknownSourceError(f"the defining query reads unknown table '{source}'", stream_table=qualified)
        if not is_delta(spark, source):
            raise UnknownSourceError(
                f"source '{source}' is not a Delta table",
                stream_table=qualified,
                hint="stream tables read their sources at exact Delta versions; convert it with CONVERT TO DELTA",
            )
        sources[source] = SourceInfo(source, SourceType.TABLE, visible_columns(spark, source))

    graph = build_graph(edges + [(s, qualified) for s in sources], stream_tables=list(stream_tables) + [qualified])
    members = cycle_members(graph, qualified)  # only a cycle through this definition is its business
    if members and not allow_circular:
        cycle = _cycle_through(graph, qualified, members)
        raise CycleError(f"the definition creates a cycle: {' -> '.join(cycle)}", cycle=cycle, stream_table=qualified,
                         hint="cycles of monotone queries are allowed with allow_circular=True")
    if members:
        _check_monotone_cycle(qualified, ast, members, queries or {})

    hidden = {s.name: [c for c, _ in s.columns] for s in sources.values() if s.kind == SourceType.STREAM_TABLE}
    output_columns = _analyze_output(spark, pin_sources(ast, {}, hidden), qualified)
    ast = name_outputs(ast, [column for column, _ in output_columns])  # `SUM(x)` keeps Spark's name, sum(x)

    defining_query, lineage, qualify_problem = _qualified_query(spark, ast, sources, hidden, output_columns)

    blockers = [f"non-deterministic function {fn}()" for fn in nondeterministic_calls(ast)]
    if not blockers:
        blockers = [qualify_problem] if qualify_problem else differential_blockers(defining_query, sources)
    if mode == "DIFFERENTIAL" and blockers:
        raise UnsupportedConstructError(
            f"cannot be maintained in DIFFERENTIAL mode: {blockers[0]}",
            construct=blockers[0],
            stream_table=qualified,
            hint="use refresh_mode='FULL' (recompute each refresh) or 'AUTO' (differential where possible)",
        )
    effective, reason = mode_choice(mode, blockers)
    return Definition(
        name=qualified,
        original_query=str(query).strip(),
        defining_query=defining_query,
        schedule=parsed_schedule,
        refresh_mode=mode,
        effective_mode=effective,
        mode_reason=reason,
        sources=sources,
        output_columns=output_columns,
        columns_used=lineage,
        blockers=blockers,
    )


def _cycle_through(graph, name: str, members: list[str]) -> list[str]:
    """A shortest closed path ``[name, ..., name]`` within the cycle's members."""
    import networkx as nx

    paths = [nx.shortest_path(graph, name, p) for p in graph.predecessors(name) if p in members]
    return min(paths, key=len) + [name]


def _check_monotone_cycle(name: str, ast: exp.Query, members: list[str], queries: dict[str, str]) -> None:
    """Refuse a cycle unless every query on it is monotone, naming the table and the operator."""
    for member in members:
        query = ast if member == name else parse_query(queries[member], stream_table=member)
        blockers = non_monotone_constructs(query)
        if blockers:
            raise UnsupportedConstructError(
                f"the cycle {' -> '.join(members + members[:1])} is not monotone: stream table '{member}' "
                f"uses {blockers[0]}", construct=blockers[0], stream_table=name,
                hint="a cycle refreshes to a fixpoint only through joins, filters, projections and UNION ALL")


def mode_choice(mode: RefreshMode, blockers: list[str]) -> tuple[RefreshMode, str | None]:
    """The mode a refresh runs in, and why it is FULL when it is."""
    if mode == RefreshMode.FULL:
        return RefreshMode.FULL, "refresh mode FULL"
    if blockers:
        return RefreshMode.FULL, f"AUTO chose FULL: {blockers[0]}"
    return RefreshMode.DIFFERENTIAL, None


def _analyze_output(spark, ast: exp.Query, qualified: str) -> list[tuple[str, str]]:
    try:
        schema = spark.sql(ast.sql(DIALECT)).schema
    except Exception as err:  # noqa: BLE001 - Spark's analysis error is the message
        raise InvalidQueryError(f"the defining query does not analyse in Spark: {_spark_message(err)}",
                                stream_table=qualified) from err
    names = [f.name for f in schema.fields]
    for column in names:
        if _BAD_COLUMN_CHARS.search(column):
            raise InvalidQueryError(
                f"output column {column!r} is not a valid column name",
                stream_table=qualified, hint="give the expression an alias, e.g. count(*) AS n",
            )
        if column.lower().startswith(HIDDEN_PREFIX):
            raise InvalidQueryError(f"output column {column!r} uses the reserved prefix {HIDDEN_PREFIX!r}",
                                    stream_table=qualified)
    duplicates = sorted({c for c in names if [n.lower() for n in names].count(c.lower()) > 1})
    if duplicates:
        raise InvalidQueryError(
            f"output column names must be unique, repeated: {', '.join(duplicates)}",
            stream_table=qualified, hint="alias the repeated columns",
        )
    return [(f.name, f.dataType.simpleString()) for f in schema.fields]


def _qualified_query(spark, ast, sources, hidden, output_columns):
    """Qualify columns and expand stars, so the stored query keeps its meaning as sources grow.

    Returns ``(sql, lineage, problem)``.  When sqlglot cannot qualify a query Spark accepts, or
    the qualified query analyses to a different schema, the original text is kept and
    ``problem`` says why (such a query can only be refreshed FULL).
    """
    schema: dict = {}
    for info in sources.values():
        database, table = split_name(info.name)
        schema.setdefault(database, {})[table] = dict(info.columns)
    try:
        qualified_ast = qualify(ast.copy(), schema=schema, dialect=DIALECT, db=DEFAULT_DATABASE,
                                validate_qualify_columns=True, quote_identifiers=True)
        names = [column for column, _ in output_columns]
        expanded = [column.lower() for column, _ in _schema_of(spark, qualified_ast, hidden)]
        if expanded != [n.lower() for n in names] and sorted(expanded) == sorted(n.lower() for n in names):
            # the same columns in another order: `t.*` beside JOIN ... USING (k), which Spark
            # expands with the USING key first
            qualified_ast = ordered_outputs(qualified_ast, names)
        # qualify lower-cases unquoted names (`AS Revenue`) and names unnamed ones its own way
        qualified_ast = restored_names(qualified_ast, names)
        check = _schema_of(spark, qualified_ast, hidden)
        if check != output_columns:
            raise OptimizeError("qualified query changes the output schema")
        rewritten = qualified_ast.sql(DIALECT)
        return rewritten, columns_used(qualified_ast), None
    except (SqlglotError, Exception) as err:  # noqa: BLE001 - any failure means: keep the original
        return ast.sql(DIALECT), {}, f"the query could not be normalised for incremental maintenance ({_spark_message(err)})"


def _schema_of(spark, query, hidden) -> list[tuple[str, str]]:
    """The output columns Spark analyses ``query`` to (it runs nothing)."""
    return [(f.name, f.dataType.simpleString())
            for f in spark.sql(pin_sources(query, {}, hidden).sql(DIALECT)).schema.fields]


def _spark_message(err: Exception) -> str:
    text = getattr(err, "getMessage", None)
    message = text() if callable(text) else str(err)
    return message.strip().split("\n")[0][:500]
