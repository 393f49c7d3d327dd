"""One refresh's differential plan: planned once, immutable, and free of Spark.

:func:`plan_refresh` turns a stream table's definition and the versions of its window into a
:class:`DeltaPlan`: the operator tree, how the delta is applied (an append, or a MERGE of the
table's strategy), and the SQL of every statement the refresh may run on the way -- the parts
of a recursive CTE's delta computed once, the groups a top-K's aggregates touch, the top-K's
candidates and boundary probe, and the applying statement.  Nothing here runs a query; the
refresh layer (``refresh/differential.py``) executes the plan, and what it learns on the way
(a view's name, the groups counted, whether a row left the top k) is bound into the
:class:`~airflow_trickle.dvm.base.Versions` it renders the next statement with, never written
into the tree.

    >>> from airflow_trickle.catalog import StreamTable
    >>> st = StreamTable("s.t", "id", "SELECT id FROM s.o WHERE id > 1", "q", None, "DIFFERENTIAL",
    ...                  "DIFFERENTIAL", is_populated=True, frontier={"s.o": 3}, output_columns=["id"])
    >>> v = Versions(old={"s.o": 3}, new={"s.o": 4}, columns={"s.o": ["id"]}, use_cdf={"s.o": True})
    >>> p = plan_refresh(st, v, insert_only=True)
    >>> p.kind, p.checkpoints, p.top_k is None
    (<PlanKind.APPEND: 'append'>, (), True)
    >>> plan_refresh(st, v).kind
    <PlanKind.MERGE: 'merge'>
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from enum import StrEnum

from sqlglot import exp

from airflow_trickle.dvm import planner
from airflow_trickle.dvm.base import Node, Unsupported, Versions, operators
from airflow_trickle.dvm.block import Block
from airflow_trickle.dvm.recursive import Recursive
from airflow_trickle.dvm.topk import TopK
from airflow_trickle.model import Strategy
from airflow_trickle.sql.parse import non_monotone_constructs, parse_query

class PlanKind(StrEnum):
    """How the delta reaches storage."""

    APPEND = "append"  # an INSERT: every changed source only gained rows and the query is monotone
    MERGE = "merge"  # the strategy's MERGE (bag, algebraic or recompute)


@dataclass(frozen=True)
class DeltaPlan:
    """The plan of one DIFFERENTIAL refresh of ``st`` over ``versions``."""

    st: object  # the StreamTable (its name, output columns, storage layout, refresh number)
    node: Node
    strategy: Strategy
    versions: Versions
    kind: PlanKind
    #: The parts of recursive CTEs' deltas computed once before the applying statement, in
    #: order: ``(operator, part name)``.
    checkpoints: tuple[tuple[Node, str], ...] = ()
    #: The top-K at the top of the query, whose boundary is probed before the commit.
    top_k: Node | None = None
    #: The aggregates under the top-K whose touched groups are counted first, innermost first
    #: (an outer aggregate's input delta uses the inner one's groups).
    counted_groups: tuple[Node, ...] = ()

    @property
    def probes_boundary(self) -> bool:
        """Whether the refresh must probe the top-K's boundary (an OFFSET or LIMIT 0 has none)."""
        return self.top_k is not None and self.top_k.has_boundary

    # -- the statements, rendered with what the refresh bound so far -------------------------

    def bag_delta_sql(self, v: Versions | None = None) -> str | None:
        """The consolidated, hashed delta (``dvm/bag.hashed_delta_sql``) that the bag MERGE of
        :meth:`apply_sql` applies; None when the plan applies something else (an append, a
        top-K, an aggregate's MERGE)."""
        from airflow_trickle.dvm.bag import hashed_delta_sql

        if self.kind is not PlanKind.MERGE or self.top_k is not None or self.strategy != Strategy.BAG:
            return None
        return hashed_delta_sql(self.st.output_columns, self.node.delta_sql(v or self.versions))

    def part_sql(self, v: Versions, node: Node, part: str) -> str:
        """The rows of one part of a recursive CTE's delta."""
        return node.part_sql(v, part)

    def groups_sql(self, v: Versions, block: Node, limit: int) -> str:
        """The groups ``block``'s input delta touches, at most one more than ``limit`` of them
        (so a count above the limit shows)."""
        from airflow_trickle.sql.parse import DIALECT

        return block.affected_groups_with_values(v, values=True).limit(limit + 1).sql(DIALECT)

    def candidates_sql(self, v: Versions, stored_rows: str | None = None) -> str:
        """The top-K's candidates: the stored rows (read from the relation ``stored_rows`` when
        given, else from the stored table) plus the query's delta."""
        return self.top_k.candidates_sql(self.st.name, v, stored_rows)

    def probe_sql(self, v: Versions, candidates: str) -> str:
        """A one-row query: whether the candidates (the relation ``candidates``) still cover the
        boundary of the stored top k."""
        return self.top_k.boundary_probe(self.st.name, v, candidates)

    def apply_sql(self, v: Versions | None = None, *, beyond_boundary: bool = False,
                  candidates: str | None = None) -> str:
        """The one statement that applies the delta (an INSERT or a MERGE).

        ``beyond_boundary``: a top-K's new rows are recomputed from the query (a row left the
        top k); ``candidates`` names a relation holding the stored rows plus the delta.
        """
        from airflow_trickle.dvm.algebraic import _algebraic_merge
        from airflow_trickle.dvm.bag import bag_merge_sql, bag_append_sql
        from airflow_trickle.dvm.recompute import _recompute_merge

        v = v or self.versions
        st, node = self.st, self.node
        if self.kind is PlanKind.APPEND:
            return bag_append_sql(st.name, st.output_columns, node.delta_sql(v), seq=st.refresh_seq + 1,
                                  dup_type=st.storage.dup_type)
        if self.top_k is not None:
            delta_sql = node.delta_against(st.name, v, beyond_boundary=beyond_boundary, candidates=candidates)
            return bag_merge_sql(st.name, st.output_columns, delta_sql, st.storage.dup_type)
        if self.strategy == Strategy.BAG:
            return bag_merge_sql(st.name, st.output_columns, node.delta_sql(v), st.storage.dup_type)
        if self.strategy == Strategy.ALGEBRAIC:
            return _algebraic_merge(st, node, v, dict(st.storage.columns))
        return _recompute_merge(st, node, v)


