"""The ``trickle`` command's arguments: one sub-parser per verb, options before or after the verb."""
from __future__ import annotations

import argparse
import os

from airflow_trickle import __version__
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
    parser.add_argument("--version", action="version", version=f"trickle (airflow-trickle) {__version__}")
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
    common.add_argument("--master", default=argparse.SUPPRESS, help="Spark master (default: local[*])")
    common.add_argument("--remote", default=argparse.SUPPRESS, help="Spark service address sc://host:port")
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

    for name, text in (("plan", "what a project file would create, ALTER or remove in its warehouse"),
                       ("apply", "make the warehouse match a project file (create, ALTER in place, drop with --prune)")):
        project = verbs.add_parser(name, help=text)
        project.add_argument("project_file", help="the project's YAML file (its warehouse is the file's)")
        project.add_argument("--prune", action="store_true",
                             help="drop the tables the project owns that the file no longer declares")
        project.add_argument("--adopt", action="store_true",
                             help="take over tables another project owns that this file declares")
        if name == "plan":
            project.add_argument("--offline", action="store_true",
                                 help="start no Spark: a changed query's columns show as unknown")
    verbs.add_parser("schema", help="print the JSON Schema of a project file (for editors and CI)")

    serve = verbs.add_parser("serve", help="run the Spark service of the warehouse (Spark Connect)")
    serve.add_argument("--port", type=int, default=None, help="port to listen on (default 15002; 0: any free port)")
    serve.add_argument("--bind", default=None, metavar="ADDRESS",
                       help="address to listen on (default 127.0.0.1, or $TRICKLE_SERVICE_BIND_ADDRESS); any other "
                            "needs a token")
    serve.add_argument("--token-file", default=None, metavar="FILE",
                       help="file holding the service's shared secret (default: $TRICKLE_SERVICE_TOKEN); clients "
                            "send it")
    what = serve.add_mutually_exclusive_group()
    what.add_argument("--detach", action="store_true", help="start in the background, print the address, return")
    what.add_argument("--stop", action="store_true", help="stop the running service")
    what.add_argument("--status", action="store_true", help="print the running service's address and pid")
    return parser
