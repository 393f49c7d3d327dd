"""Choose how a stream table is stored, and build the one statement that applies a delta.

Three appliers, chosen by the top operator of the plan and recorded in the stream table's
:class:`~airflow_trickle.model.StorageLayout`:

* **bag** (``bag.py``): no aggregation at the top; rows added and removed by content (a top-K,
  ``topk.py``, is a bag whose delta is the new top rows against the stored ones);
* **algebraic** (``algebraic.py``): GROUP BY with COUNT, SUM, AVG over exact numbers, MIN, MAX;
  group state advanced by the delta;
* **recompute** (``recompute.py``): any other aggregate; the affected groups recomputed.
"""
from __future__ import annotations

from sqlglot import exp

from airflow_trickle.dvm.algebraic import _aggregate_state, _algebraic_merge
from airflow_trickle.dvm.bag import _bag_merge
from airflow_trickle.dvm.base import Unsupported, Versions
from airflow_trickle.dvm.block import Block
from airflow_trickle.dvm.planner import plan
from airflow_trickle.dvm.recompute import _recompute_merge
from airflow_trickle.dvm.recursive import read_old_from_storage
from airflow_trickle.dvm.sqltext import with_identity as _with_identity
from airflow_trickle.dvm.topk import TopK
from airflow_trickle.model import Identity, StateRole, StorageLayout, Strategy
from airflow_trickle.sql.parse import DIALECT


_EXACT = ("tinyint", "smallint", "int", "bigint", "decimal")


def storage_layout(spark, defining_query: str, columns: dict[str, list[str]], current: dict[str, int]) -> StorageLayout:
    """How a DIFFERENTIAL stream table is stored: identity, strategy and hidden state columns
    (``spark`` types the state columns: it analyses, runs nothing)."""

    def types_of(probe_sql: str) -> dict[str, str]:
        return {f.name: f.dataType.simpleString() for f in spark.sql(probe_sql).schema.fields}

    return choose_layout(plan(defining_query, columns), Versions(old=current, new=current, columns=columns), types_of)


def choose_layout(node, versions: Versions, types_of) -> StorageLayout:
    """The layout of a planned query; ``types_of(sql)`` gives the column types of a query (the
    state columns' types decide whether sums are exact, so maintainable algebraically)."""
    if not (isinstance(node, Block) and node.is_aggregate):
        return StorageLayout(identity=Identity.BAG, strategy=Strategy.BAG)
    state = _aggregate_state(node)
    if state is not None:
        types = types_of(keyed_full_sql(node, versions, state_exprs=[(n, e) for n, e, _ in state]))
        if all(types[n].startswith(_EXACT) for n, _, role in state if role == StateRole.S):
            return StorageLayout(identity=Identity.KEYED, strategy=Strategy.ALGEBRAIC,
                                 state=[(n, types[n]) for n, _, _ in state],
                                 state_exprs=[(n, e) for n, e, _ in state])
    return StorageLayout(identity=Identity.KEYED, strategy=Strategy.RECOMPUTE)


def keyed_full_sql(block: Block, versions: Versions, state_exprs: list[tuple[str, str]] | None = None,
                   which: str = "new") -> str:
    """The aggregate block at ``which`` version with its identity (and state) columns."""
    select = _with_identity(block.template, block)
    for name, sql in state_exprs or []:
        select.append("expressions", exp.maybe_parse(sql, dialect=DIALECT).as_(name))
    return block.render(select, [n.state(versions, which) for _, n in block.items]).sql(DIALECT)


def full_source_sql(st, versions: Versions, columns: dict[str, list[str]]) -> str:
    """Rows (with identity and state) of a keyed stream table at ``versions.new``, for FULL."""
    block = plan(st.defining_query, columns)
    return keyed_full_sql(block, versions, st.storage.state_exprs)


def top_k_of(st, columns: dict[str, list[str]]) -> TopK | None:
    """The planned query of a top-K stream table (its boundary is probed before the commit),
    None for any other query."""
    node = plan(st.defining_query, columns)
    return node if isinstance(node, TopK) else None


def differential_merge_sql(st, versions: Versions, columns: dict[str, list[str]], *,
                           beyond_boundary: bool = False, candidates: str | None = None, prepare=None) -> str:
    """The one MERGE that applies the change of ``versions`` to stream table ``st``.

    ``beyond_boundary``: a top-K's new rows are recomputed from the query instead of taken from
    the stored rows plus the delta (a row left the top k; see ``topk.py``); ``candidates``
    names a relation already holding the stored rows plus the delta.  ``prepare(node)`` runs on
    the planned tree before the statement is built (a refresh computes parts of it once).
    """
    node = plan(st.defining_query, columns)
    strategy = st.storage.strategy or Strategy.BAG
    visible = st.output_columns
    if strategy == Strategy.BAG:
        read_old_from_storage(node, st.name, visible)
    if prepare is not None:
        prepare(node)
    if isinstance(node, TopK):
        if strategy != Strategy.BAG:
            raise Unsupported("stored as keyed but the query is a top-K; REINITIALIZE it")
        delta_sql = node.delta_against(st.name, versions, beyond_boundary=beyond_boundary,
                                       candidates=candidates)
        return _bag_merge(st.name, visible, delta_sql, st.storage.dup_type)
    if strategy == Strategy.BAG:
        return _bag_merge(st.name, visible, node.delta_sql(versions), st.storage.dup_type)
    if not (isinstance(node, Block) and node.is_aggregate):
        raise Unsupported("stored as keyed but the query has no aggregate at the top; REINITIALIZE it")
    types = dict(st.storage.columns)
    if strategy == Strategy.ALGEBRAIC:
        return _algebraic_merge(st, node, versions, types)
    return _recompute_merge(st, node, versions)
