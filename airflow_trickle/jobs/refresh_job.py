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

from airflow_trickle.errors import DefinitionError, TrickleError
from airflow_trickle.model import RunMode
from airflow_trickle.options import TableOptions
from airflow_trickle.project import StreamTableSpec

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
    parser.add_argument("--retention-hours", type=float, default=None, help="with --maintain: the VACUUM retention")
    return parser.parse_args(argv)


def _run_mode(text: str) -> RunMode:
    try:
        return RunMode.parse(text, what="mode")
    except TrickleError as err:
        raise argparse.ArgumentTypeError(str(err)) from None


def ensure_stream_table(tr, spec: StreamTableSpec) -> bool:
    """Create ``spec``'s stream table when the catalog lacks it; align schedule and options.

    Returns True when it was created (and therefore already populated by its initial refresh).
    A project whose query or refresh mode differs from the registered stream table is refused:
    changing a defining query in place is not supported, and silently keeping the old one
    would serve data that does not match the project.
    """
    current = tr.catalog.get(spec.name)
    options = spec.options()
    if current is None:
        tr.create_stream_table(spec.name, spec.query, schedule=spec.schedule, refresh_mode=spec.refresh_mode,
                               options=options)
        return True
    if current.original_query.strip() != spec.query.strip() or current.refresh_mode != spec.refresh_mode:
        what = "defining query" if current.original_query.strip() != spec.query.strip() else "refresh mode"
        raise DefinitionError(
            f"the project's {what} differs from the registered stream table's",
            stream_table=spec.name,
            hint=f"changing it in place is not supported: run `trickle drop {spec.name} --cascade` "
                 "and the next run recreates it from the project")
    if current.options.clustering and not spec.cluster_by:  # taken out of the project: turned off
        options["cluster_by"] = []
    wanted = current.options.merged(TableOptions.parse(options, stream_table=spec.name))
    if current.schedule != spec.schedule or wanted != current.options:
        tr.alter_stream_table(spec.name, schedule=spec.schedule, options=options)
    return False


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
        created = {name: _created(tr, name) for name in tables if ensure_stream_table(tr, specs[name])}
        result = tr.refresh_group(tables, group=group["members"], convergence_points=group["convergence_points"],
                                  mode=mode.requested, initiated_by=initiated_by)
        outcomes = []
        for r in result.results:
            # a member created just now has nothing newer to refresh: say it was created
            outcome = (created[r.name] if r.name in created and r.action == "NO_DATA" else
                       {"name": r.name, "action": r.action, "status": r.status, "rows_inserted": r.rows_inserted,
                        "rows_deleted": r.rows_deleted, "reason": r.reason})
            outcomes.append({**outcome, "group_epoch": result.epoch})
            print(RESULT_PREFIX + json.dumps(outcomes[-1]), flush=True)
        return outcomes
    outcomes = []
    for name in tables:
        created = ensure_stream_table(tr, specs[name])
        if created and mode == RunMode.AUTO:
            outcome = _created(tr, name)
        else:
            result = tr.refresh_stream_table(name, mode.requested, initiated_by=initiated_by)
            outcome = {"name": name, "action": result.action, "status": result.status,
                       "rows_inserted": result.rows_inserted, "rows_deleted": result.rows_deleted,
                       "reason": result.reason}
        print(RESULT_PREFIX + json.dumps(outcome), flush=True)
        outcomes.append(outcome)
    return outcomes


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
        if args.maintain:
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
