"""The Spark application of a refresh task: ``spark-submit airflow_trickle/jobs/refresh_job.py ...``.

It runs inside the Spark driver (the session comes from spark-submit's configuration), so it
works the same on ``local[*]`` and on a cluster.  For each stream table named, in order, it
makes the catalog match the project (creating the stream table on first use) and refreshes it.
The members of an atomic diamond group are named together (``--group``) and refreshed in
topological order, all or nothing (:mod:`airflow_trickle.refresh.group`).

Each outcome is printed as one ``TRICKLE_RESULT {json}`` line; the Airflow task reads the same
facts back from the catalog history, so nothing depends on capturing the driver's output.

:func:`run` is also what a refresh task calls in its own process over Spark Connect (the Spark
service), so both paths create, align and refresh the same way.
"""
from __future__ import annotations

import argparse
import json
import sys

from airflow_trickle.errors import TrickleError
from airflow_trickle.model import RunMode
from airflow_trickle.project import StreamTableSpec
from airflow_trickle.project.apply import Applied, apply_table

RESULT_PREFIX = "TRICKLE_RESULT "


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="airflow_trickle.jobs.refresh_job", description=__doc__.split("\n")[0])
    parser.add_argument("--spec", required=True, help="JSON: project name, warehouse, settings, stream tables")
    parser.add_argument("--tables", required=True, help="comma-separated stream tables, refreshed in this order")
    parser.add_argument("--mode", default=RunMode.AUTO.value, type=_run_mode, help=RunMode.choices())
    parser.add_argument("--initiated-by", default="AIRFLOW", help="recorded in each history row")
    parser.add_argument("--group", default=None,
                        help="JSON {members, convergence_points} of the atomic group the tables belong to")
    parser.add_argument("--maintain", action="store_true",
                        help="OPTIMIZE and VACUUM the tables (and compact the catalog) instead of refreshing them")
    parser.add_argument("--drop", action="store_true",
                        help="drop the tables (a project's removed tables, with prune) instead of refreshing them")
    parser.add_argument("--retention-hours", type=float, default=None, help="with --maintain: the VACUUM retention")
    return parser.parse_args(argv)


def _run_mode(text: str) -> RunMode:
    try:
        return RunMode.parse(text, what="mode")
    except TrickleError as err:
        raise argparse.ArgumentTypeError(str(err)) from None


def ensure_stream_table(tr, spec: StreamTableSpec, job: dict | None = None) -> Applied | None:
    """Bring ``spec``'s stream table in line with the project before refreshing it: create it
    when the catalog lacks it, ALTER it in place when the project file changed it
    (:func:`~airflow_trickle.project.apply.apply_table`).  ``job``: the job spec (the owning
    project, its file, ``on_change``).  What was done, or None when nothing differed.
    """
    job = job or {}
    return apply_table(tr, spec, owner=(job["project"], job.get("file")) if job.get("project") else None,
                       on_change=job.get("on_change", "apply"))


