"""``Scan``: a stored source table (a base table or an upstream stream table).

    ΔR = the net change of R over (old, new]: its Change Data Feed (``table_changes``, or the
         same rows a refresh read once and handed in), each insert and post-image +1, each
         delete and pre-image −1; or, where the feed cannot be read, R_new − R_old by two
         time-travel reads (snapshot mode).
"""
from __future__ import annotations

from dataclasses import dataclass

from sqlglot import exp

from airflow_trickle.dvm.base import W, Node, Versions, parse_sql


@dataclass


class Scan(Node):
    """A stored source table (a base table or an upstream stream table)."""

    name: str
    columns: list[str]

    def sources(self) -> set[str]:
        return {self.name}

    def children(self) -> list[Node]:
        return []

    def _cols(self, prefix: str = "") -> str:
        return ", ".join(f"{prefix}`{c}`" for c in self.columns)

    def state(self, v: Versions, which: str) -> exp.Query:
        db, table = self.name.split(".", 1)
        version = v.at(which).get(self.name)
        pinned = f" VERSION AS OF {version}" if version is not None else ""
        return parse_sql(f"SELECT {self._cols()} FROM `{db}`.`{table}`{pinned}")

    def delta(self, v: Versions) -> exp.Query:
        # ΔR: the net change of R in (old, new]; several changes to one row collapse, an
        # insert then delete of a row vanishes (the weights sum to zero).
        read = v.bindings.change(self)
        if read is not None:  # the change feed read once by the refresh (``refresh/arranged.py``)
            changes = f"SELECT {self._cols()}, {W} FROM {read}"
        elif v.use_cdf.get(self.name, True):
            weight = "CASE WHEN _change_type IN ('insert', 'update_postimage') THEN 1 ELSE -1 END"
            changes = (f"SELECT {self._cols()}, {weight} AS {W} FROM "
                       f"table_changes('{self.name}', {v.old[self.name] + 1}, {v.new[self.name]})")
        else:
            changes = (f"SELECT {self._cols()}, 1 AS {W} FROM ({self.state_sql(v, 'new')}) "
                       f"UNION ALL SELECT {self._cols()}, -1 AS {W} FROM ({self.state_sql(v, 'old')})")
        if not v.consolidate:
            # Every consumer is linear in the weights (sums, joins, unions) or consolidates its
            # own input (the bag MERGE, MIN/MAX): a pre- and post-image of an unchanged row
            # cancel there, and the shuffle that would cancel them here is saved.
            return parse_sql(changes)
        return parse_sql(f"SELECT {self._cols()}, SUM({W}) AS {W} FROM ({changes}) AS __c "
                         f"GROUP BY {self._cols()} HAVING SUM({W}) <> 0")

    def explain(self, depth: int = 0) -> list[str]:
        return ["  " * depth + f"Scan {self.name}  [delta: net change feed]"]
