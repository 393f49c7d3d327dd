"""The ``trickle`` command line: the Python API's verbs, for shells and scripts.

    trickle --warehouse DIR create shop.totals --query "SELECT ..." --schedule 5m
    trickle --warehouse DIR refresh shop.totals --mode FULL
    trickle --warehouse DIR status --json
    trickle --warehouse DIR check            (exit 1 when catalog and data disagree)
    trickle --warehouse DIR health           (exit 1 when a reader's change feed is at risk)
    trickle --warehouse DIR maintain [NAME...] [--retention-hours H]
    trickle --warehouse DIR repair [--from-storage]
    trickle --warehouse DIR serve [--port 15002] [--detach | --stop | --status]
    trickle repair --warehouse s3://bucket/wh --storage-option aws_region=eu-west-1

``--warehouse`` (a directory or URI; before the verb or after it) defaults to
``$TRICKLE_WAREHOUSE``; ``--storage-option KEY=VALUE`` (repeatable) and
``$TRICKLE_STORAGE_OPTIONS`` (JSON) say how to reach an object store.  When a Spark service runs for the
warehouse (``trickle serve``), every verb works through it (a second, no JVM start);
``--remote sc://host:port`` (or ``$TRICKLE_REMOTE``) names a service explicitly, ``--embedded``
starts a Spark of its own.  Output is a table for people, JSON with ``--json``.  Errors print
one line naming the stream table and the cause, and exit 2.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
from dataclasses import asdict, is_dataclass
from datetime import datetime

from airflow_trickle.errors import TrickleError
from airflow_trickle.model import RefreshMode, RunMode, Status



def _word(kind, what: str):
    """An argparse type: one of ``kind``'s words (any case), refused before any Spark starts."""

    def parse(text: str):
        try:
            return kind.parse(text, what=what)
        except TrickleError as err:
            raise argparse.ArgumentTypeError(str(err)) from None

    return parse

