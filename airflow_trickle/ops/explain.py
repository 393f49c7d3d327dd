"""``explain``: what a refresh of a stream table would do, and why (nothing is written).

An entry point over the DVM (operator tree, delta SQL) and the refresh's FULL path.  The only
Spark work is counting, for the change pending since the frontier, the window partitions and
aggregate groups the next refresh would recompute (``dvm.pending``).
"""
from __future__ import annotations

from airflow_trickle.storage.deltalog import latest_version


def explain(env, st) -> dict:
    """Operator tree, strategy, the SQL a refresh would run now, and how much of each window and
    aggregate the pending change reaches (counted; nothing is written)."""
    from airflow_trickle.dvm.base import Unsupported
    from airflow_trickle.dvm.delta_plan import plan_refresh
    from airflow_trickle.dvm.planner import plan
    from airflow_trickle.dvm.reads import describe as describe_reads, statement_reads
    from airflow_trickle.refresh.writers import full_refresh_sql
    from airflow_trickle.refresh.differential import refresh_versions, source_columns
    from airflow_trickle.refresh.local_merge import describe as describe_commit

    current = {d.source_name: latest_version(env.catalog.at(d.source_location)) for d in env.catalog.dependencies(st.name)}
    lines = [f"stream table {st.name}", f"  refresh mode: {st.refresh_mode} (runs {st.effective_mode})"]
    if st.mode_reason:
        lines.append(f"  why FULL: {st.mode_reason}")
    result = {"name": st.name, "mode": st.effective_mode, "reason": st.mode_reason,
              "strategy": st.storage.strategy or "full", "frontier": st.frontier, "current": current}
    if st.effective_mode == "DIFFERENTIAL":
        columns = source_columns(env, st)
        root = plan(st.defining_query, columns)
        tree = root.explain()
        strategy = st.storage.strategy or "bag"
        lines.append(f"  apply strategy: {strategy} ({_STRATEGY_TEXT[strategy]})")
        lines.append("  operator tree:")
        lines += ["    " + line for line in tree]
        # the delta of a refresh that would consume every source's latest change
        probe = {name: version - 1 if version > 0 else 0 for name, version in current.items()}
        probe_st = _with_frontier(st, probe)
        try:  # the MERGE as planned, before a refresh learns anything (a top-K's boundary, say)
            delta_sql, why_not = plan_refresh(probe_st, refresh_versions(env, probe_st, current, columns)).apply_sql(), None
        except Unsupported as err:
            delta_sql, why_not = None, f"cannot maintain differentially: {err}"
        cost = _time_rule(env, st)
        lines.append(f"  cost, measured: {cost}")
        commit = describe_commit(env.catalog.at(st.location), env.config.local_commit_max_rows)
        lines.append(f"  commit: {commit}")
        execution, plan_lines = _execution_plan(env, st, current)
        lines += plan_lines
        result["plan"] = execution
        pending, pending_lines = _pending(env, st, root, current, columns)
        lines += pending_lines
        reads = statement_reads(delta_sql) if delta_sql else []
        if reads:
            lines.append("  reads of the delta SQL (each source by version; Spark scans every state it reads):")
            lines += ["    " + line for line in describe_reads(reads)]
        result.update(tree=tree, delta_sql=delta_sql or why_not, cost=cost, commit=commit, pending=pending,
                      reads=[{"table": r.table, "kind": str(r.kind), "at": r.at, "reduced": r.reduced} for r in reads])
        lines += ["  delta SQL (for the newest version of each source):", f"    {delta_sql or why_not}"]
    else:
        full = full_refresh_sql(env, st, current)
        result.update(tree=[], delta_sql=None, full_sql=full)
        lines += ["  FULL refresh SQL:", f"    {full}"]
    result["text"] = "\n".join(lines)
    return result


