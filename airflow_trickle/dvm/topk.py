"""``TopK``: ``ORDER BY … LIMIT k [OFFSET m]`` at the top of a defining query.

The stored rows S are the top k of the query Q at the old frontier.  With Q's delta ΔQ::

    C = S ⊎ ΔQ                (consolidated: contents with a positive count)
    b = the k-th row of S     (the boundary; none when S holds fewer than k rows)

Every row of Q_old outside S sorts at or after b, and deleting one of them or adding to C does
not change that, so when C holds at least k rows sorting at or before b (or there is no b: S
was all of Q_old), the new top k is the top k of C — computed from the stored rows and the
delta alone.  Otherwise a row left the top k and nothing stored says which row replaces it:
the top k is recomputed from Q at the new frontier ("reading beyond the boundary").  Either way
the new rows T are applied to storage as the bag delta T ⊎ −S.  Which path a refresh takes is
decided by a small probe query before the commit (:meth:`TopK.boundary_probe`).

C is the expensive part (ΔQ of an aggregate over joins reads the sources' states), and both the
probe and the commit read it: a refresh computes it once into a relation of its own (a local
checkpoint, ``refresh/differential.py``) and passes that relation's name as ``candidates``.

With an OFFSET the first m rows are not stored, so the top k + m cannot be rebuilt from S: the
top k is recomputed whenever a source changed.  ``LIMIT`` without ``ORDER BY`` is refused by
the planner (which rows it keeps is not deterministic), as is ``ORDER BY`` on anything but an
output column (the stored rows must carry what they are ordered by).
"""
from __future__ import annotations

from dataclasses import dataclass

from sqlglot import exp

from airflow_trickle.dvm.base import W, Node, Versions, parse_sql, union_all
from airflow_trickle.dvm.sqltext import column_list
from airflow_trickle.names import quote_name


@dataclass(frozen=True)
class SortKey:
    """One ``ORDER BY`` term, on an output column, with Spark's null ordering made explicit."""

    column: str
    descending: bool = False
    nulls_first: bool = True

    def sql(self, qualifier: str = "") -> str:
        return (f"{qualifier}`{self.column}` {'DESC' if self.descending else 'ASC'} "
                f"NULLS {'FIRST' if self.nulls_first else 'LAST'}")


@dataclass


