"""What a project file would change in its warehouse: ``trickle plan``, and the DAG's plan task.

A plan compares the project's stream tables with the catalog's rows and says, per table:

* ``CREATE``: the file declares it, the warehouse has none;
* ``ALTER``: the file changes its query, schedule, refresh mode or options; a query change says
  whether the output columns stay, grow (compatible: readers keep refreshing as they did) or
  change (incompatible: the readers that use a changed column reinitialize);
* ``UNCHANGED``: as registered (a query that differs only in layout, case or comments is the
  same query: :func:`~airflow_trickle.sql.parse.normalized_sql`);
* ``REMOVE``: the project owns it but its file no longer declares it (dropped only with prune).

A table another project owns is refused, naming the owner.  Pure: the catalog's rows come in,
and what needs Spark (a new query's columns) or the Delta log (a table's rows) comes through two
callables, so the DAG's plan task plans without Spark.

>>> from airflow_trickle.catalog import StreamTable
>>> from airflow_trickle.project import define_project
>>> p = define_project("shop", warehouse="/wh", stream_tables=[
...     {"name": "s.a", "query": "SELECT k FROM s.src WHERE v > 1", "schedule": "5m"},
...     {"name": "s.b", "query": "SELECT k FROM s.a", "schedule": "5m"}])
>>> old = StreamTable("s.a", "id", "q", "select k  from s.src where v > 1 -- hot", "5m", "DIFFERENTIAL",
...                   "DIFFERENTIAL", owner="shop")
>>> [(t.name, t.change.value) for t in plan_project(p, [old], []).tables]
[('s.a', 'UNCHANGED'), ('s.b', 'CREATE')]
"""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass, replace
from typing import Callable

from airflow_trickle.errors import InvalidQueryError
from airflow_trickle.graph import build_graph, downstream_of, topological_order
from airflow_trickle.model import Choice
from airflow_trickle.options import TableOptions
from airflow_trickle.project.model import Project, StreamTableSpec
from airflow_trickle.sql.parse import normalized_sql

#: ``(name, new query)`` -> the stored output columns and the new query's, each as
#: ``[(name, Spark type), ...]`` (needs Spark).
ColumnsOf = Callable[[str, str], tuple[list[tuple[str, str]], list[tuple[str, str]]]]


class Change(Choice):
    """What applying a project file does to one stream table."""

    CREATE = "CREATE"
    ALTER = "ALTER"
    UNCHANGED = "UNCHANGED"
    REMOVE = "REMOVE"


class Schema(Choice):
    """How an ALTERed query changes the output columns."""

    SAME = "same"
    COMPATIBLE = "compatible"      # columns added; the old ones as they were
    INCOMPATIBLE = "incompatible"  # a column removed, renamed or retyped
    UNKNOWN = "unknown"            # not analysed (no Spark): checked when applied


@dataclass(frozen=True)
class Reinitialized:
    """A reader that an incompatible change makes recompute in full."""

    name: str
    #: Its stored rows, from its Delta log (None: unknown).
    rows: int | None = None


@dataclass(frozen=True)
class TablePlan:
    name: str
    change: Change
    #: What changes, one phrase each: ``query``, ``schedule 5m -> 1m``, ``options {...}``.
    changes: tuple[str, ...] = ()
    schema: Schema | None = None
    #: How the columns change, for people: ``adds w``, ``v: int -> bigint``.
    schema_detail: str = ""
    reinitialized: tuple[Reinitialized, ...] = ()
    #: The registered owner (a project name), None when no project owns it.
    owner: str | None = None
    #: Why applying this table's change is refused (another project's table, a reader broken).
    refused: str | None = None

    @property
    def query_changed(self) -> bool:
        return "query" in self.changes

    @property
    def file_changes(self) -> tuple[str, ...]:
        """What the project file changes (an interrupted ALTER to finish is not the file's)."""
        return tuple(c for c in self.changes if c != REINITIALIZE)

    @property
    def claims(self) -> bool:
        """Whether applying makes the project the owner of a table no project owned."""
        return self.change in (Change.ALTER, Change.UNCHANGED) and self.owner is None

    def text(self) -> str:
        words = [f"{self.change.value.lower():9} {self.name}"]
        if self.changes:
            words.append(": " + ", ".join(self.changes))
        if self.schema is not None:
            words.append(f"; columns {self.schema.value}" + (f" ({self.schema_detail})" if self.schema_detail else ""))
        for reader in self.reinitialized:
            rows = f"{reader.rows:,} rows" if reader.rows is not None else "its rows"
            words.append(f"; {reader.name} reinitializes (a full recompute of {rows})")
        if self.claims:
            words.append("; claimed by the project (no project owned it)")
        if self.refused:
            words.append(f"; REFUSED: {self.refused}")
        return "".join(words)


