"""Which inputs of a join's delta terms can be probed by key, and by which keys.

A term of a join's delta, ``ΔRi ⋈ R1,new ⋈ … ⋈ Rn,old``, needs of each other input only the
rows that can meet the change: those whose join key is among the keys of the change, or of an
input already restricted that way.  This pass (pure, over the block's sqlglot template, no
Spark) walks each term's equalities outwards from the change and records, for each stored
input it reaches, the column looked up, the relation whose column gives the keys, and the
version the term reads it at.  The refresh (``refresh/arranged.py``) reads the change with
delta-rs, probes the inputs' arrangements (``storage/arrangement.py``) in this order and binds
the rows found into the :class:`~airflow_trickle.dvm.base.Versions` the delta is rendered
with; :func:`~airflow_trickle.dvm.join.join_delta` then reads them in that term only.

Restricting an input to the keys an equality can match is exact when every row the term
outputs must satisfy the equality: a conjunct of the WHERE, or of an inner join's ON.  The ON
of a LEFT [OUTER|SEMI|ANTI] join restricts only its right side (a left row without a partner
is still output); blocks with a FULL join are left alone.  Only ``=`` qualifies (``<=>`` would
match NULL keys, which an arrangement leaves out).

    >>> from airflow_trickle.dvm.planner import plan
    >>> cols = {"s.o": ["ok", "ck", "d"], "s.l": ["ok", "q", "x"], "s.c": ["ck", "n"]}
    >>> node = plan("SELECT c.n, SUM(l.q) AS q FROM s.o AS o, s.l AS l, s.c AS c "
    ...             "WHERE o.ok = l.ok AND o.ck = c.ck GROUP BY c.n", cols)
    >>> v = Versions(old={"s.o": 1, "s.l": 1, "s.c": 1}, new={"s.o": 2, "s.l": 1, "s.c": 1}, columns=cols)
    >>> for term in join_terms(node, v):
    ...     print(term.source, term.change_columns, [(p.source, p.key, p.by, p.by_column, p.which) for p in term.probes])
    s.o ('ck', 'ok') [('s.l', 'ok', 0, 'ok', 'old'), ('s.c', 'ck', 0, 'ck', 'old')]
"""
from __future__ import annotations

from dataclasses import dataclass

from sqlglot import exp

from airflow_trickle.dvm.base import Node, Versions, operators


@dataclass(frozen=True)
class Probe:
    """One input of a term looked up by key."""

    item: int  # its FROM item
    source: str  # the stored table
    which: str  # the version the term reads it at: "old" or "new"
    key: str  # its column looked up
    columns: tuple[str, ...]  # its columns the block reads (the key among them)
    by: int  # the FROM item whose rows give the keys: the changed one, or one probed before
    by_column: str  # that item's column holding them
    #: Further equalities with items known by then, ``(item, its column, this input's column)``:
    #: the rows found are kept only where those match too (``ps_partkey = l_partkey`` after a
    #: probe by ``ps_suppkey = l_suppkey``)
    also: tuple[tuple[int, str, str], ...] = ()


@dataclass(frozen=True)
class JoinTerm:
    """The term of ``block``'s join delta that joins the change of FROM item ``changed``."""

    block: Node
    changed: int
    source: str  # the changed stored table
    change_columns: tuple[str, ...]  # its columns the block reads
    probes: tuple[Probe, ...]  # in the order they can run (each ``by`` is known before)


def join_terms(node: Node, v: Versions) -> tuple[JoinTerm, ...]:
    """Every join-delta term under ``node`` whose change is a stored table's change feed and
    that reaches at least one other stored input by an equality."""
    from airflow_trickle.dvm.block import Block

    terms = []
    for block in operators(node):
        if isinstance(block, Block) and len(block.items) > 1:
            terms += _block_terms(block, v)
    return tuple(terms)