def _pending(env, st, root, current: dict[str, int], columns: dict[str, list[str]]) -> tuple[list[dict], list[str]]:
    """The window partitions and aggregate groups the change from the frontier to ``current``
    reaches (what the next refresh recomputes), counted, and explain's lines for them."""
    from pyspark.errors import PySparkException

    from airflow_trickle.dvm.pending import scopes
    from airflow_trickle.refresh.differential import refresh_versions

    if set(st.frontier) != set(current):
        return [], []
    if st.frontier == current:
        return [], ["  pending change: none (the next refresh finds no data)"]
    found, lines = [], ["  pending change (frontier to newest versions), recomputed by the next refresh:"]
    for scope in scopes(root, refresh_versions(env, st, current, columns)):
        sql = scope.count_sql()
        try:
            count = 1 if sql is None else env.spark.sql(sql).first()[0]
        except PySparkException as err:  # e.g. a change feed vacuumed: the refresh will say what it does
            lines.append(f"    {scope.operator}: not counted ({str(err).splitlines()[0]})")
            found.append({"operator": scope.operator, "unit": scope.unit, "count": None})
            continue
        whole = " (the whole input)" if sql is None else ""
        lines.append(f"    {scope.operator}: {count} {scope.unit if count != 1 else scope.unit[:-1]}{whole}")
        found.append({"operator": scope.operator, "unit": scope.unit, "count": count})
    if not found:
        lines.append("    no window or aggregate: nothing is recomputed by partition or group")
    return found, lines


def _execution_plan(env, st, current: dict[str, int]) -> tuple[dict | None, list[str]]:
    """How the next refresh would run the pending change (``refresh/plan.py``): its committer
    and each part's read path, with what they move through the refreshing process and why --
    planned from the Delta logs, nothing read or built -- and the fallbacks of the last one."""
    from airflow_trickle.model import Action
    from airflow_trickle.refresh.arranged import plan_lookups
    from airflow_trickle.refresh.decide import change_estimate, load
    from airflow_trickle.refresh.differential import plan_differential
    from airflow_trickle.refresh.plan import plan_execution

    last = next((r.plan for r in env.catalog.history(st.name, limit=20) if r.plan), None)
    recorded = ["    " + f"{f['part']}: planned {f['planned']}, ran {f['taken']}: {f['cause']}"
                for f in (last or {}).get("fallbacks") or []]
    recorded = (["  fallbacks of the last refresh that ran:"] + recorded) if recorded else []
    if st.frontier == current:
        return None, ["  plan: none (no pending change)"] + recorded
    estimate = change_estimate(env.catalog, st, current, load(env.catalog, st.name).fanout)
    execution = plan_execution(env, st, Action.DIFFERENTIAL, estimate)
    delta, why_not = plan_differential(env, st, current)
    if delta is not None:
        execution = execution.with_parts(plan_lookups(env, delta, []).parts)
    lines = ["  plan of the next refresh (from the Delta logs; nothing read yet):"]
    lines += ["    " + line for line in execution.lines()[1:]] + ([f"    {why_not}"] if why_not else [])
    return execution.to_dict(), lines + recorded


def _time_rule(env, st) -> str:
    """What the cost model's time rule knows of the table's refreshes and would do next."""
    from airflow_trickle.refresh.apply import recent_times
    from airflow_trickle.refresh.time_rule import describe_times

    if st.options.is_strict:
        return "strict: the delta runs whatever it costs"
    return describe_times(recent_times(env, st),
                          max_time_ratio=st.options.ratio("differential_max_time_ratio", env.config))


_STRATEGY_TEXT = {
    "bag": "rows added and removed by content, duplicates numbered; a window in which every changed "
           "source only gained rows is applied as an append (no MERGE) when the query is monotone",
    "algebraic": "COUNT/SUM/AVG state advanced inside the MERGE (t.state + Δ; the target is not read "
                 "separately), MIN/MAX rescanned only when an extreme is deleted",
    "recompute": "only the groups the delta touches are recomputed",
}


def _with_frontier(st, frontier):
    from dataclasses import replace

    return replace(st, frontier=frontier)