class TopK(Node):
    """The first ``limit`` rows of ``child`` in ``order`` after skipping ``offset``."""

    child: Node
    order: list[SortKey]
    limit: int
    offset: int = 0

    @property
    def columns(self) -> list[str]:
        return self.child.columns

    def sources(self) -> set[str]:
        return self.child.sources()

    def children(self) -> list[Node]:
        return [self.child]

    @property
    def scoped(self) -> bool:
        """Whether the stored rows plus the delta can give the new top k (no OFFSET)."""
        return self.offset == 0

    @property
    def has_boundary(self) -> bool:
        """Whether a refresh must probe the boundary (no OFFSET, LIMIT above 0)."""
        return self.scoped and self.limit > 0

    def _order_by(self) -> str:
        return ", ".join(key.sql() for key in self.order)

    def _top(self, rows_sql: str) -> str:
        """The top rows of ``rows_sql`` (which has the output columns)."""
        offset = f" OFFSET {self.offset}" if self.offset else ""
        return (f"SELECT {column_list(self.columns)} FROM ({rows_sql}) AS __trickle_ranked "
                f"ORDER BY {self._order_by()} LIMIT {self.limit}{offset}")

    def state(self, v: Versions, which: str) -> exp.Query:
        return parse_sql(self._top(self.child.state_sql(v, which)))

    def delta(self, v: Versions) -> exp.Query:
        # Without the stored rows: Δ = top(Q_new) ⊎ −top(Q_old) (the appliers use delta_against).
        signed = [exp.select("*", exp.cast(exp.Literal.number(sign), "BIGINT").as_(W))
                  .from_(self.state(v, which).subquery(alias)) for which, sign, alias
                  in (("old", -1, "__old"), ("new", 1, "__new"))]
        return union_all(signed)

    def candidates_sql(self, target: str, v: Versions, stored_rows: str | None = None) -> str:
        """C = S ⊎ ΔQ, consolidated: each content with its positive count ``__n``.

        ``stored_rows`` names a relation holding S already (the stored rows read by delta-rs:
        Spark reading ``target`` after a delta-rs commit rebuilds its snapshot first, in jobs of
        its own); else S is read from ``target``."""
        cols = column_list(self.columns)
        stored = (f"SELECT {cols}, CAST(1 AS BIGINT) AS {W} FROM "
                  f"{f'`{stored_rows}`' if stored_rows else quote_name(target)}")
        delta = f"SELECT {cols}, {W} FROM ({self.child.delta_sql(v)}) AS __trickle_dq"
        return (f"SELECT {cols}, SUM({W}) AS __n FROM ({stored} UNION ALL {delta}) AS __trickle_c "
                f"GROUP BY {cols} HAVING SUM({W}) > 0")

    def _candidates_from(self, target: str, v: Versions, candidates: str | None) -> str:
        """C as a FROM item: the relation named ``candidates`` (C computed earlier), else its query."""
        return f"`{candidates}`" if candidates else f"({self.candidates_sql(target, v)})"

    def boundary_probe(self, target: str, v: Versions, candidates: str | None = None) -> str | None:
        """A one-row query: whether C still covers the boundary of the stored top k (a true
        ``__covered`` means the scoped path is exact).  None when there is nothing to decide.
        ``candidates`` names a relation holding C (else C is computed here)."""
        if not self.has_boundary:
            return None
        cols = column_list(self.columns)
        boundary = (f"SELECT {cols} FROM {quote_name(target)} ORDER BY {self._order_by()} "
                    f"LIMIT 1 OFFSET {self.limit - 1}")
        # The boundary row is ranked after the candidates that tie with it (__m = 1 sorts last),
        # so the running count at it is the number of candidates sorting at or before it.
        marked = (f"SELECT {cols}, __n, 0 AS __m FROM {self._candidates_from(target, v, candidates)} AS __trickle_cand "
                  f"UNION ALL SELECT {cols}, CAST(0 AS BIGINT) AS __n, 1 AS __m FROM ({boundary}) AS __trickle_b")
        running = (f"SELECT __m, SUM(__n) OVER (ORDER BY {self._order_by()}, __m ASC "
                   f"ROWS BETWEEN UNBOUNDED PRECEDING AND CURRENT ROW) AS __before FROM ({marked}) AS __trickle_m")
        return (f"SELECT COALESCE(MAX(CASE WHEN __m = 1 THEN __before END) >= {self.limit}, TRUE) AS __covered "
                f"FROM ({running}) AS __trickle_r")

    def delta_against(self, target: str, v: Versions, *, beyond_boundary: bool, candidates: str | None = None) -> str:
        """The bag delta T ⊎ −S turning the stored rows of ``target`` into the new top k
        (``candidates`` as in :meth:`boundary_probe`)."""
        cols = column_list(self.columns)
        if self.scoped and not beyond_boundary:
            copies = (f"SELECT {cols} FROM {self._candidates_from(target, v, candidates)} AS __trickle_cand "
                      f"LATERAL VIEW explode(sequence(1, __n)) AS __trickle_copy")
            new_rows = self._top(copies)
        else:
            new_rows = self._top(self.child.state_sql(v, "new"))
        return (f"SELECT {cols}, CAST(1 AS BIGINT) AS {W} FROM ({new_rows}) AS __trickle_t "
                f"UNION ALL SELECT {cols}, CAST(-1 AS BIGINT) AS {W} FROM {quote_name(target)}")

    def explain(self, depth: int = 0) -> list[str]:
        offset = f" OFFSET {self.offset}" if self.offset else ""
        rule = ("scoped recompute: the stored rows plus the delta; the query is recomputed only when "
                f"a row leaves the top {self.limit}" if self.scoped else
                "recomputed when a source changed (OFFSET: the skipped rows are not stored)")
        lines = ["  " * depth + f"TopK ORDER BY {self._order_by()} LIMIT {self.limit}{offset}  [{rule}]"]
        return lines + self.child.explain(depth + 1)