def _block_terms(block, v: Versions) -> list[JoinTerm]:
    from airflow_trickle.dvm.join import JoinKind
    from airflow_trickle.dvm.scan import Scan

    if any(block.step(i).kind is JoinKind.FULL for i in range(len(block.items))):
        return []
    aliases = [alias for alias, _ in block.items]
    used = _columns_by_alias(block.template, aliases)
    equalities = _equalities(block, aliases)
    terms = []
    for i, (alias, node) in enumerate(block.items):
        if not (isinstance(node, Scan) and node.changed(v) and block.is_linear_in(i)
                and v.use_cdf.get(node.name, True) and used.get(alias)):
            continue
        probes = _walk(block, i, used, equalities, lambda item: "new" if item < i else "old")
        if probes:
            terms.append(JoinTerm(block=block, changed=i, source=node.name,
                                  change_columns=tuple(sorted(used[alias])), probes=tuple(probes)))
    return terms


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
    from airflow_trickle.dvm.join import JoinKind
    from airflow_trickle.dvm.scan import Scan

    if not getattr(block, "group", None) or any(block.step(i).kind is JoinKind.FULL for i in range(len(block.items))):
        return None
    aliases = [alias for alias, _ in block.items]
    used = _columns_by_alias(block.template, aliases)
    for k, expression in enumerate(block.group):
        if not (isinstance(expression, exp.Column) and expression.table in aliases):
            continue
        item = aliases.index(expression.table)
        node = block.items[item][1]
        if not isinstance(node, Scan) or expression.name not in used.get(expression.table, ()):
            continue
        probes = _walk(block, item, used, _equalities(block, aliases), lambda _: "")
        return GroupProbe(block=block, item=item, source=node.name, group=k, key=expression.name,
                          columns=tuple(sorted(used[expression.table])), probes=tuple(probes))
    return None


def _walk(block, start: int, used: dict[str, set[str]], equalities, which) -> list[Probe]:
    """The probes reaching out from FROM item ``start`` along ``equalities``, in an order
    where each probe's keys are known before it runs (``which(item)``: the version it reads)."""
    from airflow_trickle.dvm.scan import Scan

    aliases = [alias for alias, _ in block.items]
    known, probes = {start}, []
    progress = True
    while progress:
        progress = False
        for known_item, known_column, item, column in equalities:
            other = block.items[item][1]
            if (known_item in known and item not in known and isinstance(other, Scan)
                    and column in used.get(aliases[item], ())):
                columns = tuple(sorted(used[aliases[item]]))
                also = tuple(dict.fromkeys((k, kc, c) for k, kc, j, c in equalities
                                           if j == item and k in known and (k, kc, c) != (known_item, known_column, column)))
                probes.append(Probe(item=item, source=other.name, which=which(item), key=column, columns=columns,
                                    by=known_item, by_column=known_column, also=also))
                known.add(item)
                progress = True
    return probes


def _columns_by_alias(template: exp.Select, aliases: list[str]) -> dict[str, set[str]]:
    """The columns of each FROM item the block reads anywhere in its SELECT."""
    used: dict[str, set[str]] = {a: set() for a in aliases}
    for column in template.find_all(exp.Column):
        if column.table in used and not isinstance(column.this, exp.Star):
            used[column.table].add(column.name)
    return used


def _equalities(block, aliases: list[str]) -> list[tuple[int, str, int, str]]:
    """``(known item, its column, probed item, its column)`` for every equality that may restrict
    the probed item, both ways round where both sides may be restricted."""
    from airflow_trickle.dvm.join import JoinKind

    index = {alias: n for n, alias in enumerate(aliases)}
    found = []

    def add(conjunct: exp.Expression, only: int | None) -> None:
        if not (isinstance(conjunct, exp.EQ) and isinstance(conjunct.this, exp.Column)
                and isinstance(conjunct.expression, exp.Column)):
            return
        left, right = conjunct.this, conjunct.expression
        if left.table not in index or right.table not in index or left.table == right.table:
            return
        a, b = index[left.table], index[right.table]
        if only is None or b == only:
            found.append((a, left.name, b, right.name))
        if only is None or a == only:
            found.append((b, right.name, a, left.name))

    where = block.template.args.get("where")
    for conjunct in _conjuncts(where.this if where is not None else None):
        add(conjunct, None)
    for n, join in enumerate(block.template.args.get("joins") or [], start=1):
        kind = block.step(n).kind
        for conjunct in _conjuncts(join.args.get("on")):
            add(conjunct, None if kind is JoinKind.INNER else n)
    return found


def _conjuncts(condition: exp.Expression | None) -> list[exp.Expression]:
    if condition is None:
        return []
    while isinstance(condition, exp.Paren):
        condition = condition.this
    return condition.flatten() if isinstance(condition, exp.And) else [condition]