@dataclass(frozen=True)
class ProjectPlan:
    project: str
    tables: tuple[TablePlan, ...]
    #: Whether applying drops the tables to REMOVE.
    prune: bool = False
    adopt: bool = False

    def of(self, change: Change) -> list[TablePlan]:
        return [t for t in self.tables if t.change == change]

    @property
    def has_changes(self) -> bool:
        """Whether applying would change the warehouse (ownership claims included)."""
        return any(t.change != Change.UNCHANGED or t.claims for t in self.tables)

    @property
    def file_changed(self) -> bool:
        """Whether the project file asks for a change (``deploy.on_change: stop`` stops on it)."""
        return any(t.change in (Change.CREATE, Change.REMOVE) or t.file_changes or t.claims for t in self.tables)

    @property
    def refusals(self) -> list[TablePlan]:
        return [t for t in self.tables if t.refused]

    def refusal_text(self) -> str:
        """``s.a: owned by project 'x' ...; s.b: ...``: why applying is refused."""
        return "; ".join(f"{t.name}: {t.refused}" for t in self.refusals)

    def text(self) -> str:
        shown = [t.text() for t in self.tables if t.change != Change.UNCHANGED or t.claims]
        declared = [t for t in self.tables if t.change != Change.REMOVE]
        registered = [t for t in declared if t.change != Change.CREATE]
        if self.of(Change.REMOVE) and not self.prune:
            shown.append("removed tables are only reported: apply with --prune (or deploy.prune) to drop them")
        head = (f"project {self.project}: {len(declared)} stream table{'s' * (len(declared) != 1)}, "
                + (f"{len(self.of(Change.UNCHANGED))} unchanged" if registered else "none registered yet"))
        return "\n".join([head, *shown]) if shown else head + ", nothing to do"

    def to_json(self) -> dict:
        """JSON values only (lists, not tuples): what ``trickle plan --json`` prints and XCom keeps."""
        return json.loads(json.dumps({
            "project": self.project, "prune": self.prune, "has_changes": self.has_changes,
            "tables": [{**asdict(t), "claims": t.claims} for t in self.tables]}))


#: What a plan says of a table whose rows still await its new query (an interrupted ALTER).
REINITIALIZE = "reinitialize (its rows are not yet its query's)"


def plan_project(project: Project, registered: list, dependencies: list, *, columns: ColumnsOf | None = None,
                 rows_of: Callable[[str], int | None] | None = None, prune: bool | None = None,
                 adopt: bool = False) -> ProjectPlan:
    """The plan of ``project`` against the catalog's ``registered`` rows and ``dependencies``.

    ``columns(name, new_query)``: the stored and the new output columns (needs Spark; without
    it a query change's columns are ``unknown``); ``rows_of(name)``: a table's stored rows.
    """
    catalog = {st.name: st for st in registered}
    readers: dict[str, list] = {}
    for dep in dependencies:
        readers.setdefault(dep.source_name, []).append(dep)
    graph = build_graph([(d.source_name, d.st_name) for d in dependencies])
    tables = []
    for name, spec in project.stream_tables.items():
        current = catalog.get(name)
        if current is None:
            tables.append(TablePlan(name, Change.CREATE))
            continue
        plan = compared(spec, current)
        if plan.query_changed and columns is not None:
            plan = _with_schema(plan, *columns(name, spec.query), readers.get(name, []), graph, rows_of)
        if current.owner not in (None, project.name) and not adopt:
            plan = replace(plan, refused=f"owned by project {current.owner!r}"
                                         f"{f' ({current.owner_file})' if current.owner_file else ''}; "
                                         "`trickle apply --adopt` moves it to this project")
        tables.append(plan)
    removed = [st.name for st in registered if st.owner == project.name and st.name not in project.stream_tables]
    order = topological_order(graph, [n for n in removed if n in graph]) + [n for n in removed if n not in graph]
    for name in reversed(order):
        others = sorted(d.st_name for d in readers.get(name, []) if d.st_name not in removed)
        tables.append(TablePlan(name, Change.REMOVE, owner=project.name,
                                refused=f"read by {', '.join(others)}, which it does not remove" if others else None))
    return ProjectPlan(project.name, tuple(tables), prune=project.deploy.prune if prune is None else prune, adopt=adopt)


