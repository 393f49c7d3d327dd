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

Each recursion's iterations join the rows of the level before with E.  Spark runs a
``WITH RECURSIVE`` as a loop of jobs, each scanning E again; where the term joins E by an
equality whose next key is one of E's own columns (:class:`ReachKey`), every key a seed can
hold is known from the changes alone -- a seed row is a changed base row, or a row stepped
through a changed row of E, whose next key it carries -- so the refresh follows those keys
through an arrangement of E (``refresh/arranged_recursion.py``) to the rows of E the
recursions can reach, and each recursion reads those few rows instead of E: unrolled into one
statement of as many joins as the keys have levels, when that number is known and small
(:data:`MAX_UNROLLED_LEVELS`).

Only a linear, monotone recursive term is maintained this way: it reads ``r`` once, joins at
most one stored table (inner joins), and has no aggregate, DISTINCT, window, outer or semi
join or subquery.  Anything else is refused with its name (the table then refreshes FULL).
"""
from __future__ import annotations

from dataclasses import dataclass

from sqlglot import exp
from sqlglot.optimizer.eliminate_ctes import eliminate_ctes

from airflow_trickle.dvm.base import W, Node, Versions, parse_sql
from airflow_trickle.dvm.reach import ReachKey, reach_key
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
#: A recursion whose keys reach no further than this many levels is unrolled into that many
#: joins in one statement; deeper (or of unknown depth), Spark's ``WITH RECURSIVE`` runs it over
#: the rows found.  An unrolled plan grows with the square of the levels (each level is read by
#: the next and by the union): measured on two cores, 16 levels plan and run in 1.3 s against
#: 2.4 s for Spark's loop over the same rows, 24 levels in 2.4 s against 3.6 s.
MAX_UNROLLED_LEVELS = 16

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
    #: The stream table's columns in r's order, when ``stored_old`` reads it (else empty): a
    #: refresh may read the few stored rows the seeds join instead (``Bindings.old_joined``).
    stored_columns: tuple[str, ...] = ()

    def sources(self) -> set[str]:
        return self.base.sources() | (self.other.sources() if self.other else set())

    @property
    def reach_key(self) -> ReachKey | None:
        """How the term's keys walk through E (:class:`ReachKey`), or None where they cannot be
        followed without the term: no other table, no equality between a column of E and one of
        r, or a next key that is an expression or another column of r."""
        if self.other is None:
            return None
        return reach_key(self.step, self.columns, self.self_alias, self.other.columns, self.other_alias)

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
        refresh (``Bindings.part``) is read from its view.
        """
        parts = self._parts(v)
        recursive = False
        for index, (name, definition, is_recursive) in enumerate(parts):
            view = v.bindings.part(self, name)
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
        joined = v.bindings.old_joined(self)
        if joined is not None:  # r's stored rows whose key E's change holds: all the seeds join
            old_rows = f"SELECT {cols} FROM {joined}"
        elif self.stored_old is not None:
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
        parts += self._recursion_parts("__trickle_removed", removed_seed, kept_e, v.bindings.reached(self, "removed"))
        # r_mid: the derivations that use kept rows only
        parts.append(("__trickle_middle", f"__trickle_middle AS (SELECT * FROM __trickle_old UNION ALL "
                                          f"SELECT {cols}, -{_COUNT} FROM __trickle_removed)", False))
        parts += self._recursion_parts("__trickle_added", added_seed, new_e, v.bindings.reached(self, "added"))
        return parts

    def _recursion_parts(self, rec: str, seed: str, other_rows: str | None,
                         reached: tuple[str, int | None] | None) -> list[tuple[str, str, bool]]:
        """The parts of the recursion ``rec`` from ``seed`` through E as ``other_rows``; when a
        refresh bound the rows of E the changes' keys reach (``reached``: the view holding them,
        and how many levels the keys reach, None if not known), the recursion through those rows
        -- unrolled when the levels are known and few."""
        if reached is None:
            return [(rec, self._recursion(rec, seed, other_rows), True)]
        view, levels = reached
        columns = _cols(list(self.reach_key.columns))
        through = f"SELECT {columns}, CAST(1 AS BIGINT) AS {_MULT} FROM {view}"
        if rec == "__trickle_removed":  # E's kept rows: E's old rows less the removed ones
            through += f" UNION ALL SELECT {columns}, -{_MULT} FROM __trickle_e_removed"
        parts = [(f"{rec}_e", f"{rec}_e AS ({through})", False)]
        if levels is None or levels > MAX_UNROLLED_LEVELS:
            return [*parts, (rec, self._recursion(rec, seed, f"{rec}_e"), True)]
        named = f"{_cols(self.columns)}, {_COUNT}"
        parts.append((f"{rec}_0", f"{rec}_0 AS (SELECT * FROM ({seed}) AS __seed)", False))
        for level in range(1, levels + 1):
            parts.append((f"{rec}_{level}", f"{rec}_{level}({named}) AS "
                                            f"({self._step(f'{rec}_{level - 1}', f'{rec}_e', counted=True)})", False))
        every = " UNION ALL ".join(f"SELECT * FROM {rec}_{level}" for level in range(levels + 1))
        return [*parts, (rec, f"{rec}({named}) AS ({every})", False)]

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
        key = self.reach_key
        if key is not None:
            through += f"; E's rows looked up by {key.other_key} from the changes' keys"
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
    while True:
        before = len(query.args["with_"].expressions) if query.args.get("with_") else 0
        query = eliminate_ctes(query)
        after = len(query.args["with_"].expressions) if query.args.get("with_") else 0
        if after == before:
            break
    with_ = query.args.get("with_")
    if with_ is not None and with_.args.get("recursive") and not any(
            reads_cte(t, cte.alias_or_name.lower()) for cte in with_.expressions for t in cte.this.find_all(exp.Table)):
        with_.set("recursive", False)  # what was recursive is computed already (or unrolled)
    return query


def _relation(rows: str | None, alias: str) -> exp.Expression:
    """A FROM item under ``alias``: a relation's name, or a query in parentheses."""
    if rows is None:
        raise ValueError("the recursive term reads a table, but no rows were given for it")
    if rows.startswith("("):
        return parse_sql(rows[1:-1]).subquery(exp.to_identifier(alias, quoted=True))
    return exp.Table(this=exp.to_identifier(rows), alias=exp.TableAlias(this=exp.to_identifier(alias, quoted=True)))
