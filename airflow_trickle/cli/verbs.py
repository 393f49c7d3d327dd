"""The verbs of the ``trickle`` command that work on a warehouse, through the Python API."""
from __future__ import annotations

import json
import os
import sys
from dataclasses import asdict
from datetime import datetime, timezone

from airflow_trickle.cli.output import _arrangements_line, _emit, _history_row
from airflow_trickle.config import TrickleConfig
from airflow_trickle.errors import StreamTableNotFoundError, TrickleError
from airflow_trickle.names import qualify_name


def _serve(args) -> int:
    from airflow_trickle.spark import service

    if args.stop:
        stopped = service.stop_service(args.warehouse)
        if stopped is None and not args.json:
            print(f"no Spark service runs for warehouse {args.warehouse}", file=sys.stderr)
        else:
            _emit(args, [{"stopped": stopped.address if stopped else None, "pid": stopped.pid if stopped else None}])
        return 0 if stopped else 1
    if args.status:  # also a readiness check: 0 only while the service answers
        running = service.read_service(args.warehouse)
        answering = running is not None and service.reachable(running.address)
        if running is None and not args.json:
            print(f"no Spark service runs for warehouse {args.warehouse}", file=sys.stderr)
        else:
            _emit(args, [{**asdict(running), "answering": answering,
                          "started_at": datetime.fromtimestamp(running.started_at, timezone.utc)}] if running else [])
        return 0 if answering else 1
    port = service.DEFAULT_PORT if args.port is None else args.port
    settings = {key: value for key, value in (("storage_options", _storage_options(args)),
                                              ("service_bind_address", args.bind),
                                              ("service_token", _token(args.token_file))) if value}
    service.check_binding(TrickleConfig.from_env(warehouse=args.warehouse, **settings))  # before anything starts
    if args.detach:
        info = service.start_detached(args.warehouse, port=port, master=args.master, settings=settings)
        _emit(args, [asdict(info)])
        return 0
    config = TrickleConfig.from_env(warehouse=args.warehouse, **settings)
    return service.serve(args.warehouse, config=config, port=port, master=args.master,
                         ready=lambda info: print(info.address, flush=True))


def _token(path: str | None) -> str | None:
    """The service's token from ``--token-file`` (a secret is never given on a command line)."""
    if path is None:
        return None
    try:
        token = open(path, encoding="utf-8").read().strip()
    except OSError as err:
        raise TrickleError(f"--token-file {path}: {err.strerror}") from None
    if not token:
        raise TrickleError(f"--token-file {path} is empty")
    return token


def _storage_options(args) -> dict[str, str]:
    """``--storage-option KEY=VALUE`` (over ``$TRICKLE_STORAGE_OPTIONS``)."""
    try:
        options = json.loads(os.environ.get("TRICKLE_STORAGE_OPTIONS") or "{}")
    except ValueError as err:
        raise TrickleError(f"$TRICKLE_STORAGE_OPTIONS is not JSON: {err}") from None
    if not isinstance(options, dict):
        raise TrickleError("$TRICKLE_STORAGE_OPTIONS must be a JSON object of storage options")
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
        _refuse_unknown(tr, args)
        return _verb(tr, args)
    finally:
        if tr.remote is not None:
            tr.close()


#: The verbs that read stream tables the catalog must already hold.
CATALOG_VERBS = {"status", "history", "diamonds", "explain", "refresh", "drop", "alter", "health", "maintain"}


def _refuse_unknown(tr, args) -> None:
    """A mistyped warehouse or stream table is refused from the catalog (delta-rs), before a JVM
    starts and before anything is created there."""
    if args.verb not in CATALOG_VERBS:
        return
    if not tr.catalog.exists():
        raise TrickleError(f"warehouse {args.warehouse} has no stream tables (no catalog under it)",
                           hint="check --warehouse / $TRICKLE_WAREHOUSE; `trickle create` makes the first one")
    name = getattr(args, "name", None)
    if name and not (args.verb == "drop" and args.if_exists) and tr.catalog.get(qualify_name(name)) is None:
        raise StreamTableNotFoundError("no such stream table", stream_table=qualify_name(name),
                                       hint="`trickle status` lists the stream tables of the warehouse")


def _query_text(args) -> str:
    if args.query is not None:
        return args.query
    try:
        with open(args.query_file, encoding="utf-8") as file:
            return file.read()
    except OSError as err:
        raise TrickleError(f"cannot read --query-file {args.query_file!r}: {err.strerror}",
                           stream_table=args.name) from None


def _verb(tr, args) -> int:
    if args.verb == "create":
        query = _query_text(args)
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
                       "duration_ms", "phases", "plan", "start_time", "initiated_by", "reason", "error_message"])
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
