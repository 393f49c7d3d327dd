"""How an aggregate's touched groups are recomputed from inputs looked up by group values.

Once the groups an aggregate of a join touches are known -- counted by Spark, or bounded by the
changes' own keys (:func:`group_keys_of_changes`) -- the item holding a GROUP BY column is looked
up by those values, and the other inputs along the equalities from it; the recompute then reads
the rows found instead of each input whole (``dvm/aggregate.py``).
"""
from __future__ import annotations

from dataclasses import dataclass

from sqlglot import exp

from airflow_trickle.dvm.base import Node, Versions
from airflow_trickle.dvm.block import Block
from airflow_trickle.dvm.conjuncts import (columns_by_alias, equalities, has_full_join, output_conjuncts, pair_sql,
                                           plain_equalities)
from airflow_trickle.dvm.join import JoinKind
from airflow_trickle.dvm.join_terms import Probe, walk
from airflow_trickle.dvm.keyed import stored_columns
from airflow_trickle.dvm.scan import Scan


@dataclass(frozen=True)
class GroupProbe:
    """How an aggregate's touched groups, once known, are recomputed from probed inputs: the
    FROM item holding a GROUP BY column is looked up by the groups' values of that column, and
    the other inputs along the equalities from it (``probes``, their ``which`` unset: the
    refresh probes them once at the old versions and once at the new)."""

    block: Node
    item: int  # the FROM item holding the GROUP BY column
    source: str
    group: int  # the GROUP BY expression's position
    key: str  # the item's column it is
    columns: tuple[str, ...]  # the item's columns the block reads
    probes: tuple[Probe, ...]


def group_probes(block, v: Versions) -> GroupProbe | None:
    """How ``block``'s touched groups can be recomputed by probes, or None.

    Restricting the inputs this way is exact: a joined row of a touched group holds one of the
    groups' values in the GROUP BY column (NULL excluded: the refresh probes only when no
    touched group has a NULL there), so its row of that item has the value, and its row of
    every item reached along an equality meets that equality (a row an outer join pads with
    NULLs brings no input row).  The groups' hash filter then keeps exactly the touched groups.

    >>> from airflow_trickle.dvm.planner import plan
    >>> cols = {"s.o": ["ok", "ck", "d"], "s.l": ["ok", "q"], "s.c": ["ck", "n"]}
    >>> block = plan("SELECT l.ok, o.d, SUM(l.q) AS q FROM s.c AS c, s.o AS o, s.l AS l "
    ...              "WHERE c.ck = o.ck AND l.ok = o.ok GROUP BY l.ok, o.d", cols)
    >>> v = Versions(old={"s.o": 1, "s.l": 1, "s.c": 1}, new={"s.o": 2, "s.l": 1, "s.c": 1}, columns=cols)
    >>> g = group_probes(block, v)
    >>> g.source, g.key, g.group, [(p.source, p.key, p.by, p.by_column) for p in g.probes]
    ('s.l', 'ok', 0, [('s.o', 'ok', 2, 'ok'), ('s.c', 'ck', 1, 'ck')])
    """
    return next(group_chains(block, v), None)


def group_chains(block, v: Versions):
    """Each way :func:`group_probes` could look ``block``'s touched groups up, one per GROUP BY
    column that is a stored input's column, those the inputs are joined by first."""

    if not (isinstance(block, Block) and block.group) or has_full_join(block):
        return
    aliases = [alias for alias, _ in block.items]
    used = columns_by_alias(block.template, aliases)
    found_equalities = equalities(block, aliases)
    joined = {(aliases[a], column) for a, column, _, _ in found_equalities}
    # a column the inputs are joined by first: a key, of a type arrangements hold (q18 groups by
    # c_name first, a string, then by c_custkey and o_orderkey)
    order = sorted(range(len(block.group)), key=lambda k: (block.group[k].table, block.group[k].name) not in joined
                   if isinstance(block.group[k], exp.Column) else True)
    for k in order:
        expression = block.group[k]
        if not (isinstance(expression, exp.Column) and expression.table in aliases):
            continue
        item = aliases.index(expression.table)
        node = block.items[item][1]
        if not isinstance(node, Scan) or expression.name not in used.get(expression.table, ()):
            continue
        probes = walk(block, item, used, found_equalities, lambda _: "")
        yield GroupProbe(block=block, item=item, source=node.name, group=k, key=expression.name,
                         columns=tuple(sorted(used[expression.table])), probes=tuple(probes))


@dataclass(frozen=True)
class GroupOrigin:
    """Where the group values one changed FROM item's term can output are found: the values of
    ``column`` in the change of ``table``, or (``via`` set) the values of ``value`` in the rows
    of another input found by them (:func:`group_keys_of_changes`)."""

    item: int  # the changed FROM item
    table: str  # its stored table
    column: str  # the table's column whose values in the change bound the groups (or key ``via``)
    own: bool  # the values are the group column's own (a NULL among them is the NULL group)
    columns: tuple[str, ...]  # the table's columns the block reads (its condition tests them)
    #: The input whose rows, looked up by ``column``'s values at both versions, hold the group
    #: values in ``value`` (TPC-H q10: a line item reaches its customer through its order)
    via: Probe | None = None
    value: str | None = None