def plan_refresh(st, versions: Versions, *, insert_only: bool = False) -> DeltaPlan:
    """The plan of a DIFFERENTIAL refresh of ``st`` over ``versions``; raises
    :class:`~airflow_trickle.dvm.base.Unsupported` with the reason when there is none.

    ``insert_only``: every source that changed in the window only gained rows (the Delta logs
    say so: appends, insert-only MERGEs of an upstream); a bag table whose query is monotone
    then appends its delta, which has no negative weight.
    """
    if set(st.frontier) != set(versions.new):
        raise Unsupported("the set of sources differs from the frontier")
    strategy = st.storage.strategy or Strategy.BAG
    node = planner.plan(st.defining_query, versions.columns)
    if strategy == Strategy.BAG:
        node = read_old_from_storage(node, st.name, st.output_columns)
    appending = (strategy == Strategy.BAG and insert_only
                 and not non_monotone_constructs(parse_query(st.defining_query)))
    top_k = node if isinstance(node, TopK) and not appending else None
    if top_k is not None and strategy != Strategy.BAG:
        raise Unsupported("stored as keyed but the query is a top-K; REINITIALIZE it")
    if not appending and strategy != Strategy.BAG and not (isinstance(node, Block) and node.is_aggregate):
        raise Unsupported("stored as keyed but the query has no aggregate at the top; REINITIALIZE it")
    checkpoints = tuple((r, part) for r in operators(node) if isinstance(r, Recursive)
                        for part in r.materialized_parts())
    counted = ()
    if top_k is not None:
        counted = tuple(b for b in reversed(list(operators(top_k)))
                        if isinstance(b, Block) and b.is_aggregate and b.group and b.window_keys is None
                        and b.changed(versions))
    return DeltaPlan(st=st, node=node, strategy=strategy, versions=versions,
                     kind=PlanKind.APPEND if appending else PlanKind.MERGE, checkpoints=checkpoints,
                     top_k=top_k, counted_groups=counted)


def read_old_from_storage(node: Node, stored: str, stored_columns: list[str]) -> Node:
    """``node``, or, when it is ``SELECT <r's columns> FROM r`` over a recursive CTE r, a copy
    whose r reads its old rows from the stream table (``stored``, visible ``stored_columns``)
    instead of recomputing the recursion at the old versions: the stored rows *are* r at the old
    frontier.  Anything else (a filter, other columns, an aggregate over r) is returned as it is."""
    if not (isinstance(node, Block) and len(node.items) == 1 and isinstance(node.items[0][1], Recursive)):
        return node
    alias, recursive = node.items[0]
    template = node.template
    if node.is_aggregate or node.window_keys is not None or any(
            template.args.get(k) for k in ("where", "joins", "laterals", "having", "qualify", "distinct")):
        return node
    projected = [e.this if isinstance(e, exp.Alias) else e for e in template.expressions]
    if not all(isinstance(e, exp.Column) and e.table in ("", alias) for e in projected) \
            or [e.name for e in projected] != recursive.columns or len(stored_columns) != len(recursive.columns):
        return node
    renamed = ", ".join(f"`{s}` AS `{c}`" for s, c in zip(stored_columns, recursive.columns))
    db, table = stored.split(".", 1)
    reading_storage = replace(recursive, stored_old=f"(SELECT {renamed} FROM `{db}`.`{table}`) AS __stored",
                              stored_columns=tuple(stored_columns))
    return replace(node, items=[(alias, reading_storage)])
