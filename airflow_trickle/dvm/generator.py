"""Generator: ``LATERAL VIEW [OUTER] explode / posexplode / inline``, and generators in the SELECT list.

    Δgen(R) = gen(ΔR)      (each input row emits its rows; a change row's weight is carried by each)

A generator is linear, so it needs no term of its own: it stays in the block's SELECT and runs
inside every term of the join's delta, over the change rows and the other inputs' states
(``join.py``).  In the SELECT list of an aggregate it is refused: the aggregate would count the
generated rows of a group before and after, which the planner does not model.
"""
from __future__ import annotations

from sqlglot import exp

from airflow_trickle.sql.parse import DIALECT

#: The generator functions a SELECT list may call.
GENERATORS = (exp.Explode, exp.Posexplode, exp.Inline)


def has_generators(select: exp.Select) -> bool:
    """Whether a generator function stands in ``select``'s SELECT list."""
    return any(e.find(*GENERATORS) for e in select.expressions)


def explain_lines(template: exp.Select, pad: str) -> list[str]:
    """``explain``'s line for each LATERAL VIEW of a block."""
    return [f"{pad}Generate {lateral.sql(DIALECT).strip()}  [per input row: linear]"
            for lateral in template.args.get("laterals") or []]
