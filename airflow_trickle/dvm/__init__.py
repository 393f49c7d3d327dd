"""Differential view maintenance: operator trees and their delta SQL."""
from __future__ import annotations


def differential_blockers(defining_query: str, sources) -> list[str]:
    """Constructs in ``defining_query`` that DIFFERENTIAL refresh cannot maintain (empty: none)."""
    from airflow_trickle.dvm.plan import unsupported_constructs

    return unsupported_constructs(defining_query)
