"""The ``trickle`` command line: the Python API's verbs, for shells and scripts.

    trickle --warehouse DIR create shop.totals --query "SELECT ..." --schedule 5m
    trickle --warehouse DIR refresh shop.totals --mode FULL
    trickle --warehouse DIR status --json
    trickle --warehouse DIR check            (exit 1 when catalog and data disagree)
    trickle --warehouse DIR health           (exit 1 when a reader's change feed is at risk)
    trickle --warehouse DIR maintain [NAME...] [--retention-hours H]
    trickle --warehouse DIR repair [--from-storage]
    trickle --warehouse DIR serve [--port 15002] [--detach | --stop | --status]
    trickle plan PROJECT.yaml [--json]        (what the file would create, ALTER or remove)
    trickle apply PROJECT.yaml [--prune]      (make the warehouse match the file)
    trickle schema                            (the project file's JSON Schema)
    trickle repair --warehouse s3://bucket/wh --storage-option aws_region=eu-west-1

``--warehouse`` (a directory or URI; before the verb or after it) defaults to
``$TRICKLE_WAREHOUSE``; ``--storage-option KEY=VALUE`` (repeatable) and
``$TRICKLE_STORAGE_OPTIONS`` (JSON) say how to reach an object store.  When a Spark service runs for the
warehouse (``trickle serve``), every verb works through it (a second, no JVM start);
``--remote sc://host:port`` (or ``$TRICKLE_REMOTE``) names a service explicitly, ``--embedded``
starts a Spark of its own.  Output is a table for people, JSON with ``--json``.  Errors print
one line on stderr naming the stream table and the cause, and exit 1 (2: the command line
itself is wrong).  An unknown warehouse or stream table is refused from the catalog (delta-rs)
before a JVM starts or anything is created.
"""
from __future__ import annotations

import sys

from airflow_trickle.cli.output import format_table
from airflow_trickle.cli.parser import build_parser
from airflow_trickle.cli.project_verbs import PROJECT_VERBS, run_project_verb
from airflow_trickle.cli.verbs import _run
from airflow_trickle.errors import TrickleError

__all__ = ["build_parser", "format_table", "main"]


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    args.storage_option = list(args.storage_option or []) + list(getattr(args, "verb_storage_option", None) or [])
    if not args.warehouse and args.verb not in PROJECT_VERBS:
        print("trickle: no warehouse: pass --warehouse DIR or set TRICKLE_WAREHOUSE", file=sys.stderr)
        return 2
    try:
        return run_project_verb(args) if args.verb in PROJECT_VERBS else _run(args)
    except TrickleError as err:  # refused or failed work: 1 (argparse's usage errors are 2)
        print(f"trickle: error: {err}", file=sys.stderr)
        return 1
