"""Aggregate: GROUP BY (or a scalar aggregate) over a block's filtered join.

    K  = the groups the input delta touches (their hashes)
    Δγ = −γ(old input | K) + γ(new input | K)

Only the touched groups are recomputed, before and after.  Where a refresh looked up the
inputs of a superset of them by the changes' keys (``refresh/arranged.py``), the recompute is
of those rows alone, unfiltered: an untouched group among them comes out alike on both sides
and cancels, and K itself is never computed.  When a refresh counted them and
found them few (``refresh/differential.py``), K is written into the SQL as literals, and each
group column compared with its values becomes a filter Spark pushes down to the scans.  At the
top of a stream table the appliers do better (``algebraic.py``, ``recompute.py``).
"""
from __future__ import annotations

from sqlglot import exp

from airflow_trickle.dvm.base import W, Versions, parse_sql, union_all
from airflow_trickle.dvm.join import with_probed
from airflow_trickle.model import ROW_ID
from airflow_trickle.sql.parse import DIALECT


def aggregate_delta(block, v: Versions) -> exp.Query:
    """Δγ = −γ(old input | K) + γ(new input | K), K the groups the input delta touches."""
    projected = [exp.column(c, quoted=True) for c in block.columns]
    looked_up = v.bindings.group_rows(block)
    whole = looked_up is not None and looked_up.whole
    keys = None if whole else affected_groups(block, v)
    sides = []
    for which, sign, alias in (("old", -1, "__old"), ("new", 1, "__new")):
        select = block.template.copy() if whole else restricted(block, v, keys)
        parts = [n.state(v, which) for _, n in block.items]
        probed = looked_up.at(which) if looked_up is not None else None
        if probed:  # the inputs looked up by the groups' keys (``refresh/arranged.py``)
            # (what the block reads of each item: the restriction's subquery has aliases of its own)
            parts = with_probed(block.template, block, parts, None, probed)
            nulls = looked_up.null_rows
            if nulls is not None:
                parts = [_with_null_keys(part, node, v, which, nulls, probed.get(i))
                         for i, (part, (_, node)) in enumerate(zip(parts, block.items))]
        rows = block.render(select, parts)
        weight = exp.cast(exp.Literal.number(sign), "BIGINT").as_(W)
        sides.append(exp.select(*[p.copy() for p in projected], weight).from_(rows.subquery(alias)))
    return union_all(sides)


def _with_null_keys(part: exp.Query, node, v: Versions, which: str, key: str, probed) -> exp.Query:
    """A probed item's rows plus its table's rows whose ``key`` is NULL (Delta's statistics
    skip every file without a NULL there); other items as they are."""
    if probed is None:
        return part
    columns = [exp.column(c, quoted=True) for c in probed[1]]
    nulls = (exp.select(*columns).from_(node.state(v, which).subquery("__nulls"))
             .where(exp.column(key, quoted=True).is_(exp.null())))
    return union_all([part, nulls])


def affected_groups(block, v: Versions) -> exp.Query:
    """K: the hashes of the groups the input delta touches, as ``__trickle_row_id`` (literals
    when a refresh counted them: ``Bindings.touched_groups``)."""
    known = v.bindings.touched_groups(block)
    if known is not None:
        if not known:
            return parse_sql(f"SELECT CAST(NULL AS BIGINT) AS {ROW_ID} WHERE false")
        rows = ", ".join(f"({int(row[0])})" for row in known)
        return parse_sql(f"SELECT {ROW_ID} FROM VALUES {rows} AS __k({ROW_ID})")
    return affected_groups_with_values(block, v)


def affected_groups_with_values(block, v: Versions, *, values: bool = False) -> exp.Select:
    """K as ``__trickle_row_id`` (and, with ``values``, each GROUP BY expression's value as
    ``__trickle_g<k>``), computed from the input delta."""
    groups = [g.copy().as_(f"__trickle_g{k}") for k, g in enumerate(block.group or [])] if values else []
    delta = block.input_delta(v, [hash_expression(block).as_("__g"), *groups])
    names = [exp.column(f"__trickle_g{k}") for k in range(len(groups))]
    return exp.select(exp.column("__g").as_(ROW_ID), *names).distinct().from_(delta.subquery("__d"))


def restricted(block, v: Versions, keys: exp.Query | str, select: exp.Select | None = None, *,
               scalar_too: bool = False) -> exp.Select:
    """The block (or ``select`` over its FROM) limited to the groups whose hash is in ``keys``.

    A scalar aggregate has one group; it is restricted only with ``scalar_too``.
    """
    select = (select or block.template).copy()
    if block.group or scalar_too:
        keys = keys if isinstance(keys, exp.Expression) else parse_sql(keys)
        wanted = exp.select(ROW_ID).from_(keys.subquery())
        select = select.where(exp.In(this=hash_expression(block), query=wanted.subquery()), copy=False)
    for condition in known_group_filters(block, v.bindings.touched_groups(block)):
        select = select.where(condition, copy=False)
    return select


def known_group_filters(block, known: list[tuple] | None) -> list[exp.Expression]:
    """``column IN (values)`` per GROUP BY column, from the ``known`` groups.

    The hash filter alone is applied after the inputs are joined; a column compared with
    literals is a filter Spark pushes down to the scan of its table (and, through the join's
    equalities, to the tables joined on it), so the groups are recomputed from the rows that
    can belong to them instead of from the whole join.  Every group restricted here is one
    of the known groups, so the filters drop no row the hash filter keeps.
    """
    if known is None:
        return []
    filters = []
    for k, group in enumerate(block.group or []):
        if not isinstance(group, exp.Column):
            continue
        values = list(dict.fromkeys(row[k + 1] for row in known))  # in a stable order
        literals = [literal(value) for value in values if value is not None]
        if any(literal is None for literal in literals):
            continue  # a value without an exact literal (a float, a timestamp): no filter
        condition = exp.In(this=group.copy(), expressions=literals) if literals else exp.false()
        if None in values:
            condition = exp.or_(condition, exp.Is(this=group.copy(), expression=exp.Null()))
        filters.append(exp.paren(condition, copy=False))
    return filters


def literal(value) -> exp.Expression | None:
    """A Spark SQL literal equal to ``value`` (a collected group value), None when there is no
    exact one (floats; timestamps, which Python sees in its own time zone)."""
    import datetime
    import decimal

    if isinstance(value, bool):
        return exp.Boolean(this=value)
    if isinstance(value, int):
        return exp.Literal.number(value)
    if isinstance(value, decimal.Decimal) and value.is_finite():
        return exp.Literal.number(format(value, "f"))
    if isinstance(value, str):
        # Spark substitutes ${...} in SQL text (spark.sql.variable.substitute): left to a subquery
        return exp.Literal.string(value) if "${" not in value else None
    if isinstance(value, datetime.date) and not isinstance(value, datetime.datetime):
        return exp.cast(exp.Literal.string(value.isoformat()), "DATE")
    return None


def hash_expression(block) -> exp.Expression:
    """The group's identity as an expression (``Block.group_hash_sql``)."""
    return exp.maybe_parse(block.group_hash_sql(), dialect=DIALECT)
