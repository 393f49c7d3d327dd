"""``Recursive``: a recursive CTE, ``r = B ⊎ step(r, E)``, maintained by counting derivations.

Spark runs ``WITH RECURSIVE`` with ``UNION ALL`` only, so ``r`` is a bag, and each of its rows
is a *derivation*: a row b of the base query B followed by k ≥ 0 steps, each through one row
of E (the recursive term's other source; none when it reads ``r`` alone).  A row's
multiplicity is its number of derivations.  Split B's and E's changes into the rows removed
(∇) and added (+), so that old = kept ⊎ ∇ and new = kept ⊎ +; then

    Δ⁻r = the old derivations through a removed row, cut at the *last* one:
          d = ∇B ⊎ step(r_old, ∇E),   then repeatedly  d ⊎= step(d, E_kept)
    r_mid = r_old − Δ⁻r                               (the derivations of kept rows only)
    Δ⁺r = the new derivations through an added row, cut at the *first* one:
          d = B⁺ ⊎ step(r_mid, E⁺),   then repeatedly  d ⊎= step(d, E_new)
    Δr  = Δ⁺r − Δ⁻r

Every derivation through a changed row is cut exactly once, so the counts are exact.  For an
insert-only change ∇B and ∇E are empty: Δ⁻r is empty and Δ⁺r is semi-naive evaluation from
the new rows alone.  Rows travel as (row, count) pairs, the count multiplied at each step by
the multiplicity of the E row it goes through.  Every part is linear in the counts, so only
the small change sets are consolidated: r_old and E are read as they are (count 1 a row),
E_kept is E_old with the removed rows added at count −1, r_mid is r_old with Δ⁻r negated, and
a derivation through a removed row cancels in the final sum.  The recursions start from the
change and stop where Spark's own recursion stops (no new rows).

Only a linear, monotone recursive term is maintained this way: it reads ``r`` once, joins at
most one stored table (inner joins), and has no aggregate, DISTINCT, window, outer or semi
join or subquery.  Anything else is refused with its name (the table then refreshes FULL).
"""
from __future__ import annotations

from dataclasses import dataclass, replace

from sqlglot import exp

from airflow_trickle.dvm.base import W, Node, Versions, parse_sql
from airflow_trickle.dvm.scan import Scan
from airflow_trickle.sql.parse import DIALECT

#: The parts of the delta a refresh computes once each, in this order, before the statement
#: that applies it (those a CTE has: :meth:`Recursive.materialized_parts`).  Spark's recursion
#: re-runs its step's inputs at every iteration and inlines a CTE wherever it is read, so
#: without them the change feeds would be read again and again, E's table scanned from Delta
#: at every iteration (a file listing job and a Parquet read each time), and r at the old
#: versions recursed twice (in the removed and in the added derivations).
MATERIALIZED = ("__trickle_e_delta", "__trickle_e_old", "__trickle_e_new", "__trickle_old", "__trickle_base_delta",
                "__trickle_removed", "__trickle_added")

#: Count of derivations carried through a recursion, and multiplicity of a row of E.
_COUNT, _MULT = "__trickle_n", "__trickle_m"


def reads_cte(table: exp.Table, name: str) -> bool:
    """Whether ``table`` is a reference to the CTE ``name`` (lower case): no database, same name."""
    return not table.args.get("db") and table.name.lower() == name


def _cols(columns: list[str], prefix: str = "") -> str:
    return ", ".join(f"{prefix}`{c}`" for c in columns)


@dataclass


