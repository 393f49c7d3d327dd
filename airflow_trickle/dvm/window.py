"""Window: window functions in a block's SELECT list, recomputed by partition.

    K = the PARTITION BY values of Δinput (common to every window of the SELECT)
    Δ = −ω(old input | K) + ω(new input | K)

A window function sees only its partition, so the partitions holding a changed row are
recomputed before and after.  With no PARTITION BY common to every window the whole input is
one partition, recomputed before and after.
"""
from __future__ import annotations

from sqlglot import exp

from airflow_trickle.dvm.base import W, Versions, union_all
from airflow_trickle.dvm.join import semi_join


def window_delta(block, v: Versions) -> exp.Query:
    """Δ = −ω(old input | K) + ω(new input | K), K the partitions Δinput touches."""
    keys = block.changed_input_keys(v, block.window_keys) if block.window_keys else None
    sides = []
    for which, sign in (("old", -1), ("new", 1)):
        select = block.template.copy()
        select.append("expressions", exp.cast(exp.Literal.number(sign), "BIGINT").as_(W))
        if keys is not None:
            select = semi_join(select, block.window_keys, keys)
        sides.append(block.render(select, [node.state(v, which) for _, node in block.items]))
    return union_all(sides)
