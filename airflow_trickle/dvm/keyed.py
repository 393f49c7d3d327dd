"""Aggregates of one stored table grouped by its columns: looked up, and maintained, through
that table.

Such an item (a subquery the optimizer turned into a join: ``EXISTS``, ``IN``, a correlated
aggregate) holds, for a key set K of its group column, exactly the aggregate of the table's
rows whose column is in K -- a group holds only rows of its own value.  So a lookup of the item
by K is a lookup of the table by that column, with Spark aggregating the rows found, and the
item's touched groups are recomputed from the table's rows of the change's keys.
"""
from __future__ import annotations

from dataclasses import dataclass

from sqlglot import exp

from airflow_trickle.dvm.base import Node, Versions, operators
from airflow_trickle.dvm.scan import Scan


@dataclass(frozen=True)
class Keyed:
    """A FROM item that is an aggregate of one stored table grouped by plain columns of it."""

    scan: Node
    alias: str  # the table's alias inside the aggregate
    columns: tuple[str, ...]  # the table's columns the aggregate reads
    keys: dict[str, str]  # the aggregate's output column -> the table's group column it is


def keyed_block(block) -> Keyed | None:
    """``block`` (a :class:`~airflow_trickle.dvm.block.Block`) as a :class:`Keyed` item, or None
    (not an aggregate of one stored table, or no output column is a plain group column); what
    :meth:`Node.keyed` answers for a block.

    >>> from airflow_trickle.dvm.planner import plan
    >>> k = plan("SELECT l.ok AS k, SUM(l.q) AS q FROM s.l AS l WHERE l.q > 0 GROUP BY l.ok",
    ...          {"s.l": ["ok", "q", "x"]}).keyed()
    >>> k.scan.name, k.columns, k.keys
    ('s.l', ('ok', 'q'), {'k': 'ok'})
    """
    if not (block.is_aggregate and block.group and block.window_keys is None
            and len(block.items) == 1 and isinstance(block.items[0][1], Scan)
            and not block.template.args.get("laterals") and not block.template.args.get("joins")):
        return None
    alias, scan = block.items[0]
    own = set(scan.columns)  # one FROM item: a column not qualified is its own

    def of_scan(e: exp.Expression) -> bool:
        return isinstance(e, exp.Column) and e.table in ("", alias) and e.name in own

    grouped = {g.name for g in block.group if of_scan(g)}
    keys = {}
    for name, projection in zip(block.columns, block.template.expressions):
        inner = projection.unalias()
        if of_scan(inner) and inner.name in grouped:
            keys[name] = inner.name
    if not keys:
        return None
    read = {c.name for c in block.template.find_all(exp.Column) if of_scan(c)}
    return Keyed(scan=scan, alias=alias, columns=tuple(sorted(read)), keys=keys)


@dataclass(frozen=True)
class KeyedDelta:
    """An aggregate of one changed stored table, grouped by a plain column of it, whose delta --
    its touched groups recomputed before and after -- reads that table probed by the change's
    values of the column instead of whole (``dvm/aggregate.py``)."""

    block: Node
    source: str
    key: str  # the table's group column looked up
    columns: tuple[str, ...]  # the table's columns the aggregate reads


def keyed_deltas(node: Node, v: Versions) -> tuple[KeyedDelta, ...]:
    """Every aggregate below ``node`` whose touched groups can be recomputed from its table's
    rows probed by the change's keys (:class:`KeyedDelta`): a keyed block whose table changed
    and has a readable change feed.

    Exact: a touched group's value of the column is in the change's rows, and every stored row
    of the group holds that value.  An arrangement leaves NULL keys out: when the change touches
    the NULL group, its rows are read from the table by Spark (``GroupRows.null_rows``)."""
    found = []
    for block in operators(node):
        if block is node:
            continue  # the top aggregate is applied from its input's delta (``dvm/apply.py``)
        item = block.keyed()
        if item is None or not item.scan.changed(v) or not v.use_cdf.get(item.scan.name, True):
            continue
        column = next(iter(item.keys.values()))
        found.append(KeyedDelta(block=block, source=item.scan.name, key=column, columns=item.columns))
    return tuple(found)


@dataclass(frozen=True)
class Stored:
    """How a FROM item's rows come from one stored table: a scan's columns are the table's
    own, a keyed aggregate's group columns name the table's columns they are."""

    table: str
    renamed: dict[str, str] | None  # the item's column -> the table's (None: every column is itself)
    reads: tuple[str, ...] | None  # the table's columns to read (None: those the block reads)

    def column(self, name: str) -> str | None:
        """The table's column the item's column ``name`` is; None when it is none of them."""
        return name if self.renamed is None else self.renamed.get(name)

    def columns(self, used: set[str]) -> tuple[str, ...]:
        """The table's columns a lookup reads, ``used`` being what the block reads of the item."""
        return self.reads or tuple(sorted(used))


def stored_columns(node: Node) -> Stored | None:
    """How ``node``'s rows come from one stored table (:class:`Stored`); None for an item that
    is neither a scan nor a keyed aggregate."""
    if isinstance(node, Scan):
        return Stored(node.name, None, None)
    item = node.keyed()
    return Stored(item.scan.name, item.keys, item.columns) if item else None