class Recursive(Node):
    """A recursive CTE ``name`` (its base query planned as ``base``; ``step`` the recursive
    term, reading ``name`` as ``self_alias`` and, if any, the stored table ``other`` as
    ``other_alias``)."""

    name: str
    columns: list[str]
    base: Node
    step: exp.Select
    self_alias: str
    other: Scan | None = None
    other_alias: str | None = None
    #: A relation holding r at the old versions, when the stream table stores r itself (its
    #: rows then need no recursion from the base: see :func:`read_old_from_storage`).
    stored_old: str | None = None

    def sources(self) -> set[str]:
        return self.base.sources() | (self.other.sources() if self.other else set())

    def children(self) -> list[Node]:
        return [self.base] + ([self.other] if self.other is not None else [])

    # -- rendering ----------------------------------------------------------------------------

    def _step(self, rows: str, other_rows: str | None, *, counted: bool) -> str:
        """The recursive term over ``rows`` (a relation name or a parenthesised query standing
        for ``r``) and ``other_rows`` (for E); ``counted``: the rows carry a derivation count,
        E a multiplicity, and the output their product."""
        step = self.step.copy()
        for table in list(step.find_all(exp.Table)):
            if reads_cte(table, self.name):
                table.replace(_relation(rows, self.self_alias))
            elif self.other is not None:  # the one other table (``planner._plan_recursive``)
                table.replace(_relation(other_rows, self.other_alias))
        if counted:
            product = f"`{self.self_alias}`.{_COUNT}"
            if self.other is not None:
                product += f" * `{self.other_alias}`.{_MULT}"
            step.append("expressions", exp.maybe_parse(product, dialect=DIALECT).as_(_COUNT))
        return step.sql(DIALECT)

    def _base_rows(self, query: exp.Query, weighted: bool) -> str:
        """``query`` (the base's state or delta) with the CTE's column names."""
        names = [f"`{s}` AS `{d}`" for s, d in zip(self.base.columns, self.columns)]
        if weighted:
            names.append(W)
        return f"SELECT {', '.join(names)} FROM ({query.sql(DIALECT)}) AS __b"

    def _recursive_body(self, rec: str, v: Versions, which: str, other: str | None = None) -> str:
        """The CTE's own definition at version ``which``, reading itself as ``rec`` and E as
        ``other`` (a relation's name; by default E's table at ``which``)."""
        if other is None and self.other:
            other = f"({self.other.state_sql(v, which)})"
        return (f"{self._base_rows(self.base.state(v, which), False)} "
                f"UNION ALL {self._step(rec, other, counted=False)}")

    def state(self, v: Versions, which: str) -> exp.Query:
        # named by version: a statement may hold both states, and an applier's CTE hoisting
        # (``sql.rewrite.hoist_nested_ctes``) keeps one of two equal definitions
        rec = f"__trickle_rec_{which}"
        return parse_sql(f"WITH RECURSIVE {rec}({_cols(self.columns)}) AS ({self._recursive_body(rec, v, which)}) "
                         f"SELECT {_cols(self.columns)} FROM {rec}")

    def delta(self, v: Versions) -> exp.Query:
        # Δr = Δ⁺r − Δ⁻r, consolidated (a derivation removed and added again cancels)
        cols = _cols(self.columns)
        return _without_unused_ctes(parse_sql(
            f"{self._with(v)} SELECT {cols}, SUM(__c) AS {W} FROM ("
            f"SELECT {cols}, {_COUNT} AS __c FROM __trickle_added UNION ALL "
            f"SELECT {cols}, -{_COUNT} AS __c FROM __trickle_removed) AS __all "
            f"GROUP BY {cols} HAVING SUM(__c) <> 0"))

    def materialized_parts(self) -> list[str]:
        """The parts of :data:`MATERIALIZED` this CTE's delta has and computes once, in order.

        E's change, and r at the old versions (the removed and added rows of E are stepped from
        r), only when the recursive term reads a table.  r at the old versions and E's
        table at both versions only when r_old is recursed (not read from the stream table):
        then E at the old versions feeds two recursions, and copying E once costs less than
        scanning it at their iterations; with r_old read from storage, copying E bought nothing
        (``benchmarks/README.md``, "A recursive CTE", has both measurements).
        """
        skipped = set()
        if self.other is None:  # no step through E: r at the old versions seeds nothing either
            skipped |= {"__trickle_e_delta", "__trickle_e_old", "__trickle_e_new", "__trickle_old"}
        if self.stored_old is not None:
            skipped |= {"__trickle_e_old", "__trickle_e_new", "__trickle_old"}
        return [name for name in MATERIALIZED if name not in skipped]

    def part_sql(self, v: Versions, name: str) -> str:
        """The rows of one named part of the delta (see :data:`MATERIALIZED`), to compute it once."""
        return _without_unused_ctes(parse_sql(f"{self._with(v)} SELECT * FROM {name}")).sql(DIALECT)

    def _with(self, v: Versions) -> str:
        """The WITH clause naming every part of the delta, in order.

        One WITH for all, each part named once: Spark (4.2) fails to plan a WITH nested in a
        CTE's definition (InlineCTE: "key not found").  A part computed already for this
        refresh (:meth:`Versions.view_of`) is read from its view.
        """
        parts = self._parts(v)
        recursive = False
        for index, (name, definition, is_recursive) in enumerate(parts):
            view = v.view_of(self, name)
            if view is not None:
                parts[index] = (name, f"{name} AS (SELECT * FROM {view})", False)
            else:
                recursive |= is_recursive
        return f"WITH {'RECURSIVE ' if recursive else ''}{', '.join(d for _, d, _ in parts)}"

    def _parts(self, v: Versions) -> list[tuple[str, str, bool]]:
        """(name, definition, whether it is recursive) of every part of the delta, in order."""
        cols = _cols(self.columns)

        def part(query: str, sign: str, column: str, names: str) -> str:  # removed (-) or added (+) rows
            return (f"SELECT {names}, CAST({'-' if sign == '-' else ''}{W} AS BIGINT) AS {column} "
                    f"FROM ({query}) AS __d WHERE {W} {'<' if sign == '-' else '>'} 0")

        old_rec = "__trickle_rec_old"
        parts = []
        kept_e = new_e = old_e = None
        if self.other is not None:
            e = _cols(self.other.columns)

            def e_at(which: str) -> str:
                return f"SELECT {e}, CAST(1 AS BIGINT) AS {_MULT} FROM ({self.other.state_sql(v, which)}) AS __e"

            # E at both versions, named once: the recursions below read them at every iteration
            parts += [
                ("__trickle_e_delta", f"__trickle_e_delta AS (SELECT {e}, SUM({W}) AS {W} FROM "
                                      f"({self.other.delta_sql(v)}) AS __e GROUP BY {e} HAVING SUM({W}) <> 0)", False),
                ("__trickle_e_removed",
                 f"__trickle_e_removed AS ({part('SELECT * FROM __trickle_e_delta', '-', _MULT, e)})", False),
                ("__trickle_e_added",
                 f"__trickle_e_added AS ({part('SELECT * FROM __trickle_e_delta', '+', _MULT, e)})", False),
                ("__trickle_e_old", f"__trickle_e_old AS ({e_at('old')})", False),
                ("__trickle_e_kept", f"__trickle_e_kept AS (SELECT * FROM __trickle_e_old UNION ALL "
                                     f"SELECT {e}, -{_MULT} FROM __trickle_e_removed)", False),
                ("__trickle_e_new", f"__trickle_e_new AS ({e_at('new')})", False)]
            kept_e, new_e, old_e = "__trickle_e_kept", "__trickle_e_new", "__trickle_e_old"
        if self.stored_old is not None:
            old_rows = f"SELECT {cols} FROM {self.stored_old}"
        else:
            old_rows = f"SELECT {cols} FROM {old_rec}"
            parts.append((old_rec, f"{old_rec}({cols}) AS ({self._recursive_body(old_rec, v, 'old', old_e)})", True))
        # Every step is linear in the counts, so no relation below is consolidated but the
        # change sets (small): a row and its negated copy cancel in the final sum, and the large
        # relations (r_old, E) are read as they are, each row with count 1.
        parts += [("__trickle_old", f"__trickle_old AS (SELECT {cols}, CAST(1 AS BIGINT) AS {_COUNT} "
                                    f"FROM ({old_rows}) AS __o)", False),
                  ("__trickle_base_delta", f"__trickle_base_delta AS (SELECT {cols}, SUM({W}) AS {W} FROM "
                                           f"({self._base_rows(self.base.delta(v), True)}) AS __b GROUP BY {cols} "
                                           f"HAVING SUM({W}) <> 0)", False)]
        removed_seed = part("SELECT * FROM __trickle_base_delta", "-", _COUNT, cols)
        added_seed = part("SELECT * FROM __trickle_base_delta", "+", _COUNT, cols)
        if self.other is not None:
            removed_seed += " UNION ALL " + self._step("__trickle_old", "__trickle_e_removed", counted=True)
            added_seed += " UNION ALL " + self._step("__trickle_middle", "__trickle_e_added", counted=True)
        parts.append(("__trickle_removed", self._recursion("__trickle_removed", removed_seed, kept_e), True))
        # r_mid: the derivations that use kept rows only
        parts.append(("__trickle_middle", f"__trickle_middle AS (SELECT * FROM __trickle_old UNION ALL "
                                          f"SELECT {cols}, -{_COUNT} FROM __trickle_removed)", False))
        parts.append(("__trickle_added", self._recursion("__trickle_added", added_seed, new_e), True))
        return parts

    def _recursion(self, rec: str, seed: str, other_rows: str | None) -> str:
        """The CTE ``rec``: every derivation that starts with a row of ``seed`` (rows with
        counts) and continues through E as ``other_rows``: ``d = seed``, then ``d ⊎= step(d, E)``
        until nothing new."""
        return (f"{rec}({_cols(self.columns)}, {_COUNT}) AS (SELECT * FROM ({seed}) AS __seed "
                f"UNION ALL {self._step(rec, other_rows, counted=True)})")

    def explain(self, depth: int = 0) -> list[str]:
        pad = "  " * depth
        through = f" through {self.other.name}" if self.other else ""
        through += "; old rows read from the stream table" if self.stored_old else ""
        lines = [f"{pad}Recursive {self.name}{through}  [derivations counted: insert-only changes evaluated "
                 "semi-naively from the new rows; removed rows' derivations subtracted first]"]
        lines += self.base.explain(depth + 1)
        return lines