def run(tr, spec: dict, tables: list[str], *, mode: RunMode, initiated_by: str, group: dict | None = None) -> list[dict]:
    """Ensure and refresh ``tables`` in order; returns one outcome per table refreshed.

    With ``group``, the tables are refreshed all-or-nothing as (part of) that atomic group.
    """
    mode = RunMode.parse(mode, what="mode")
    specs = {s["name"]: StreamTableSpec.from_json(s) for s in spec["stream_tables"]}
    unknown = [name for name in tables if name not in specs]
    if unknown:
        raise TrickleError(f"not part of project {spec['project']!r}", stream_table=unknown[0])
    if group is not None:
        applied = {name: ensure_stream_table(tr, specs[name], spec) for name in tables}
        created = {name: _created(tr, name) for name, done in applied.items() if _was_created(done)}
        result = tr.refresh_group(tables, group=group["members"], convergence_points=group["convergence_points"],
                                  mode=mode.requested, initiated_by=initiated_by)
        outcomes = []
        for r in result.results:
            # a member created just now has nothing newer to refresh: say it was created
            outcome = (created[r.name] if r.name in created and r.action == "NO_DATA" else
                       {"name": r.name, "action": r.action, "status": r.status, "rows_inserted": r.rows_inserted,
                        "rows_deleted": r.rows_deleted, "reason": r.reason})
            outcomes.append({**outcome, **_altered(applied.get(r.name)), "group_epoch": result.epoch})
            print(RESULT_PREFIX + json.dumps(outcomes[-1]), flush=True)
        return outcomes
    outcomes = []
    for name in tables:
        applied = ensure_stream_table(tr, specs[name], spec)
        if _was_created(applied) and mode == RunMode.AUTO:
            outcome = _created(tr, name)
        else:
            result = tr.refresh_stream_table(name, mode.requested, initiated_by=initiated_by)
            outcome = {"name": name, "action": result.action, "status": result.status,
                       "rows_inserted": result.rows_inserted, "rows_deleted": result.rows_deleted,
                       "reason": result.reason, **_altered(applied)}
        print(RESULT_PREFIX + json.dumps(outcome), flush=True)
        outcomes.append(outcome)
    return outcomes


def _was_created(applied: Applied | None) -> bool:
    return applied is not None and applied.done == "CREATED"


def _altered(applied: Applied | None) -> dict:
    """``{"altered": "query, schedule 5m -> 1m"}`` when the project file's change was applied first."""
    return {"altered": applied.detail} if applied is not None and applied.done == "ALTERED" else {}


def _created(tr, name: str) -> dict:
    """The outcome of creating ``name``: its initial population, from its newest history row."""
    record = tr.history(name, limit=1)[0]
    return {"name": name, "action": "CREATED", "status": record.status, "rows_inserted": record.rows_inserted,
            "rows_deleted": record.rows_deleted}


def maintain(tr, tables: list[str], *, retention_hours: float | None = None) -> list[dict]:
    """OPTIMIZE and VACUUM the storage of ``tables`` (those that exist yet) and compact the
    catalog; one outcome per table, printed as for a refresh."""
    from dataclasses import asdict

    registered = {st.name for st in tr.catalog.list()}
    present = [t for t in tables if t in registered]
    if not present:  # nothing created yet (and no name means every table of the warehouse)
        return []
    outcomes = [asdict(done) for done in tr.maintain(present, retention_hours=retention_hours)]
    for outcome in outcomes:
        print(RESULT_PREFIX + json.dumps(outcome), flush=True)
    return outcomes


def drop(tr, tables: list[str]) -> None:
    """Drop ``tables`` in the order given (readers first); one gone already is skipped."""
    for name in tables:
        tr.drop_stream_table(name, if_exists=True)
        print(RESULT_PREFIX + json.dumps({"name": name, "action": "DROPPED", "status": "COMPLETED"}), flush=True)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    spec = json.loads(args.spec)
    tables = [t for t in args.tables.split(",") if t]
    from pyspark.sql import SparkSession

    from airflow_trickle.api import Trickle
    from airflow_trickle.config import TrickleConfig
    from airflow_trickle.spark.engine import SparkEngine

    spark = SparkSession.builder.appName(f"airflow_trickle refresh {args.tables}").getOrCreate()
    SparkEngine(spark).quiet_logs()
    config = TrickleConfig.from_env(warehouse=spec["warehouse"], **(spec.get("settings") or {}))
    tr = Trickle(spec["warehouse"], spark=spark, config=config)
    try:
        tr.sync()
        if args.drop:
            drop(tr, tables)
        elif args.maintain:
            maintain(tr, tables, retention_hours=args.retention_hours)
        else:
            run(tr, spec, tables, mode=args.mode, initiated_by=args.initiated_by,
                group=json.loads(args.group) if args.group else None)
    except TrickleError as err:
        print(f"airflow_trickle: {err}", file=sys.stderr, flush=True)
        return 1
    finally:
        spark.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
