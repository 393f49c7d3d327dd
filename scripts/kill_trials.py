"""Kill trials at length: refreshes killed (SIGKILL) at random moments, retried, checked.

    .venv/bin/python scripts/kill_trials.py --trials 100 [--seed 1] [--sessions connect,classic] [--keep] [--s3]
                                            [--arrangements]

Starts a Spark service for a fresh warehouse, builds ``tests/kill_trials.py``'s scenario,
measures each operation unkilled, then runs the trials: a random operation (refresh, FULL,
REINITIALIZE, atomic group, ALTER, the monotone cycle to its fixpoint) in a child that is a
client of the service or runs its own classic Spark (chosen at random among ``--sessions``),
killed at a random moment within the operation's measured duration (sometimes after it
finished), retried and compared with the oracle.  With ``--s3`` the warehouse is
``s3://trickle/warehouse`` on an s3proxy started for the run (writer leases of 6 s: a killed
writer's tables are taken over by the retry once its lease lapses).  Prints one line per trial and
``N/N exact``; exits 1 if any trial is not exact.
"""
from __future__ import annotations

import argparse
import os
import random
import shutil
import sys
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--trials", type=int, default=100)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--operations", default=",".join(_operations()),
                        help="comma-separated subset of the operations")
    parser.add_argument("--sessions", default="connect,classic",
                        help="comma-separated: the child's Spark, the service (connect) or its own (classic)")
    parser.add_argument("--keep", action="store_true", help="keep the warehouse (its path is printed)")
    parser.add_argument("--s3", action="store_true", help="the warehouse on a local s3proxy")
    parser.add_argument("--arrangements", action="store_true",
                        help="every join delta probes arrangements (arrangement_min_rows 0), kept in the scratch folder")
    args = parser.parse_args()

    from airflow_trickle import Trickle
    from airflow_trickle.spark import service as svc
    from tests import kill_trials

    operations = [o.strip() for o in args.operations.split(",") if o.strip()]
    sessions = [s.strip() for s in args.sessions.split(",") if s.strip()]
    warehouse = scratch = tempfile.mkdtemp(prefix="kill-trials-")
    if args.arrangements:  # this process's retries and every child's refresh
        os.environ["TRICKLE_ARRANGEMENT_MIN_ROWS"] = "0"
        os.environ["TRICKLE_ARRANGEMENT_DIR"] = os.path.join(scratch, "arrangements")
    s3 = None
    if args.s3:
        import json

        from tests.helpers.s3proxy import S3Server

        s3 = S3Server(os.path.join(scratch, "s3proxy")).start()
        warehouse = s3.warehouse
        os.environ["TRICKLE_STORAGE_OPTIONS"] = json.dumps(s3.storage_options)  # the service and the children
        os.environ["TRICKLE_LEASE_SECONDS"] = "6"
    info = svc.start_detached(warehouse, port=0, master="local[2]", settings={"shuffle_partitions": 2})
    rng = random.Random(args.seed)
    failures = mid_operation = 0
    try:
        tr = Trickle(warehouse, remote=info.address, shuffle_partitions=2)
        scenario = kill_trials.setup(tr, warehouse, info.address, "kills")
        durations = {op: kill_trials.measure(tr, scenario, op, rng) for op in operations}
        print("unkilled:", ", ".join(f"{op} {took:.1f}s" for op, took in durations.items()), flush=True)
        started = time.monotonic()
        for number in range(1, args.trials + 1):
            operation, session = rng.choice(operations), rng.choice(sessions)
            kill_after = rng.uniform(0.0, 1.1 * durations[operation])
            result = kill_trials.trial(tr, scenario, operation, kill_after, rng, session=session)
            failures += not result.exact
            mid_operation += result.killed
            print(f"{number:4d} {operation:13s} {session:8s} killed after {kill_after:5.1f}s "
                  f"{'(mid-operation)' if result.killed else '(had finished)':16s} "
                  f"{'exact' if result.exact else 'NOT EXACT'}", flush=True)
            for problem in result.problems:
                print("      " + problem.replace("\n", "\n      "), flush=True)
        exact = args.trials - failures
        print(f"{exact}/{args.trials} exact, {mid_operation} killed mid-operation ({time.monotonic() - started:.0f}s)", flush=True)
        tr.close()
    finally:
        svc.stop_service(warehouse)
        if s3 is not None:
            s3.stop()
        if args.keep:
            print("warehouse:", scratch)
        else:
            shutil.rmtree(scratch, ignore_errors=True)
    return 1 if failures else 0


def _operations():
    from tests.kill_trials import OPERATIONS

    return OPERATIONS


if __name__ == "__main__":
    sys.exit(main())
