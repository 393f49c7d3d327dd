"""``SetAll``: ``INTERSECT ALL`` and ``EXCEPT ALL``, maintained by dual counts.

A row present l times in the left input and r times in the right one appears

    INTERSECT ALL:  min(l, r)         EXCEPT ALL:  max(l − r, 0)

times in the output.  Only the rows the inputs' deltas touch change their counts:

    K        = the distinct rows of ΔL ⊎ ΔR
    l₀, r₀   = the copies of each row of K in L_old, R_old     (the old states restricted to K)
    l₁, r₁   = l₀ + ΣΔL, r₀ + ΣΔR                              (the new counts from the old and Δ)
    Δ        = each row of K with weight f(l₁, r₁) − f(l₀, r₀)

Rows compare with NULLs as equal, as set operations do (a GROUP BY and ``<=>`` here); the
output takes the left input's column names.  (``INTERSECT`` and ``EXCEPT`` without ``ALL``
are rewritten to a GROUP BY before planning: ``rewrites.set_operations_to_group_by``.)
"""
from __future__ import annotations

from dataclasses import dataclass

from sqlglot import exp

from airflow_trickle.dvm.base import W, Node, Versions, parse_sql
from airflow_trickle.sql.parse import DIALECT

#: The side a row of the combined inputs comes from (0: left).
_SIDE = "__trickle_side"


@dataclass
class SetAll(Node):
    """``left INTERSECT ALL right`` (``intersect``) or ``left EXCEPT ALL right``."""

    left: Node
    right: Node
    intersect: bool

    @property
    def columns(self) -> list[str]:
        return self.left.columns

    def sources(self) -> set[str]:
        return self.left.sources() | self.right.sources()

    def children(self) -> list[Node]:
        return [self.left, self.right]

    # -- rendering ------------------------------------------------------------------------------

    def _cols(self, qualifier: str = "") -> str:
        return ", ".join(f"{qualifier}`{c}`" for c in self.columns)

    def _copies(self, left: str, right: str) -> str:
        """f(l, r): the output's copies of a row with ``left`` and ``right`` input copies."""
        return f"least({left}, {right})" if self.intersect else f"greatest({left} - {right}, 0)"

    def _tagged(self, node: Node, rows: exp.Query, side: int, weight: str | None) -> str:
        """``rows`` of ``node`` under this operator's column names, tagged with their side (and
        their weight: ``weight`` names it, else each row counts 1)."""
        names = ", ".join(f"`{s}` AS `{d}`" for s, d in zip(node.columns, self.columns))
        return (f"SELECT {names}, {side} AS {_SIDE}, {weight or 'CAST(1 AS BIGINT)'} AS {W} "
                f"FROM ({rows.sql(DIALECT)}) AS __trickle_in")

    def _counts(self, combined: str) -> str:
        """Per distinct row of ``combined`` (tagged, weighted rows): its left and right counts."""
        return (f"SELECT {self._cols()}, SUM(CASE WHEN {_SIDE} = 0 THEN {W} ELSE 0 END) AS __l, "
                f"SUM(CASE WHEN {_SIDE} = 1 THEN {W} ELSE 0 END) AS __r FROM ({combined}) AS __trickle_all "
                f"GROUP BY {self._cols()}")

    def state(self, v: Versions, which: str) -> exp.Query:
        combined = (f"{self._tagged(self.left, self.left.state(v, which), 0, None)} UNION ALL "
                    f"{self._tagged(self.right, self.right.state(v, which), 1, None)}")
        counted = (f"SELECT {self._cols()}, {self._copies('__l', '__r')} AS __n FROM ({self._counts(combined)}) "
                   f"AS __trickle_c WHERE {self._copies('__l', '__r')} > 0")
        return parse_sql(f"SELECT {self._cols('__trickle_k.')} FROM ({counted}) AS __trickle_k "
                         f"LATERAL VIEW explode(sequence(1, __trickle_k.__n)) AS __trickle_copy")

    def delta(self, v: Versions) -> exp.Query:
        # K and the inputs' delta sums ΣΔL, ΣΔR per row
        changes = " UNION ALL ".join(
            self._tagged(node, node.delta(v), side, W) for side, node in ((0, self.left), (1, self.right))
            if node.changed(v)) or self._tagged(self.left, self.left.delta(v), 0, W)
        touched = self._counts(changes)
        # l₀, r₀: the old states restricted to K
        same = " AND ".join(f"__trickle_s.`{c}` <=> __trickle_k.`{c}`" for c in self.columns)
        restricted = " UNION ALL ".join(
            f"SELECT __trickle_s.* FROM ({self._tagged(node, node.state(v, 'old'), side, None)}) AS __trickle_s "
            f"LEFT SEMI JOIN ({touched}) AS __trickle_k ON {same}"
            for side, node in ((0, self.left), (1, self.right)))
        old = self._counts(restricted)
        matched = " AND ".join(f"__trickle_d.`{c}` <=> __trickle_o.`{c}`" for c in self.columns)
        l0, r0 = "COALESCE(__trickle_o.__l, 0)", "COALESCE(__trickle_o.__r, 0)"
        l1, r1 = f"({l0} + __trickle_d.__l)", f"({r0} + __trickle_d.__r)"
        weighted = (f"SELECT {self._cols('__trickle_d.')}, "
                    f"CAST({self._copies(l1, r1)} - {self._copies(l0, r0)} AS BIGINT) AS {W} "
                    f"FROM ({touched}) AS __trickle_d LEFT JOIN ({old}) AS __trickle_o ON {matched}")
        return parse_sql(f"SELECT * FROM ({weighted}) AS __trickle_w WHERE {W} <> 0")

    def explain(self, depth: int = 0) -> list[str]:
        name = "IntersectAll" if self.intersect else "ExceptAll"
        rule = "min(l, r)" if self.intersect else "max(l − r, 0)"
        lines = ["  " * depth + f"{name}  [dual counts: the rows the inputs' deltas touch, {rule} "
                                "copies before and after]"]
        return lines + self.left.explain(depth + 1) + self.right.explain(depth + 1)