def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="trickle", description="Stream tables for the lakehouse.")
    parser.add_argument("--warehouse", default=os.environ.get("TRICKLE_WAREHOUSE"),
                        help="warehouse directory or URI, e.g. s3://bucket/prefix (default: $TRICKLE_WAREHOUSE); "
                             "also accepted after the verb")
    parser.add_argument("--storage-option", action="append", default=[], dest="storage_option", metavar="KEY=VALUE",
                        help="how to reach an object-store warehouse: aws_endpoint=..., aws_region=... (repeatable; "
                             "also $TRICKLE_STORAGE_OPTIONS as JSON; credentials best from the AWS environment)")
    parser.add_argument("--master", default=None, help="Spark master (default: local[*])")
    parser.add_argument("--remote", default=os.environ.get("TRICKLE_REMOTE"),
                        help="Spark service address sc://host:port (default: $TRICKLE_REMOTE, else the service "
                             "running for the warehouse, else an embedded Spark)")
    parser.add_argument("--embedded", action="store_true", help="start an embedded Spark even if a service runs")
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--json", action="store_true", default=argparse.SUPPRESS, help="print JSON instead of a table")
    common.add_argument("--warehouse", default=argparse.SUPPRESS, help="warehouse directory or URI "
                        "(default: $TRICKLE_WAREHOUSE)")
    common.add_argument("--storage-option", action="append", metavar="KEY=VALUE", dest="verb_storage_option",
                        default=argparse.SUPPRESS, help="how to reach an object-store warehouse (repeatable)")
    verbs = parser.add_subparsers(dest="verb", required=True)
    add_verb = verbs.add_parser

    def verb(name: str, **kwargs):
        return add_verb(name, parents=[common], **kwargs)

    verbs.add_parser = verb

    create = verbs.add_parser("create", help="create a stream table")
    create.add_argument("name")
    source = create.add_mutually_exclusive_group(required=True)
    source.add_argument("--query", help="the defining query")
    source.add_argument("--query-file", help="file holding the defining query")
    create.add_argument("--schedule", default=None,
                        help="duration (30s, 5m, 1h30m), cron, or on_commit (refreshed when a source commits, "
                             "by a project's on-commit DAG in Airflow); 'none' = CALCULATED")
    create.add_argument("--mode", default=None, type=_word(RefreshMode, "refresh mode"),
                        help="DIFFERENTIAL (default), FULL or AUTO")
    create.add_argument("--no-initialize", action="store_true", help="create empty; populate on first refresh")

    drop = verbs.add_parser("drop", help="drop a stream table")
    drop.add_argument("name")
    drop.add_argument("--if-exists", action="store_true")
    drop.add_argument("--cascade", action="store_true", help="also drop stream tables that read it")

    refresh = verbs.add_parser("refresh", help="refresh a stream table now")
    refresh.add_argument("name")
    refresh.add_argument("--mode", default=None, type=_word(RunMode, "refresh mode"),
                         help="AUTO (default), FULL, DIFFERENTIAL or REINITIALIZE")

    status = verbs.add_parser("status", help="summary of stream tables")
    status.add_argument("name", nargs="?")

    alter = verbs.add_parser("alter", help="change query, schedule, refresh mode or status")
    alter.add_argument("name")
    alter.add_argument("--query", help="a new defining query (the table is rebuilt)")
    alter.add_argument("--schedule", help="duration, cron, on_commit, or none (CALCULATED)")
    alter.add_argument("--mode", type=_word(RefreshMode, "refresh mode"), help="DIFFERENTIAL, FULL or AUTO")
    alter.add_argument("--status", type=_word(Status, "status"), help="ACTIVE or SUSPENDED")

    history = verbs.add_parser("history", help="refresh history")
    history.add_argument("name", nargs="?")
    history.add_argument("--limit", type=int, default=20)

    verbs.add_parser("diamonds", help="diamond groups: members, convergence points, consistency, epochs")

    explain = verbs.add_parser("explain", help="operator tree and delta SQL of a stream table")
    explain.add_argument("name")

    maintain = verbs.add_parser("maintain", help="compact and vacuum storage and catalog tables, keeping what readers need")
    maintain.add_argument("names", nargs="*", help="stream tables (default: all)")
    maintain.add_argument("--retention-hours", type=float, default=None,
                          help="VACUUM retention to aim for (default: each table's, 7 days); stretched for readers")
    verbs.add_parser("health", help="change-feed health of every source per reader; exit 1 when a reader is at risk")
    verbs.add_parser("check", help="compare the catalog with the storage tables and sources; exit 1 on a problem")
    repair = verbs.add_parser("repair", help="rebuild lost catalog rows and frontiers from the storage tables")
    repair.add_argument("--from-storage", action="store_true",
                        help="where catalog and storage disagree on a definition, take the storage table's")

    sql = verbs.add_parser("sql", help="run Spark SQL in the warehouse (e.g. to create sources)")
    sql.add_argument("statement")

    serve = verbs.add_parser("serve", help="run the Spark service of the warehouse (Spark Connect)")
    serve.add_argument("--port", type=int, default=None, help="port to listen on (default 15002; 0: any free port)")
    what = serve.add_mutually_exclusive_group()
    what.add_argument("--detach", action="store_true", help="start in the background, print the address, return")
    what.add_argument("--stop", action="store_true", help="stop the running service")
    what.add_argument("--status", action="store_true", help="print the running service's address and pid")
    return parser


def _rows_text(kept: dict) -> str:
    """``6,001,215 rows at 31.2 bytes each, `` for an arrangement that records its rows."""
    if kept.get("held_rows") is None:
        return ""
    return f"{kept['held_rows']:,} rows at {kept['bytes_per_row']:g} bytes each, "


def _arrangements_line(tr) -> str:
    """``health``'s last line: the join arrangements kept here, and their bound."""
    from airflow_trickle.refresh.arranged import arrangements_of

    kept = arrangements_of(tr.config)
    if kept is None:
        return "join arrangements: off (arrangement_max_bytes 0)"
    rows = kept.kept()
    used = sum(r["bytes"] for r in rows)
    return (f"join arrangements: {len(rows)} kept in {kept.root}, {used / 2**20:.1f} MiB of "
            f"{kept.max_bytes / 2**20:.0f} MiB" + "".join(f"\n  {r['table']} by {r['key']} ({r['columns']}): "
                                                         f"versions {r['versions']}, {_rows_text(r)}{r['bytes'] / 2**20:.1f} MiB, "
                                                         f"used {r['last_used']}" for r in rows))


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    args.storage_option = list(args.storage_option or []) + list(getattr(args, "verb_storage_option", None) or [])
    if not args.warehouse:
        print("trickle: no warehouse: pass --warehouse DIR or set TRICKLE_WAREHOUSE", file=sys.stderr)
        return 2
    try:
        return _run(args)
    except TrickleError as err:
        print(f"trickle: error: {err}", file=sys.stderr)
        return 2


