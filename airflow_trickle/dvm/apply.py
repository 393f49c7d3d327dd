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

from airflow_trickle.dvm.algebraic import _aggregate_state
from airflow_trickle.dvm.base import Versions
from airflow_trickle.dvm.block import Block
from airflow_trickle.dvm.planner import plan
from airflow_trickle.dvm.sqltext import with_identity as _with_identity
from airflow_trickle.model import Identity, StateRole, StorageLayout, Strategy
from airflow_trickle.sql.parse import DIALECT


_EXACT = ("tinyint", "smallint", "int", "bigint", "decimal")


def storage_layout(defining_query: str, columns: dict[str, list[str]], types_of) -> StorageLayout:
    """How a DIFFERENTIAL stream table is stored: identity, strategy and hidden state columns;
    ``types_of(sql)`` gives a query's column types (the caller asks Spark to analyse it)."""
    return choose_layout(plan(defining_query, columns), Versions(old={}, new={}, columns=columns), types_of)


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


def full_source_sql(st, columns: dict[str, list[str]], current: dict[str, int]) -> str:
    """Rows (with identity and state) of a keyed stream table at ``current``, for FULL."""
    block = plan(st.defining_query, columns)
    return keyed_full_sql(block, Versions(old=current, new=current, columns=columns), st.storage.state_exprs)
