"""Join: the inputs of a block (its FROM items) joined; the delta of an inner join.

    Δ(R1 ⋈ … ⋈ Rn) = Σi R1,new ⋈ … ⋈ Ri−1,new ⋈ ΔRi ⋈ Ri+1,old ⋈ … ⋈ Rn,old
    (for two inputs: ΔA ⋈ B_old + A_new ⋈ ΔB, which includes ΔA ⋈ ΔB)

A term stands for every input the chain is linear in: inner (and CROSS, comma) joins are
linear in both inputs, LEFT [OUTER|SEMI|ANTI] joins in their preserved input.  The other
inputs -- a null-supplying side, both sides of a FULL join -- take the outer join's rule
(``outer_join.py``).  Filters and projections of the block are linear and carried by each
term's SELECT and WHERE, generators too (``generator.py``).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum

from sqlglot import exp

from airflow_trickle.dvm.base import W, Versions, parse_sql, union_all
from airflow_trickle.names import quote_identifier


class JoinKind(StrEnum):
    """How FROM item *i* joins the items before it (the first item is ``INNER``)."""

    INNER = "inner"  # also CROSS and comma joins: linear in both inputs
    LEFT = "left"    # LEFT [OUTER], LEFT SEMI, LEFT ANTI: linear in the left input only
    FULL = "full"    # FULL [OUTER], second item only: linear in neither input


@dataclass
class JoinStep:
    """FROM item *i*'s join: its kind and the ON clause's equalities between the two sides.

    ``outer_keys`` are expressions over the items before *i*, ``item_keys`` over item *i*; they
    pair up (``outer_keys[k] = item_keys[k]``).
    """

    kind: JoinKind = JoinKind.INNER
    outer_keys: list[exp.Expression] = field(default_factory=list)
    item_keys: list[exp.Expression] = field(default_factory=list)


#: The key set of a restricted term and its columns.
KEYS, KEY = "__trickle_keys", "__trickle_k{}"


def join_delta(block, v: Versions, expressions: list[exp.Expression], outer_terms) -> exp.Query:
    """Δ of ``block``'s join + filter, projected to ``expressions`` (plus the weight).

    Δ(R1 ⋈ … ⋈ Rn) = Σi R1,new ⋈ … ⋈ ΔRi ⋈ … ⋈ Rn,old over the inputs that changed;
    ``outer_terms`` gives the terms of an input the chain is not linear in (``outer_join.py``).
    """
    select = block.template.copy()
    select.set("expressions", [e.copy() for e in expressions])
    for key in ("group", "having", "order", "limit", "distinct"):
        select.set(key, None)
    terms = []
    for i, (alias, node) in enumerate(block.items):
        if not node.changed(v):
            continue
        before = [other.state(v, "new") for _, other in block.items[:i]]
        after = [other.state(v, "old") for _, other in block.items[i + 1:]]
        if block.is_linear_in(i):
            term = select.copy()
            term.append("expressions", exp.column(W, table=alias, quoted=True).as_(W))
            parts = before + [node.delta(v)] + after
            probed = v.bindings.probed_term(block, i)
            if probed:
                parts = with_probed(term, block, parts, i, probed)
            terms.append(block.render(term, parts))
        else:
            terms += outer_terms(block, v, i, select, before, after)
    if not terms:
        names = ", ".join(f"CAST(NULL AS STRING) AS `{e.alias_or_name}`" for e in expressions)
        return parse_sql(f"SELECT {names}, CAST(0 AS BIGINT) AS {W} WHERE false")
    return union_all(terms)


def with_probed(term: exp.Select, block, parts: list[exp.Query], changed: int | None,
                probed: dict[int, tuple[str, tuple[str, ...]]]) -> list[exp.Query]:
    """``parts`` with each probed FROM item read from the relation the refresh probed into
    (``dvm/bindings.Relations``), where that relation holds every column of the item the term
    reads (the ``changed`` item's holds its change rows and their weights too); an item that is
    an aggregate of one table (``dvm/keyed.py``) is that aggregate over the table's rows found."""
    parts = list(parts)
    for item, (view, columns) in probed.items():
        alias, node = block.items[item]
        aggregated = node.keyed()
        if aggregated is not None:
            # an aggregate of one table, probed through it: the aggregate of the rows found (its
            # own change, when it is the changed item, is its delta, left as it is)
            if item != changed and set(aggregated.columns) <= set(columns):
                rows = parse_sql(f"SELECT {', '.join(quote_identifier(c) for c in columns)} FROM {view}")
                parts[item] = node.render(node.template, [rows])
            continue
        held = [*columns, W] if item == changed else list(columns)
        if not {c.name for c in term.find_all(exp.Column) if c.table == alias} <= set(held):
            continue
        names = ", ".join(quote_identifier(c) for c in held)
        parts[item] = parse_sql(f"SELECT {names} FROM {view}")
    return parts


def semi_join(select: exp.Select, key_exprs: list[exp.Expression], keys: exp.Query) -> exp.Select:
    """``select`` keeping the rows whose ``key_exprs`` are NULL-safely among ``keys``."""
    on = exp.and_(*[exp.NullSafeEQ(this=e.copy(), expression=exp.column(KEY.format(n), table=KEYS))
                    for n, e in enumerate(key_exprs)])
    return select.join(keys.subquery(KEYS), on=on, join_type="LEFT SEMI", copy=True)
