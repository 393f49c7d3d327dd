"""Golden SQL cases of the DVM compiler: a defining query in, the SQL a refresh runs out.

A fixture file holds cases in the style of sqlglot's optimizer fixtures::

    -- case: filter over one scan
    -- sources: s.o(id, cid, amount)
    -- changed: s.o
    -- output: delta            (delta | merge | merge-beyond | probe | append | full)
    SELECT id FROM s.o WHERE amount > 2;
    <the expected SQL, pretty-printed>;

Sources are at version 3 before the window and, when changed, 5 after it.  The expected SQL is
compared after both sides are pretty-printed by sqlglot (Spark dialect), so it must also parse.
``TRICKLE_UPDATE_GOLDEN=1`` rewrites the file with the SQL the compiler produces now: review
the diff like code.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace

import sqlglot

from airflow_trickle.dvm.apply import choose_layout, full_source_sql
from airflow_trickle.dvm.delta_plan import plan_refresh
from airflow_trickle.dvm.bag import bag_append_sql
from airflow_trickle.dvm.base import Versions
from airflow_trickle.dvm.planner import plan
from airflow_trickle.refresh.full import bag_full_merge_sql, full_merge_sql
from airflow_trickle.sql.parse import DIALECT

#: The view name a refresh gives the materialized top-K candidates, in the golden SQL.
CANDIDATES_VIEW = "__trickle_candidates_0"
#: The view name a refresh gives the stored top-K rows read by delta-rs, in the golden SQL.
STORED_VIEW = "__trickle_stored_0"

OUTPUTS = ("delta", "merge", "merge-beyond", "probe", "candidates", "candidates-over-stored", "probe-over-candidates",
           "merge-over-candidates", "append", "full")
_SOURCE = re.compile(r"\s*([\w.]+)\(([^)]*)\)\s*")


@dataclass
class Case:
    name: str
    sources: dict[str, list[str]]
    changed: list[str]
    output: str
    query: str
    expected: str
    #: The Spark type the layout probe reports for SUM state (``double`` makes sums inexact).
    sum_type: str = "bigint"
    headers: list[str] = field(default_factory=list)


def pretty(sql: str) -> str:
    return sqlglot.transpile(sql, read=DIALECT, write=DIALECT, pretty=True)[0]


def load(path: Path) -> list[Case]:
    cases = []
    for chunk in re.split(r"(?m)^(?=-- case:)", path.read_text()):
        if not chunk.strip().startswith("-- case:"):
            continue
        lines = chunk.strip().splitlines()
        headers = [line for line in lines if line.startswith("-- ")]
        meta = dict(line[3:].split(":", 1) for line in headers)
        body = "\n".join(line for line in lines if not line.startswith("-- "))
        query, expected = (part.strip() for part in body.split(";\n", 1))
        sources = {m.group(1): [c.strip() for c in m.group(2).split(",")]
                   for m in _SOURCE.finditer(meta["sources"]) if m.group(1)}
        cases.append(Case(name=meta["case"].strip(), sources=sources,
                          changed=[c.strip() for c in meta.get("changed", "").split(",") if c.strip()],
                          output=meta.get("output", "delta").strip(), query=query,
                          expected=expected.rstrip(";").strip(), sum_type=meta.get("sum", "bigint").strip(),
                          headers=headers))
    return cases


def compile_case(case: Case) -> str:
    """The SQL the compiler produces for ``case``."""
    old = {name: 3 for name in case.sources}
    new = {name: 5 if name in case.changed else 3 for name in case.sources}
    versions = Versions(old=old, new=new, columns=case.sources, use_cdf={n: True for n in case.sources},
                        consolidate=False)
    node = plan(case.query, case.sources)
    if case.output == "delta":
        return node.delta_sql(versions)

    def types_of(sql: str) -> dict[str, str]:
        names = [e.alias_or_name for e in sqlglot.parse_one(sql, read=DIALECT).expressions]
        return {n: case.sum_type if n.startswith("__trickle_s") else "bigint" for n in names}

    layout = choose_layout(node, Versions(old=new, new=new, columns=case.sources), types_of)
    layout.columns = [(c, "bigint") for c in node.columns]
    st = SimpleNamespace(name="s.st", defining_query=case.query, output_columns=list(node.columns), storage=layout,
                         refresh_seq=6, frontier=old)
    if case.output in ("merge", "merge-beyond"):
        return plan_refresh(st, versions).apply_sql(beyond_boundary=case.output == "merge-beyond")
    if case.output == "merge-over-candidates":  # the candidates computed beforehand into a view
        return plan_refresh(st, versions).apply_sql(candidates=CANDIDATES_VIEW)
    if case.output == "probe":  # a top-K's boundary probe
        return plan_refresh(st, versions).top_k.boundary_probe(st.name, versions)
    if case.output == "probe-over-candidates":
        return plan_refresh(st, versions).probe_sql(versions, CANDIDATES_VIEW)
    if case.output == "candidates":  # what a refresh materializes once for the probe and the MERGE
        return plan_refresh(st, versions).candidates_sql(versions)
    if case.output == "candidates-over-stored":  # the stored rows handed to Spark (read by delta-rs)
        return plan_refresh(st, versions).candidates_sql(versions, STORED_VIEW)
    if case.output == "append":
        return bag_append_sql(st.name, st.output_columns, node.delta_sql(versions), seq=7)
    if case.output == "full":
        at_new = Versions(old=new, new=new, columns=case.sources)
        if not layout.is_keyed:
            return bag_full_merge_sql(st.name, node.state_sql(at_new, "new"), st.output_columns)
        return full_merge_sql(st.name, full_source_sql(st, case.sources, new), st.output_columns + layout.state_names())
    raise ValueError(f"{case.name}: unknown output {case.output!r}; use one of {OUTPUTS}")


def dump(cases: list[Case], produced: dict[str, str]) -> str:
    parts = []
    for case in cases:
        parts.append("\n".join(case.headers) + "\n" + case.query.strip() + ";\n" + pretty(produced[case.name]) + ";\n")
    return "\n".join(parts)
