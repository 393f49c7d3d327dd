"""``Block``: one SELECT -- its FROM items joined, filtered by WHERE, projected or aggregated.

A FROM clause with its WHERE, SELECT list and GROUP BY is planned as one block, the way SQL
writes it: Project/Aggregate over Filter over Join over its inputs.  Its rules:

* Filter     Δσ(R) = σ(ΔR)
* Project    Δπ(R) = π(ΔR)          (multiplicities carried, no DISTINCT)
* Join       Δ(R1 ⋈ … ⋈ Rn) = Σi R1,new ⋈ … ⋈ Ri−1,new ⋈ ΔRi ⋈ Ri+1,old ⋈ … ⋈ Rn,old
             (for two inputs: ΔA ⋈ B_old + A_new ⋈ ΔB, which includes ΔA ⋈ ΔB)
* Outer join The same telescoping sum holds for any chain; a term is ``… ΔRi …`` where the chain
             is linear in Ri.  Inner joins are linear in both inputs, and LEFT [OUTER|SEMI|ANTI]
             joins in their left (preserved) input, so only a null-supplying side and both sides
             of a FULL join are not.  For such an Ri, with K the join-key values of ΔRi:
               term_i = chain(…, Ri,new|K, …)|K − chain(…, Ri,old|K, …)|K
             Rows whose join key is outside K have the same partners before and after, so they
             cancel and are never computed: K restricts Ri's scan, the other side's rows (a
             LEFT SEMI JOIN on the key) and, for FULL, both inputs.  NULL keys are compared
             NULL-safely here, so a FULL join's NULL-keyed rows (always padded) follow too.
* Generator  LATERAL VIEW [OUTER] explode / posexplode / inline, and generators in the SELECT
             list, emit rows per input row: linear, Δgen(R) = gen(ΔR), weights carried
* Window     a window function sees only its partition: K = the PARTITION BY values of Δinput
             (common to every window of the SELECT);  Δ = −ω(old input | K) + ω(new input | K),
             the partitions of changed rows recomputed before and after.  With no common
             PARTITION BY the whole input is one partition, recomputed before and after.
* Aggregate  affected groups K = groups of Δinput;  Δγ = −γ(old input | K) + γ(new input | K);
             at the top of a stream table the appliers do better (``algebraic.py``, ``recompute.py``)

The block keeps its SELECT as a template whose FROM item *i* is the placeholder table
``__trickle_item_i``; rendering replaces each placeholder *node* in the tree by the subquery
for the item's old state, new state or delta.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum

from sqlglot import exp

from airflow_trickle.dvm.base import ITEM, W, Node, Versions, group_hash, parse_sql, union_all
from airflow_trickle.model import ROW_ID
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


@dataclass


class Block(Node):
    """One SELECT: its FROM items joined, filtered by WHERE, projected or aggregated.

    ``template`` is the SELECT with FROM item *i* replaced by the placeholder table
    ``__trickle_item_i`` (aliases kept); :meth:`render` swaps each placeholder for a subquery.
    """

    template: exp.Select
    items: list[tuple[str, Node]]
    columns: list[str]
    group: list[exp.Expression] | None = None  # None: no aggregation
    aggregates: list[exp.AggFunc] = field(default_factory=list)
    #: One per item (the first item's is INNER); empty means all INNER.
    steps: list[JoinStep] = field(default_factory=list)
    #: Window functions in the SELECT list: the PARTITION BY expressions all of them share
    #: (empty: one partition); None: no window functions.
    window_keys: list[exp.Expression] | None = None
    #: The groups the input delta touches, as ``(hash, value of each GROUP BY expression)``,
    #: when a refresh counted them and found them few (``dvm.collect_affected_groups``): they
    #: are then written into the SQL as literals.  None: not known (a subquery computes them).
    known_groups: list[tuple] | None = field(default=None, compare=False)

    def step(self, i: int) -> JoinStep:
        return self.steps[i] if i < len(self.steps) else JoinStep()

    def is_linear_in(self, i: int) -> bool:
        """Whether the join chain is linear in item *i* (its delta can stand in for it)."""
        if self.step(i).kind is JoinKind.LEFT:
            return False
        return not (i <= 1 and self.step(1).kind is JoinKind.FULL)

    @property
    def is_aggregate(self) -> bool:
        return self.group is not None

    def sources(self) -> set[str]:
        return set().union(*(node.sources() for _, node in self.items))

    # -- trees ------------------------------------------------------------------------------

    def render(self, select: exp.Select, parts: list[exp.Query]) -> exp.Select:
        """``select`` with each placeholder FROM item *i* replaced by the subquery ``parts[i]``."""
        tree = select.copy()
        placeholders = {ITEM.format(i): part for i, part in enumerate(parts)}
        for table in list(tree.find_all(exp.Table)):
            part = placeholders.get(table.name) if not table.args.get("db") else None
            if part is not None:
                alias = table.args.get("alias")
                table.replace(exp.Subquery(this=part.copy(), alias=alias.copy() if alias else None))
        return tree

    def state(self, v: Versions, which: str) -> exp.Query:
        return self.render(self.template, [node.state(v, which) for _, node in self.items])

    def input_delta(self, v: Versions, expressions: list[exp.Expression]) -> exp.Query:
        """Δ of this block's join + filter, projected to ``expressions`` (plus the weight).

        Δ(R1 ⋈ … ⋈ Rn) = Σi R1,new ⋈ … ⋈ ΔRi ⋈ … ⋈ Rn,old over the inputs that changed.
        """
        select = self.template.copy()
        select.set("expressions", [e.copy() for e in expressions])
        for key in ("group", "having", "order", "limit", "distinct"):
            select.set(key, None)
        terms = []
        for i, (alias, node) in enumerate(self.items):
            if not node.changed(v):
                continue
            before = [other.state(v, "new") for _, other in self.items[:i]]
            after = [other.state(v, "old") for _, other in self.items[i + 1:]]
            if self.is_linear_in(i):
                term = select.copy()
                term.append("expressions", exp.column(W, table=alias, quoted=True).as_(W))
                terms.append(self.render(term, before + [node.delta(v)] + after))
            else:
                terms += self._restricted_terms(v, i, select, before, after)
        if not terms:
            names = ", ".join(f"CAST(NULL AS STRING) AS `{e.alias_or_name}`" for e in expressions)
            return parse_sql(f"SELECT {names}, CAST(0 AS BIGINT) AS {W} WHERE false")
        return union_all(terms)

    def _restricted_terms(self, v: Versions, i: int, select: exp.Select,
                          before: list[exp.Query], after: list[exp.Query]) -> list[exp.Select]:
        """term_i = chain(…, Ri,new, …)|K − chain(…, Ri,old, …)|K, K the join keys of ΔRi."""
        alias, node = self.items[i]
        step = self.step(i)
        if i <= 1 and self.step(1).kind is JoinKind.FULL:
            # FULL join of items 0 and 1: both inputs restricted to K, on their own key side.
            step = self.step(1)
            on_delta = step.outer_keys if i == 0 else step.item_keys
            restrict = {0: step.outer_keys, 1: step.item_keys}
        else:
            on_delta, restrict = step.item_keys, {i: step.item_keys}
        keys = _changed_keys(node, alias, on_delta, v)
        terms = []
        for which, sign in (("new", 1), ("old", -1)):
            parts = before + [node.state(v, which)] + after
            for j, exprs in restrict.items():
                parts[j] = _semi_join(_star_of(parts[j], self.items[j][0]), exprs, keys)
            term = select.copy()
            term.append("expressions", exp.cast(exp.Literal.number(sign), "BIGINT").as_(W))
            if step.kind is JoinKind.LEFT:
                # the items before i, restricted by their side of the key (a LEFT join keeps them)
                term = _semi_join(term, step.outer_keys, keys)
            terms.append(self.render(term, parts))
        return terms

    def input_delta_sql(self, v: Versions, expressions: list[exp.Expression]) -> str:
        return self.input_delta(v, expressions).sql(DIALECT)

    def group_hash_sql(self) -> str:
        """Identity of a group: NULL-safe, position-aware hash of the GROUP BY expressions."""
        return group_hash([g.sql(DIALECT) for g in self.group or []])

    def affected_groups(self, v: Versions) -> exp.Query:
        """K: the hashes of the groups the input delta touches, as ``__trickle_row_id``."""
        if self.known_groups is not None:
            if not self.known_groups:
                return parse_sql(f"SELECT CAST(NULL AS BIGINT) AS {ROW_ID} WHERE false")
            rows = ", ".join(f"({int(row[0])})" for row in self.known_groups)
            return parse_sql(f"SELECT {ROW_ID} FROM VALUES {rows} AS __k({ROW_ID})")
        return self.affected_groups_with_values(v)

    def affected_groups_with_values(self, v: Versions, *, values: bool = False) -> exp.Select:
        """K as ``__trickle_row_id`` (and, with ``values``, each GROUP BY expression's value as
        ``__trickle_g<k>``), computed from the input delta."""
        groups = [g.copy().as_(f"__trickle_g{k}") for k, g in enumerate(self.group or [])] if values else []
        delta = self.input_delta(v, [_hash_expression(self).as_("__g"), *groups])
        names = [exp.column(f"__trickle_g{k}") for k in range(len(groups))]
        return exp.select(exp.column("__g").as_(ROW_ID), *names).distinct().from_(delta.subquery("__d"))

    def affected_groups_sql(self, v: Versions) -> str:
        return self.affected_groups(v).sql(DIALECT)

    def restricted(self, keys: exp.Query | str, select: exp.Select | None = None, *,
                   scalar_too: bool = False) -> exp.Select:
        """The block (or ``select`` over its FROM) limited to the groups whose hash is in ``keys``.

        A scalar aggregate has one group; it is restricted only with ``scalar_too``.
        """
        select = (select or self.template).copy()
        if self.group or scalar_too:
            keys = keys if isinstance(keys, exp.Expression) else parse_sql(keys)
            wanted = exp.select(ROW_ID).from_(keys.subquery())
            select = select.where(exp.In(this=_hash_expression(self), query=wanted.subquery()), copy=False)
        for condition in self._known_group_filters():
            select = select.where(condition, copy=False)
        return select

    def _known_group_filters(self) -> list[exp.Expression]:
        """``column IN (values)`` per GROUP BY column, from :attr:`known_groups`.

        The hash filter alone is applied after the inputs are joined; a column compared with
        literals is a filter Spark pushes down to the scan of its table (and, through the join's
        equalities, to the tables joined on it), so the groups are recomputed from the rows that
        can belong to them instead of from the whole join.  Every group restricted here is one
        of the known groups, so the filters drop no row the hash filter keeps.
        """
        if self.known_groups is None:
            return []
        filters = []
        for k, group in enumerate(self.group or []):
            if not isinstance(group, exp.Column):
                continue
            values = list(dict.fromkeys(row[k + 1] for row in self.known_groups))  # in a stable order
            literals = [_literal(value) for value in values if value is not None]
            if any(literal is None for literal in literals):
                continue  # a value without an exact literal (a float, a timestamp): no filter
            condition = exp.In(this=group.copy(), expressions=literals) if literals else exp.false()
            if None in values:
                condition = exp.or_(condition, exp.Is(this=group.copy(), expression=exp.Null()))
            filters.append(exp.paren(condition, copy=False))
        return filters

    def delta(self, v: Versions) -> exp.Query:
        projected = [exp.column(c, quoted=True) for c in self.columns]
        if self.window_keys is not None:
            return self._window_delta(v)
        if not self.is_aggregate:
            # Δπσ(⋈) = πσ(Δ⋈): the SELECT list applied to the join delta, weights carried.
            return self.input_delta(v, [e.copy() for e in self.template.expressions])
        # Δγ = −γ(old input | K) + γ(new input | K), K the groups the input delta touches.
        keys = self.affected_groups(v)
        sides = []
        for which, sign, alias in (("old", -1, "__old"), ("new", 1, "__new")):
            rows = self.render(self.restricted(keys), [n.state(v, which) for _, n in self.items])
            weight = exp.cast(exp.Literal.number(sign), "BIGINT").as_(W)
            sides.append(exp.select(*[p.copy() for p in projected], weight).from_(rows.subquery(alias)))
        return union_all(sides)

    def changed_input_keys(self, v: Versions, key_exprs: list[exp.Expression]) -> exp.Select:
        """The distinct values of ``key_exprs`` (over this block's FROM items) in Δinput, as ``KEY`` columns."""
        names = [KEY.format(n) for n in range(len(key_exprs))]
        delta = self.input_delta(v, [k.copy().as_(name) for k, name in zip(key_exprs, names)])
        return exp.select(*names).distinct().from_(delta.subquery("__trickle_changed"))

    def _window_delta(self, v: Versions) -> exp.Query:
        """Δ = −ω(old input | K) + ω(new input | K), K the partitions Δinput touches."""
        keys = self.changed_input_keys(v, self.window_keys) if self.window_keys else None
        sides = []
        for which, sign in (("old", -1), ("new", 1)):
            select = self.template.copy()
            select.append("expressions", exp.cast(exp.Literal.number(sign), "BIGINT").as_(W))
            if keys is not None:
                select = _semi_join(select, self.window_keys, keys)
            sides.append(self.render(select, [node.state(v, which) for _, node in self.items]))
        return union_all(sides)

    def explain(self, depth: int = 0) -> list[str]:
        pad = "  " * depth
        lines = []
        if self.window_keys is not None:
            keys = ", ".join(k.sql(DIALECT) for k in self.window_keys)
            lines.append(f"{pad}Window [partitions of changed rows recomputed, by {keys}]" if keys else
                         f"{pad}Window [no PARTITION BY common to every window: recomputed whole]")
            pad = "  " * (depth := depth + 1)
        if self.is_aggregate:
            keys = ", ".join(g.sql(DIALECT) for g in self.group) or "(scalar)"
            aggs = ", ".join(a.sql(DIALECT) for a in self.aggregates) or "(distinct keys)"
            lines.append(f"{pad}Aggregate group by {keys}: {aggs}  [groups touched by the input's delta, "
                         "before and after]")
            if self.template.args.get("having"):
                lines.append(f"{pad}  having {self.template.args['having'].this.sql(DIALECT)}")
        else:
            lines.append(f"{pad}Project {', '.join(self.columns)}  [linear: π(Δ)]")
        depth += 1
        pad = "  " * depth
        for lateral in self.template.args.get("laterals") or []:
            lines.append(f"{pad}Generate {lateral.sql(DIALECT).strip()}  [per input row: linear]")
        where = self.template.args.get("where")
        if where:
            lines.append(f"{pad}Filter {where.this.sql(DIALECT)}  [linear: σ(Δ)]")
            depth += 1
        if len(self.items) > 1:
            joins = self.template.args.get("joins") or []
            conditions = " AND ".join(j.args["on"].sql(DIALECT) for j in joins if j.args.get("on")) or "cross"
            kinds = [" ".join(p for p in (j.side, j.kind) if p).upper() or "INNER" for j in joins]
            shown = "" if set(kinds) <= {"INNER", "CROSS"} else f" {', '.join(kinds)}"
            keyed = [alias for i, (alias, _) in enumerate(self.items) if not self.is_linear_in(i)]
            rule = ("padding transitions" if keyed else "each input's delta joined with the others' states")
            lines.append("  " * depth + f"Join [{len(self.items)}-way{shown}, on {conditions}]  [{rule}]")
            if keyed:
                lines.append("  " * depth + f"  [delta of {', '.join(keyed)}: rows of the changed join keys, "
                                            "recomputed before and after]")
            depth += 1
        for alias, node in self.items:
            sub = node.explain(depth)
            sub[0] = sub[0] + f" AS {alias}"
            lines += sub
        return lines


def _changed_keys(node: Node, alias: str, key_exprs: list[exp.Expression], v: Versions) -> exp.Select:
    """The distinct values of ``key_exprs`` (over ``alias``, the item ``node``) among its changed rows.

    When ``node`` is an aggregate and every key is one of its GROUP BY columns, the groups its
    *input* delta touches are a superset of its changed rows' keys, and far cheaper to compute
    than its delta (which recomputes those groups before and after): a subquery rewritten into
    a join against grouped keys is the common case.
    """
    names = [KEY.format(n) for n in range(len(key_exprs))]
    if isinstance(node, Block) and node.is_aggregate and node.group and node.window_keys is None:
        outputs = {name: projection.unalias() for name, projection in zip(node.columns, node.template.expressions)}
        groups = {g.sql(DIALECT) for g in node.group}
        inner = [outputs.get(e.name) if isinstance(e, exp.Column) and e.table == alias else None for e in key_exprs]
        if all(x is not None and x.sql(DIALECT) in groups for x in inner):
            return node.changed_input_keys(v, inner)
    return exp.select(*[k.copy().as_(name) for k, name in zip(key_exprs, names)]).distinct() \
        .from_(node.delta(v).subquery(alias))


def _star_of(rows: exp.Query, alias: str) -> exp.Select:
    """``SELECT alias.* FROM (rows) AS alias``: a query whose key expressions can be written as in ON."""
    return exp.select(exp.Column(this=exp.Star(), table=exp.to_identifier(alias, quoted=True))) \
        .from_(rows.subquery(exp.to_identifier(alias, quoted=True)))


def _semi_join(select: exp.Select, key_exprs: list[exp.Expression], keys: exp.Query) -> exp.Select:
    """``select`` keeping the rows whose ``key_exprs`` are NULL-safely among ``keys``."""
    on = exp.and_(*[exp.NullSafeEQ(this=e.copy(), expression=exp.column(KEY.format(n), table=KEYS))
                    for n, e in enumerate(key_exprs)])
    return select.join(keys.subquery(KEYS), on=on, join_type="LEFT SEMI", copy=True)


def _literal(value) -> exp.Expression | None:
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


def _hash_expression(block: Block) -> exp.Expression:
    return exp.maybe_parse(block.group_hash_sql(), dialect=DIALECT)
