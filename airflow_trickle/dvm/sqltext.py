"""Small helpers shared by the appliers' SQL."""
from __future__ import annotations

from sqlglot import exp

from airflow_trickle.model import DUP, ROW_ID
from airflow_trickle.sql.parse import DIALECT


def column_list(columns: list[str], prefix: str = "") -> str:
    return ", ".join(f"{prefix}`{c}`" for c in columns)


def with_identity(select: exp.Select, block) -> exp.Select:
    select = select.copy()
    select.append("expressions", exp.maybe_parse(block.group_hash_sql(), dialect=DIALECT).as_(ROW_ID))
    select.append("expressions", exp.maybe_parse("CAST(1 AS INT)", dialect=DIALECT).as_(DUP))
    return select

