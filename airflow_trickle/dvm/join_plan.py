"""How a SELECT's joins are planned: each join's kind and, for an outer join, the equalities
of its ON between its two sides (the keys its delta is computed per value of)."""
from __future__ import annotations

from sqlglot import exp

from airflow_trickle.dvm.base import Unsupported
from airflow_trickle.dvm.join import JoinKind, JoinStep
from airflow_trickle.sql.parse import conjuncts


def join_kind(join: exp.Join, index: int, from_: exp.From) -> JoinKind:
    """The kind of a join; ``A RIGHT JOIN B`` as the first join is rewritten ``B LEFT JOIN A``."""
    side, kind = (join.side or "").upper(), (join.kind or "").upper()
    label = " ".join(p for p in (side, kind) if p) + " JOIN"
    if join.args.get("using"):
        raise Unsupported("JOIN ... USING")  # qualification turns USING into ON; defensive
    if not side and kind in ("", "INNER", "CROSS"):
        return JoinKind.INNER
    if side == "LEFT" and kind in ("", "OUTER", "SEMI", "ANTI") or not side and kind in ("SEMI", "ANTI"):
        return JoinKind.LEFT
    if side in ("RIGHT", "FULL") and kind in ("", "OUTER"):
        if index != 1:
            raise Unsupported(f"{label} after another join (write the query so that it is the first join, "
                              "or use a subquery)")
        if side == "FULL":
            return JoinKind.FULL
        first, other = from_.this, join.this
        from_.set("this", other)
        join.set("this", first)
        join.set("side", "LEFT")
        return JoinKind.LEFT
    raise Unsupported(label)


def join_step(join: exp.Join, kind: JoinKind, outer: list[str], item: str) -> JoinStep:
    """The step of a join: its kind and the equalities of its ON clause between the two sides.

    An outer join needs at least one: its delta is computed per join-key value.
    """
    if kind is JoinKind.INNER:
        return JoinStep()
    pairs = []
    for conjunct in conjuncts(join.args.get("on")):  # ON (a.k = b.k) is an equality too
        if not isinstance(conjunct, (exp.EQ, exp.NullSafeEQ)):
            continue
        left, right = _tables(conjunct.this), _tables(conjunct.expression)
        if left and right and left <= set(outer) and right == {item}:
            pairs.append((conjunct.this, conjunct.expression))
        elif left and right and right <= set(outer) and left == {item}:
            pairs.append((conjunct.expression, conjunct.this))
    if not pairs:
        raise Unsupported(f"{kind.upper()} JOIN without an equality between its two sides in ON")
    return JoinStep(kind=kind, outer_keys=[o.copy() for o, _ in pairs], item_keys=[i.copy() for _, i in pairs])


def _tables(expression: exp.Expression) -> set[str]:
    """The table aliases a (qualified) expression reads; a subquery in it reads 'other' ones."""
    if expression.find(exp.Select):
        return {"?"}
    return {column.table for column in expression.find_all(exp.Column)}
