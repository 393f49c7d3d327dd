"""What a block's conditions say about its FROM items: the equalities that join them and the
filters each item's own rows must pass (pure, over the block's sqlglot template, no Spark).

The lookups of ``dvm/join_terms.py``, ``dvm/outer_terms.py`` and ``dvm/group_probes.py`` walk
these equalities; the refresh narrows the rows it gathers by :func:`item_conditions`.
"""
from __future__ import annotations

from sqlglot import exp

from airflow_trickle.dvm.join import JoinKind
from airflow_trickle.sql.parse import DIALECT


def plain_equalities(on: exp.Expression | None) -> set[frozenset[str]]:
    """The ``=`` conjuncts of ``on`` (not ``<=>``: a NULL key matches nothing only under ``=``)."""
    return {pair_sql(c.this, c.expression) for c in conjuncts(on) if isinstance(c, exp.EQ)}


def pair_sql(a: exp.Expression, b: exp.Expression) -> frozenset[str]:
    return frozenset((a.sql(DIALECT), b.sql(DIALECT)))


def has_full_join(block) -> bool:
    """Whether a FULL join is among ``block``'s steps (its items are then left alone)."""
    return any(block.step(i).kind is JoinKind.FULL for i in range(len(block.items)))


def columns_by_alias(template: exp.Select, aliases: list[str]) -> dict[str, set[str]]:
    """The columns of each FROM item the block reads anywhere in its SELECT."""
    used: dict[str, set[str]] = {a: set() for a in aliases}
    for column in template.find_all(exp.Column):
        if column.table in used and not isinstance(column.this, exp.Star):
            used[column.table].add(column.name)
    return used


def equalities(block, aliases: list[str]) -> list[tuple[int, str, int, str]]:
    """``(known item, its column, probed item, its column)`` for every equality that may restrict
    the probed item, both ways round where both sides may be restricted."""
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
    for conjunct in conjuncts(where.this if where is not None else None):
        add(conjunct, None)
    for n, join in enumerate(block.template.args.get("joins") or [], start=1):
        kind = block.step(n).kind
        for conjunct in conjuncts(join.args.get("on")):
            add(conjunct, None if kind is JoinKind.INNER else n)
    return found


def item_conditions(block) -> dict[int, exp.Expression]:
    """For each FROM item of ``block``, what its own rows must satisfy to meet an output row of
    the block: the parts of the WHERE and of the inner joins' ONs that read only its columns
    (for the null-supplying side of a LEFT join, of its own ON only); items without any are
    left out, and so is every item of a block with a FULL join.

    Why: a lookup gathers an input's rows by key, and a change carries every changed row; the
    rows that fail the block's own filter meet no output row, so the refresh may leave them out
    before looking further (fewer keys) and before handing them to Spark (fewer rows).  A row
    of the preserved side of a LEFT join is output whatever its partners, but still only when
    it passes the WHERE; a null-supplying row is output only when its ON holds.  An OR keeps
    the disjunction of its disjuncts' parts, and gives nothing when one disjunct has none.

    >>> from airflow_trickle.dvm.planner import plan
    >>> cols = {"s.l": ["k", "d", "m"], "s.p": ["k", "t"]}
    >>> node = plan("SELECT SUM(l.m) AS m FROM s.l AS l, s.p AS p WHERE (l.k = p.k AND l.d > 5 AND p.t = 'a') "
    ...             "OR (l.k = p.k AND l.d < 2 AND l.m = 1)", cols)
    >>> {node.items[i][0]: c.sql() for i, c in item_conditions(node).items()}
    {'l': 'l.d > 5 OR (l.d < 2 AND l.m = 1)'}
    """
    if has_full_join(block):
        return {}
    joins = block.template.args.get("joins") or []
    shared = output_conjuncts(block)
    found = {}
    for i, (alias, _) in enumerate(block.items):
        own = conjuncts(joins[i - 1].args.get("on")) if block.step(i).kind is JoinKind.LEFT else shared
        parts = [part for part in (_restricted(c, alias) for c in own) if part is not None]
        if parts:
            found[i] = exp.and_(*parts) if len(parts) > 1 else parts[0]
    return found


def output_conjuncts(block) -> list[exp.Expression]:
    """The conjuncts every output row of ``block`` satisfies: the WHERE's and the inner joins' ONs'."""
    where = block.template.args.get("where")
    found = conjuncts(where.this if where is not None else None)
    for n, join in enumerate(block.template.args.get("joins") or [], start=1):
        if block.step(n).kind is JoinKind.INNER:
            found += conjuncts(join.args.get("on"))
    return found


def _restricted(condition: exp.Expression, alias: str) -> exp.Expression | None:
    """What every row satisfying ``condition`` satisfies of the columns of ``alias`` alone (a
    copy); None when nothing is known."""
    while isinstance(condition, exp.Paren):
        condition = condition.this
    if isinstance(condition, exp.And):
        parts = [part for part in (_restricted(c, alias) for c in condition.flatten()) if part is not None]
        return (exp.and_(*parts) if len(parts) > 1 else parts[0]) if parts else None
    if isinstance(condition, exp.Or):
        parts = [_restricted(c, alias) for c in condition.flatten()]
        return None if any(part is None for part in parts) else exp.or_(*parts)
    columns = list(condition.find_all(exp.Column))
    if columns and all(c.table == alias for c in columns) and condition.find(exp.Query) is None:
        return condition.copy()
    return None


def conjuncts(condition: exp.Expression | None) -> list[exp.Expression]:
    """The conjuncts of ``condition``, and those every disjunct of a conjunct that is an OR
    holds alike (TPC-H q19's join equality, repeated in each of its three disjuncts)."""
    if condition is None:
        return []
    while isinstance(condition, exp.Paren):
        condition = condition.this
    found = list(condition.flatten()) if isinstance(condition, exp.And) else [condition]
    return found + [common for c in found if isinstance(c, exp.Or) for common in _common_conjuncts(c)]


def _common_conjuncts(disjunction: exp.Or) -> list[exp.Expression]:
    """The conjuncts found, written alike, in every disjunct of ``disjunction``."""
    disjuncts = [conjuncts(d) for d in disjunction.flatten()]
    texts = [{c.sql() for c in found} for found in disjuncts[1:]]
    return [c for c in disjuncts[0] if all(c.sql() in held for held in texts)]
