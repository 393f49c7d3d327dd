"""How a recursive term carries its join key from one level to the next (:class:`ReachKey`).

Where the term joins its other table E by an equality whose next key is one of E's own columns,
the keys of a level are known from the level before and E alone, so the rows of E a recursion
can reach are found by following the keys through E (``refresh/arranged_recursion.py``).
"""
from __future__ import annotations

from dataclasses import dataclass

from sqlglot import exp

from airflow_trickle.dvm.base import parse_sql  # noqa: F401 - the doctests' parser


@dataclass(frozen=True)
class ReachKey:
    """How a recursive term joins its other table E: on ``E.other_key = r.self_key``, and the row
    it makes carries ``E.next_key`` as its ``self_key`` (None: r's own value, passed on).  The
    keys of a level are then known from the level before and E alone, so the rows of E a
    recursion can reach are found by following the keys through E, without the term's other
    columns; ``columns``, E's columns the term reads."""

    other_key: str
    self_key: str
    next_key: str | None
    columns: tuple[str, ...]


def reach_key(step: exp.Select, columns: list[str], self_alias: str, other_columns: list[str],
              other_alias: str) -> ReachKey | None:
    """How ``step`` (a recursive term reading r, of ``columns``, as ``self_alias`` and E, of
    ``other_columns``, as ``other_alias``) carries its join key from one level to the next
    (:class:`ReachKey`), or None.

    >>> step = parse_sql("SELECT p.id, t.root, t.depth + 1 FROM tree t JOIN people p ON p.boss = t.id "
    ...                  "WHERE p.active")
    >>> reach_key(step, ["id", "root", "depth"], "t", ["id", "boss", "active", "name"], "p")
    ReachKey(other_key='boss', self_key='id', next_key='id', columns=('id', 'boss', 'active'))
    >>> reach_key(parse_sql("SELECT r.src, e.dst FROM r JOIN e ON r.dst = e.src"), ["src", "dst"], "r",
    ...           ["src", "dst"], "e")
    ReachKey(other_key='src', self_key='dst', next_key='dst', columns=('src', 'dst'))
    >>> reach_key(parse_sql("SELECT t.id + 1, t.n FROM t JOIN e ON e.a = t.id"), ["id", "n"], "t", ["a"], "e") is None
    True
    """
    mine = {c.lower(): c for c in columns}
    theirs = {c.lower(): c for c in other_columns}

    def side(column: exp.Column) -> tuple[str, str] | None:
        """("r" | "e", the column's name there), for a column of one of them."""
        table, name = column.table.lower(), column.name.lower()
        if table == self_alias.lower() and name in mine:
            return "r", mine[name]
        if table == other_alias.lower() and name in theirs:
            return "e", theirs[name]
        if not table and (name in mine) != (name in theirs):
            return ("r", mine[name]) if name in mine else ("e", theirs[name])
        return None

    conditions = [step.args.get("where")] + [j.args.get("on") for j in step.args.get("joins") or []]
    equalities = [eq for c in conditions if c is not None for eq in c.find_all(exp.EQ)
                  if all(isinstance(s, exp.Column) for s in (eq.this, eq.expression))
                  and all(isinstance(a, (exp.And, exp.Where, exp.EQ)) for a in _ancestors(eq, c))]
    for eq in equalities:
        sides = dict(filter(None, (side(eq.this), side(eq.expression))))
        if set(sides) != {"r", "e"}:
            continue
        out = step.expressions[columns.index(sides["r"])]
        out = out.this if isinstance(out, exp.Alias) else out
        carried = side(out) if isinstance(out, exp.Column) else None
        if carried == ("r", sides["r"]):
            next_key = None
        elif carried is not None and carried[0] == "e":
            next_key = carried[1]
        else:
            continue
        if any(isinstance(s, exp.Star) for s in step.find_all(exp.Star)):
            read = set(theirs.values())
        else:
            read = {found[1] for c in step.find_all(exp.Column) if (found := side(c)) and found[0] == "e"}
        return ReachKey(sides["e"], sides["r"], next_key, tuple(c for c in other_columns if c in read))
    return None


def _ancestors(node: exp.Expression, top: exp.Expression):
    """The expressions between ``node`` and ``top`` (both included)."""
    while node is not None and node is not top:
        node = node.parent
        yield node