def _serve(args) -> int:
    from airflow_trickle.spark import service

    if args.stop:
        stopped = service.stop_service(args.warehouse)
        if stopped is None and not args.json:
            print(f"no Spark service runs for warehouse {args.warehouse}", file=sys.stderr)
        else:
            _emit(args, [{"stopped": stopped.address if stopped else None, "pid": stopped.pid if stopped else None}])
        return 0 if stopped else 1
    if args.status:
        running = service.read_service(args.warehouse)
        if running is None and not args.json:
            print(f"no Spark service runs for warehouse {args.warehouse}", file=sys.stderr)
        else:
            _emit(args, [asdict(running)] if running else [])
        return 0 if running else 1
    port = service.DEFAULT_PORT if args.port is None else args.port
    options = _storage_options(args)
    if args.detach:
        info = service.start_detached(args.warehouse, port=port, master=args.master,
                                      settings={"storage_options": options} if options else None)
        _emit(args, [asdict(info)])
        return 0
    from airflow_trickle.config import TrickleConfig

    config = TrickleConfig.from_env(warehouse=args.warehouse, **({"storage_options": options} if options else {}))
    return service.serve(args.warehouse, config=config, port=port, master=args.master,
                         ready=lambda info: print(info.address, flush=True))


def _storage_options(args) -> dict[str, str]:
    """``--storage-option KEY=VALUE`` (over ``$TRICKLE_STORAGE_OPTIONS``)."""
    import json as _json

    options = _json.loads(os.environ.get("TRICKLE_STORAGE_OPTIONS") or "{}")
    for item in args.storage_option or []:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise TrickleError(f"--storage-option wants KEY=VALUE, not {item!r}")
        options[key.strip()] = value
    return options


def _remote(args) -> str | None:
    """The service to work through: ``--remote``, else the one running for the warehouse."""
    if args.embedded:
        return None
    if args.remote:
        return args.remote
    from airflow_trickle.spark.service import read_service

    running = read_service(args.warehouse)
    return running.address if running else None


def _run(args) -> int:
    from airflow_trickle.api import Trickle

    if args.verb == "serve":
        return _serve(args)
    settings = {"spark_master": args.master} if args.master else {}
    options = _storage_options(args)
    if options:
        settings["storage_options"] = options
    tr = Trickle(warehouse=args.warehouse, remote=_remote(args), **settings)
    try:
        return _verb(tr, args)
    finally:
        if tr.remote is not None:
            tr.close()


