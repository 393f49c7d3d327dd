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
        known, probes = {i}, []
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
                    probes.append(Probe(item=item, source=other.name, which="new" if item < i else "old",
                                        key=column, columns=columns, by=known_item, by_column=known_column,
                                        also=also))
                    known.add(item)
                    progress = True
        if probes:
            terms.append(JoinTerm(block=block, changed=i, source=node.name,
                                  change_columns=tuple(sorted(used[alias])), probes=tuple(probes)))
    return terms


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