def _without_unused_ctes(query: exp.Expression) -> exp.Expression:
    """``query`` without the CTEs nothing reads any more: once the parts a refresh computed are
    read from their views, the definitions they were computed from (r's old rows read from the
    stream table, E at both versions) are dead.  Left in, the statement would still name the
    stream table, and its commit would resolve the change by reading every stored row in Spark
    (``refresh/local_merge.py``) instead of the few the change names."""
    from sqlglot.optimizer.eliminate_ctes import eliminate_ctes

    while True:
        before = len(query.args["with_"].expressions) if query.args.get("with_") else 0
        query = eliminate_ctes(query)
        after = len(query.args["with_"].expressions) if query.args.get("with_") else 0
        if after == before:
            return query


def _relation(rows: str | None, alias: str) -> exp.Expression:
    """A FROM item under ``alias``: a relation's name, or a query in parentheses."""
    if rows is None:
        raise ValueError("the recursive term reads a table, but no rows were given for it")
    if rows.startswith("("):
        return parse_sql(rows[1:-1]).subquery(exp.to_identifier(alias, quoted=True))
    return exp.Table(this=exp.to_identifier(rows), alias=exp.TableAlias(this=exp.to_identifier(alias, quoted=True)))


def read_old_from_storage(node: Node, stored: str, stored_columns: list[str]) -> Node:
    """``node``, or, when it is ``SELECT <r's columns> FROM r`` over a recursive CTE r, a copy
    whose r reads its old rows from the stream table (``stored``, visible ``stored_columns``)
    instead of recomputing the recursion at the old versions: the stored rows *are* r at the old
    frontier.  Anything else (a filter, other columns, an aggregate over r) is returned as it is."""
    from airflow_trickle.dvm.block import Block

    if not (isinstance(node, Block) and len(node.items) == 1 and isinstance(node.items[0][1], Recursive)):
        return node
    alias, recursive = node.items[0]
    template = node.template
    if node.is_aggregate or node.window_keys is not None or any(
            template.args.get(k) for k in ("where", "joins", "laterals", "having", "qualify", "distinct")):
        return node
    projected = [e.this if isinstance(e, exp.Alias) else e for e in template.expressions]
    if not all(isinstance(e, exp.Column) and e.table in ("", alias) for e in projected) \
            or [e.name for e in projected] != recursive.columns or len(stored_columns) != len(recursive.columns):
        return node
    renamed = ", ".join(f"`{s}` AS `{c}`" for s, c in zip(stored_columns, recursive.columns))
    db, table = stored.split(".", 1)
    reading_storage = replace(recursive, stored_old=f"(SELECT {renamed} FROM `{db}`.`{table}`) AS __stored")
    return replace(node, items=[(alias, reading_storage)])