def wanted_options(spec: StreamTableSpec, current: TableOptions) -> TableOptions:
    """The options the file asks for, whole: what the file does not set is unset, and clustering
    the file took out is turned off (``()``)."""
    wanted = TableOptions.parse(spec.options(), stream_table=spec.name)
    if current.clustering and not wanted.clustering:
        wanted = replace(wanted, cluster_by=())
    return wanted


def compared(spec: StreamTableSpec, current) -> TablePlan:
    """One registered table against its spec: ALTER with what changes, or UNCHANGED."""
    changes = []
    try:
        same_query = normalized_sql(current.original_query) == normalized_sql(spec.query, stream_table=spec.name)
    except InvalidQueryError:  # a registered query this sqlglot cannot read: compare the text
        same_query = current.original_query.strip() == spec.query.strip()
    if not same_query:
        changes.append("query")
    if (current.schedule or None) != spec.schedule:
        changes.append(f"schedule {current.schedule or 'CALCULATED'} -> {spec.schedule or 'CALCULATED'}")
    if str(current.refresh_mode) != str(spec.refresh_mode):
        changes.append(f"refresh mode {current.refresh_mode} -> {spec.refresh_mode}")
    before, after = _set_options(current.options), _set_options(wanted_options(spec, current.options))
    if before != after:
        changes.append(f"options {before} -> {after}")
    if current.needs_reinit:  # an ALTER interrupted before its rows were replaced: apply finishes it
        changes.append(REINITIALIZE)
    return TablePlan(spec.name, Change.ALTER if changes else Change.UNCHANGED, tuple(changes), owner=current.owner)


def _set_options(options: TableOptions) -> dict:
    """The options that differ from the defaults (a diamond's 'none'/'fastest', no clustering)."""
    defaults = {"diamond_consistency": "none", "diamond_schedule_policy": "fastest", "cluster_by": []}
    return {k: v for k, v in options.to_dict().items() if defaults.get(k, object()) != v}


def _with_schema(plan: TablePlan, stored: list, new: list, readers: list, graph,
                 rows_of: Callable[[str], int | None] | None) -> TablePlan:
    """``plan`` with the column change of its new query, and the readers it reinitializes."""
    if stored == new:
        return replace(plan, schema=Schema.SAME)
    old, now = dict(stored), dict(new)
    changed = [c for c in old if now.get(c) != old[c]]
    added = [c for c in now if c not in old]
    if not changed:
        return replace(plan, schema=Schema.COMPATIBLE, schema_detail="adds " + ", ".join(added))
    detail = ", ".join(f"{c}: {old[c]} -> {now[c]}" if c in now else f"{c} removed" for c in changed)
    broken = [f"{d.st_name} uses {', '.join(c for c in d.columns_used or [] if c not in now)}" for d in readers
              if any(c not in now for c in d.columns_used or [])]
    affected = sorted(d.st_name for d in readers if set(d.columns_used or changed) & set(changed))
    below = sorted(set().union(*(downstream_of(graph, n) for n in affected)) - set(affected)) if affected else []
    reinitialized = tuple(Reinitialized(n, rows_of(n) if rows_of else None) for n in affected)
    detail += f"; readers downstream of these reinitialize if their own output changes: {', '.join(below)}" if below else ""
    return replace(plan, schema=Schema.INCOMPATIBLE, schema_detail=detail, reinitialized=reinitialized,
                   refused=f"a reader would break: {'; '.join(broken)}" if broken else plan.refused)