def _verb(tr, args) -> int:
    if args.verb == "create":
        query = args.query if args.query is not None else open(args.query_file, encoding="utf-8").read()
        kwargs = {}
        if args.schedule is not None:
            kwargs["schedule"] = None if args.schedule.lower() in ("none", "") else args.schedule
        st = tr.create_stream_table(args.name, query, refresh_mode=args.mode, initialize=not args.no_initialize, **kwargs)
        _emit(args, tr.status(st.name))
    elif args.verb == "drop":
        tr.drop_stream_table(args.name, if_exists=args.if_exists, cascade=args.cascade)
        _emit(args, [{"dropped": args.name}])
    elif args.verb == "refresh":
        _emit(args, [asdict(tr.refresh_stream_table(args.name, mode=args.mode))],
              columns=["name", "action", "status", "rows_inserted", "rows_deleted", "duration_ms", "reason"])
    elif args.verb == "status":
        found = tr.status(args.name)
        _emit(args, found, columns=["name", "status", "effective_mode", "schedule", "is_populated", "staleness_s",
                                    "freshness_target_s", "consecutive_errors", "frontier",
                                    *(["watcher"] if any("watcher" in r for r in found) else [])])
    elif args.verb == "alter":
        kwargs = {}
        if args.schedule is not None:
            kwargs["schedule"] = None if args.schedule.lower() == "none" else args.schedule
        if args.mode is not None:
            kwargs["refresh_mode"] = args.mode
        if args.status is not None:
            kwargs["status"] = args.status
        if args.query is not None:
            kwargs["query"] = args.query
        tr.alter_stream_table(args.name, **kwargs)
        _emit(args, tr.status(args.name))
    elif args.verb == "history":
        _emit(args, [_history_row(r, text=not args.json) for r in tr.history(args.name, args.limit)],
              columns=["st_name", "action", "status", "changed source rows", "rows_inserted", "rows_deleted",
                       "touched est/actual",
                       "duration_ms", "phases", "start_time", "initiated_by", "reason", "error_message"])
    elif args.verb == "diamonds":
        _emit(args, tr.diamond_groups(),
              columns=["name", "consistency", "convergence_points", "schedule_policy", "epoch", "last_status"])
    elif args.verb == "explain":
        explanation = tr.explain(args.name)
        if args.json:
            print(json.dumps(explanation, indent=2, default=str))
        else:
            print(explanation["text"])
    elif args.verb == "maintain":
        done = tr.maintain(args.names or None, retention_hours=args.retention_hours)
        _emit(args, [asdict(m) for m in done],
              columns=["table", "active_files_before", "active_files_after", "files_on_disk_before",
                       "files_on_disk_after", "retained_hours", "note"])
    elif args.verb == "health":
        from airflow_trickle.ops.health import duration_text as _duration

        report = tr.health()
        rows = [{"source": s.source, "change_feed": "on" if s.change_feed else "off",
                 "versions": f"{s.oldest_log_version}..{s.latest_version}",
                 "retention": _duration(s.deleted_file_retention), "reader": r.stream_table,
                 "frontier": r.frontier_version, "status": r.status,
                 "time_left": _duration(r.time_left) if r.time_left is not None else None, "message": r.message}
                for s in report for r in s.readers]
        _emit(args, rows, columns=["source", "change_feed", "versions", "retention", "reader", "frontier", "status",
                                   "time_left", "message"])
        if not args.json:
            print(_arrangements_line(tr))
        return 0 if all(s.status == "OK" for s in report) else 1
    elif args.verb == "check":
        findings = tr.check()
        if findings or args.json:
            _emit(args, [asdict(f) for f in findings], columns=["stream_table", "severity", "problem", "fix"])
        else:
            print("catalog, storage tables and sources agree")
        return 1 if findings else 0
    elif args.verb == "repair":
        actions = tr.repair(from_storage=args.from_storage)
        if actions or args.json:
            _emit(args, actions, columns=["stream_table", "action", "refresh_seq", "frontier"])
        else:
            print("nothing to repair")
    elif args.verb == "sql":
        frame = tr.sql(args.statement)
        rows = [row.asDict(recursive=True) for row in frame.limit(1000).collect()] if frame.columns else []
        _emit(args, rows, columns=frame.columns or None)
    return 0


def _history_row(record, *, text: bool) -> dict:
    """A history record; for people, with the phases on one line, the source rows the window
    changed, and the cost model's estimate of touched rows next to the rows the refresh did touch."""
    from airflow_trickle.refresh.phases import format_phases

    row = asdict(record)
    if text:
        phases = dict(record.phases or {})
        actual = phases.pop("rows_touched", None)
        changed = phases.pop("changed_rows", None)
        phases.pop("planner", None)
        crossed = phases.pop("beyond_boundary", None)
        if changed is not None:
            row["changed source rows"] = changed
        if record.rows_estimated is not None or actual is not None:
            row["touched est/actual"] = f"{_cell(record.rows_estimated) or '?'}/{_cell(actual) or '?'}"
        row["phases"] = format_phases(phases) + (" · a row left the top-K: recomputed from the query" if crossed else "")
    return row


def _emit(args, rows: list[dict], columns: list[str] | None = None) -> None:
    if args.json:
        print(json.dumps(rows, indent=2, default=_jsonable))
        return
    print(format_table(rows, columns))


def _jsonable(value):
    if isinstance(value, datetime):
        return value.isoformat()
    if is_dataclass(value):
        return asdict(value)
    return str(value)


def format_table(rows: list[dict], columns: list[str] | None = None) -> str:
    """A plain text table, one row per dict, for people reading a terminal."""
    if not rows:
        return "(no rows)"
    columns = columns or list(rows[0].keys())
    cells = [[_cell(row.get(col)) for col in columns] for row in rows]
    widths = [max(len(col), *(len(r[i]) for r in cells)) for i, col in enumerate(columns)]
    line = "  ".join(col.ljust(w) for col, w in zip(columns, widths))
    rule = "  ".join("-" * w for w in widths)
    body = ["  ".join(c.ljust(w) for c, w in zip(r, widths)) for r in cells]
    return "\n".join([line, rule, *body])


def _cell(value) -> str:
    if value is None:
        return ""
    if isinstance(value, datetime):
        return value.strftime("%Y-%m-%d %H:%M:%S")
    if isinstance(value, (dict, list)):
        return json.dumps(value, default=str)
    text = str(value)
    return text if len(text) <= 100 else text[:97] + "..."


if __name__ == "__main__":
    sys.exit(main())
