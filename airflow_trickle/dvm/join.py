"""Join: the inputs of a block (its FROM items) joined, inner or outer.

* Inner      Δ(R1 ⋈ … ⋈ Rn) = Σi R1,new ⋈ … ⋈ Ri−1,new ⋈ ΔRi ⋈ Ri+1,old ⋈ … ⋈ Rn,old
             (for two inputs: ΔA ⋈ B_old + A_new ⋈ ΔB, which includes ΔA ⋈ ΔB)
* Outer      The same telescoping sum holds for any chain; a term is ``… ΔRi …`` where the chain
             is linear in Ri.  Inner joins are linear in both inputs, and LEFT [OUTER|SEMI|ANTI]
             joins in their left (preserved) input, so only a null-supplying side and both sides
             of a FULL join are not.  For such an Ri, with K the join-key values of ΔRi:
               term_i = chain(…, Ri,new|K, …)|K − chain(…, Ri,old|K, …)|K
             Rows whose join key is outside K have the same partners before and after, so they
             cancel and are never computed: K restricts Ri's scan, the other side's rows (a
             LEFT SEMI JOIN on the key) and, for FULL, both inputs.  NULL keys are compared
             NULL-safely here, so a FULL join's NULL-keyed rows (always padded) follow too.

Filters and projections of the block are linear (Δσ(R) = σ(ΔR), Δπ(R) = π(ΔR)) and are carried
by each term's SELECT and WHERE, as are generators (LATERAL VIEW explode / posexplode / inline,
and generators in the SELECT list: Δgen(R) = gen(ΔR), weights carried).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum

from sqlglot import exp

from airflow_trickle.dvm.base import W, Node, Versions, parse_sql, union_all
from airflow_trickle.sql.parse import DIALECT


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


def join_delta(block, v: Versions, expressions: list[exp.Expression]) -> exp.Query:
    """Δ of ``block``'s join + filter, projected to ``expressions`` (plus the weight).

    Δ(R1 ⋈ … ⋈ Rn) = Σi R1,new ⋈ … ⋈ ΔRi ⋈ … ⋈ Rn,old over the inputs that changed.
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
            terms.append(block.render(term, before + [node.delta(v)] + after))
        else:
            terms += restricted_terms(block, v, i, select, before, after)
    if not terms:
        names = ", ".join(f"CAST(NULL AS STRING) AS `{e.alias_or_name}`" for e in expressions)
        return parse_sql(f"SELECT {names}, CAST(0 AS BIGINT) AS {W} WHERE false")
    return union_all(terms)


def restricted_terms(block, v: Versions, i: int, select: exp.Select,
                      before: list[exp.Query], after: list[exp.Query]) -> list[exp.Select]:
    """term_i = chain(…, Ri,new, …)|K − chain(…, Ri,old, …)|K, K the join keys of ΔRi."""
    alias, node = block.items[i]
    step = block.step(i)
    if i <= 1 and block.step(1).kind is JoinKind.FULL:
        # FULL join of items 0 and 1: both inputs restricted to K, on their own key side.
        step = block.step(1)
        on_delta = step.outer_keys if i == 0 else step.item_keys
        restrict = {0: step.outer_keys, 1: step.item_keys}
    else:
        on_delta, restrict = step.item_keys, {i: step.item_keys}
    keys = changed_keys(node, alias, on_delta, v)
    terms = []
    for which, sign in (("new", 1), ("old", -1)):
        parts = before + [node.state(v, which)] + after
        for j, exprs in restrict.items():
            parts[j] = semi_join(star_of(parts[j], block.items[j][0]), exprs, keys)
        term = select.copy()
        term.append("expressions", exp.cast(exp.Literal.number(sign), "BIGINT").as_(W))
        if step.kind is JoinKind.LEFT:
            # the items before i, restricted by their side of the key (a LEFT join keeps them)
            term = semi_join(term, step.outer_keys, keys)
        terms.append(block.render(term, parts))
    return terms


def changed_keys(node: Node, alias: str, key_exprs: list[exp.Expression], v: Versions) -> exp.Select:
    """The distinct values of ``key_exprs`` (over ``alias``, the item ``node``) among its changed rows.

    When ``node`` is an aggregate and every key is one of its GROUP BY columns, the groups its
    *input* delta touches are a superset of its changed rows' keys, and far cheaper to compute
    than its delta (which recomputes those groups before and after): a subquery rewritten into
    a join against grouped keys is the common case.
    """
    names = [KEY.format(n) for n in range(len(key_exprs))]
    if getattr(node, "is_aggregate", False) and node.group and node.window_keys is None:  # an aggregate block
        outputs = {name: projection.unalias() for name, projection in zip(node.columns, node.template.expressions)}
        groups = {g.sql(DIALECT) for g in node.group}
        inner = [outputs.get(e.name) if isinstance(e, exp.Column) and e.table == alias else None for e in key_exprs]
        if all(x is not None and x.sql(DIALECT) in groups for x in inner):
            return node.changed_input_keys(v, inner)
    return exp.select(*[k.copy().as_(name) for k, name in zip(key_exprs, names)]).distinct() \
        .from_(node.delta(v).subquery(alias))


def star_of(rows: exp.Query, alias: str) -> exp.Select:
    """``SELECT alias.* FROM (rows) AS alias``: a query whose key expressions can be written as in ON."""
    return exp.select(exp.Column(this=exp.Star(), table=exp.to_identifier(alias, quoted=True))) \
        .from_(rows.subquery(exp.to_identifier(alias, quoted=True)))


def semi_join(select: exp.Select, key_exprs: list[exp.Expression], keys: exp.Query) -> exp.Select:
    """``select`` keeping the rows whose ``key_exprs`` are NULL-safely among ``keys``."""
    on = exp.and_(*[exp.NullSafeEQ(this=e.copy(), expression=exp.column(KEY.format(n), table=KEYS))
                    for n, e in enumerate(key_exprs)])
    return select.join(keys.subquery(KEYS), on=on, join_type="LEFT SEMI", copy=True)
