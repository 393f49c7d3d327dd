"""Differential view maintenance: operator trees, delta rules, and how deltas are applied.

``plan`` turns a qualified defining query into an operator tree (``plan.py``), ``apply``
turns a tree and two frontiers into one MERGE (``apply.py``).
"""
from __future__ import annotations


def differential_blockers(defining_query: str, sources) -> list[str]:
    """Constructs in ``defining_query`` that DIFFERENTIAL refresh cannot maintain (empty: none)."""
    from airflow_trickle.dvm.plan import unsupported_constructs

    columns = {s.name: [c for c, _ in s.columns] for s in sources.values()} if sources else None
    return unsupported_constructs(defining_query, columns)


def source_columns(env, st) -> dict[str, list[str]]:
    """The visible columns of every source of ``st`` as they are now."""
    from airflow_trickle.names import HIDDEN_PREFIX, quote_name

    columns = {}
    for dep in env.catalog.dependencies(st.name):
        if dep.source_type == "STREAM_TABLE":
            upstream = env.catalog.get(dep.source_name)
            columns[dep.source_name] = list(upstream.output_columns) if upstream else []
        else:
            schema = env.spark.table(quote_name(dep.source_name)).schema
            columns[dep.source_name] = [f.name for f in schema.fields if not f.name.startswith(HIDDEN_PREFIX)]
    return columns


def differential_merge(env, st, current: dict[str, int]) -> tuple[str | None, str | None]:
    """The MERGE applying the change from ``st.frontier`` to ``current``, or ``(None, why not)``."""
    from airflow_trickle.dvm.apply import differential_merge_sql
    from airflow_trickle.dvm.plan import Unsupported, Versions

    if set(st.frontier) != set(current):
        return None, "the set of sources differs from the frontier"
    deps = env.catalog.dependencies(st.name)
    use_cdf = {d.source_name: d.cdc_mode == "cdf" for d in deps}
    columns = source_columns(env, st)
    versions = Versions(old=st.frontier, new=current, columns=columns, use_cdf=use_cdf)
    try:
        return differential_merge_sql(st, versions, columns), None
    except Unsupported as err:
        return None, f"cannot maintain differentially: {err}"


def full_source(env, st, current: dict[str, int]) -> str | None:
    """Rows with identity and state for a FULL refresh of a keyed stream table (None for bags)."""
    if st.storage.get("identity") != "keyed":
        return None
    from airflow_trickle.dvm.apply import full_source_sql
    from airflow_trickle.dvm.plan import Versions

    columns = source_columns(env, st)
    return full_source_sql(st, Versions(old=current, new=current, columns=columns), columns)