def group_keys_of_changes(block, v: Versions, chain: GroupProbe) -> tuple[GroupOrigin, ...] | None:
    """Where the group values ``block``'s input delta touches come from: for each changed FROM
    item, a :class:`GroupOrigin` whose values hold every value of the GROUP BY column ``chain``
    looks up that the item's term can output; None when some changed item gives none.

    The item holding the group column gives that column; an item equal to it by a WHERE
    conjunct or an inner join's ON gives its side of the equality (a term's rows satisfy it);
    the null-supplying side of a LEFT join whose ON pairs it with the group column gives its
    side of the key (its term keeps only rows whose key is among the change's).  The NULL group
    is bounded only by the group column's own table: a NULL there touches it (the refresh then
    leaves the groups to Spark), a NULL on the other side of an ``=`` touches no group.

    An item equal to neither but, by such a conjunct, to a third stored input that is gives its
    side of that equality, ``via`` that input: an output row of its term holds a row of the
    third input, at the old versions or at the new, whose key is the change row's and whose
    other column is the group value.

    >>> from airflow_trickle.dvm.planner import plan
    >>> cols = {"s.c": ["ck", "n"], "s.o": ["ok", "ck", "d"], "s.l": ["ok", "q"]}
    >>> block = plan("SELECT c.ck, SUM(l.q) AS q FROM s.c AS c, s.o AS o, s.l AS l "
    ...              "WHERE c.ck = o.ck AND l.ok = o.ok GROUP BY c.ck", cols)
    >>> v = Versions(old={"s.c": 1, "s.o": 1, "s.l": 1}, new={"s.c": 1, "s.o": 2, "s.l": 2}, columns=cols)
    >>> [(o.table, o.column, o.via and (o.via.source, o.via.key), o.value)
    ...  for o in group_keys_of_changes(block, v, group_probes(block, v))]
    [('s.o', 'ck', None, None), ('s.l', 'ok', ('s.o', 'ok'), 'ck')]
    """

    aliases = [alias for alias, _ in block.items]
    group_alias = aliases[chain.item]
    used = columns_by_alias(block.template, aliases)
    symmetric = [(c.this, c.expression) for c in output_conjuncts(block)
                 if isinstance(c, exp.EQ) and isinstance(c.this, exp.Column) and isinstance(c.expression, exp.Column)]
    pairs = symmetric + [(b, a) for a, b in symmetric]

    def direct(i: int) -> list[str]:  # item i's columns every output row holds the group value in
        if i == chain.item:
            return [chain.key]
        return [mine.name for mine, other in pairs
                if mine.table == aliases[i] and other.table == group_alias and other.name == chain.key]

    found = []
    for i, (alias, node) in enumerate(block.items):
        stored = stored_columns(node)
        if not node.changed(v):
            continue
        if stored is None or not v.use_cdf.get(stored.table, True):
            return None
        columns = stored.columns(used[alias])
        candidates = []
        if i == chain.item or block.is_linear_in(i):
            candidates = direct(i)
        elif block.step(i).kind is JoinKind.LEFT:
            step = block.step(i)
            equal = plain_equalities(block.template.args["joins"][i - 1].args.get("on"))
            candidates += [k.name for o, k in zip(step.outer_keys, step.item_keys)
                           if isinstance(o, exp.Column) and o.table == group_alias and o.name == chain.key
                           and isinstance(k, exp.Column) and k.table == alias and pair_sql(o, k) in equal]
        column = next((stored.column(c) for c in candidates if stored.column(c) is not None), None)
        if column is not None:
            found.append(GroupOrigin(i, stored.table, column, i == chain.item, columns))
            continue
        via = _via(block, i, pairs, direct, used) if block.is_linear_in(i) else None
        if via is None:
            return None
        mine, probe, value = via
        found.append(GroupOrigin(i, stored.table, stored.column(mine), probe.item == chain.item, columns,
                                 via=probe, value=value))
    return tuple(found) or None


def _via(block, i: int, pairs, direct, used) -> tuple[str, Probe, str] | None:
    """``(item i's column, the lookup of a third stored input by it, that input's column holding
    the group value)`` for :func:`group_keys_of_changes`; None when no equality gives one."""
    aliases = [alias for alias, _ in block.items]
    stored_i = stored_columns(block.items[i][1])
    for mine, other in pairs:
        if mine.table != aliases[i] or other.table not in aliases or other.table == aliases[i]:
            continue
        j = aliases.index(other.table)
        stored_j = stored_columns(block.items[j][1])
        if stored_j is None or stored_i.column(mine.name) is None or stored_j.column(other.name) is None:
            continue
        value = next((stored_j.column(c) for c in direct(j) if stored_j.column(c) is not None), None)
        if value is not None:
            probe = Probe(item=j, source=stored_j.table, which="", key=stored_j.column(other.name),
                          columns=stored_j.columns(used[other.table]), by=i, by_column=stored_i.column(mine.name))
            return mine.name, probe, value
    return None


