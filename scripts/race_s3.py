"""Two writers racing on an S3 warehouse, at length: what the writer lease prevents.

    .venv/bin/python scripts/race_s3.py --rounds 10 [--no-lease] [--tables 6] [--commit-delay 1.5] [--seconds 12]
    .venv/bin/python scripts/race_s3.py --appends 15 [--no-lease]

Starts s3proxy on 127.0.0.1 and runs ``tests/test_object_storage.py``'s race: two processes
with Sparks of their own write the same stream tables at the same moment (one refreshes them,
the other ALTERs and refreshes them) while the sources change; after each round every table is compared with its query at the frontier its catalog
row records; the workers' Delta commits pass a proxy that holds each log PUT up to
``--commit-delay`` seconds and crosses two writers' PUTs of the same entry
(``tests/helpers/slow_commits.py``).  Prints each difference and ``N problems``; exits 1 if there are any.  With
``--no-lease`` the workers run with ``lease_seconds = 0``: open-source Delta's S3 log store
then lets both write the same log version, and a commit can be replaced.  ``--appends N``
races the plainest writers instead: two processes appending N rows each, one commit a row,
each commit under the table's lease (or not) -- the rows that are missing at the end are the
commits that were replaced.
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
import uuid

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--tables", type=int, default=None, help="how many of the race's stream tables")
    parser.add_argument("--no-lease", action="store_true", help="the workers take no writer lease")
    parser.add_argument("--commit-delay", type=float, default=1.5,
                        help="seconds a Delta log PUT waits for another writer's")
    parser.add_argument("--seconds", type=float, default=12.0, help="how long each round's writers run")
    parser.add_argument("--appends", type=int, default=0,
                        help="instead: two writers append this many rows each to one table, one commit a row")
    args = parser.parse_args()

    from airflow_trickle import Trickle
    from tests import test_object_storage as race_test
    from tests.helpers.s3proxy import S3Server

    with tempfile.TemporaryDirectory(prefix="race-s3-") as scratch, S3Server(scratch) as s3:
        tr = Trickle(warehouse=s3.warehouse, spark_master="local[2]", storage_options=s3.storage_options,
                     lease_seconds=race_test.LEASE_SECONDS, shuffle_partitions=2,
                     spark_conf={"spark.ui.enabled": "false"})
        with race_test.RaceWorkers(s3, lease=not args.no_lease, commit_delay=args.commit_delay) as workers:
            if args.appends:
                expected, found = race_test.append_race(s3, workers, args.appends)
                print(f"appends, lease {'off' if args.no_lease else 'on'}: {found} rows of {expected} "
                      f"({expected - found} lost)", flush=True)
                tr.close()
                return 1 if found != expected else 0
            db = f"race_{uuid.uuid4().hex[:6]}"
            tr.sql(f"CREATE DATABASE {db}")
            started = time.monotonic()
            problems = race_test.race(tr, workers, db, args.rounds, tables=args.tables, seconds=args.seconds)
        for problem in problems:
            print(problem, flush=True)
        print(f"{len(problems)} problems in {args.rounds} rounds, lease {'off' if args.no_lease else 'on'} "
              f"({time.monotonic() - started:.0f}s)", flush=True)
        tr.close()
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
