"""Outer join: the delta of a join chain for an input it is not linear in.

The telescoping sum of ``join.py`` holds for any chain; a term is ``… ΔRi …`` where the chain
is linear in Ri.  For a null-supplying side, or either side of a FULL join, with K the
join-key values of ΔRi:

    term_i = chain(…, Ri,new|K, …)|K − chain(…, Ri,old|K, …)|K

Rows whose join key is outside K have the same partners before and after, so they cancel and
are never computed: K restricts Ri's scan, the other side's rows (a LEFT SEMI JOIN on the key)
and, for FULL, both inputs.  NULL keys are compared NULL-safely here, so a FULL join's
NULL-keyed rows (always padded) follow too.  A refresh may hand the inputs in already looked up
by the change's keys (``dvm/outer_terms.OuterTerm``); K still restricts them.
"""
from __future__ import annotations

from sqlglot import exp

from airflow_trickle.dvm.base import W, Node, Versions
from airflow_trickle.dvm.join import KEY, JoinKind, semi_join, with_probed
from airflow_trickle.sql.parse import DIALECT


def outer_join_terms(block, v: Versions, i: int, select: exp.Select,
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
        looked_up = v.bindings.outer_term(block, i)
        probed = looked_up.at(which) if looked_up is not None else None
        if probed:  # inputs looked up by the change's keys (``refresh/arranged.py``): supersets of K
            parts = with_probed(block.template, block, parts, None, probed)
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
