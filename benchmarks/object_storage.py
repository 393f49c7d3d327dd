"""The same refreshes on a local warehouse and on an S3 warehouse (s3proxy on 127.0.0.1), side by side.

    python benchmarks/object_storage.py [--rows 1000000] [--change 0.001] [--repeat 3]

``differential_vs_full.py``'s workload -- an aggregate over a fact ⋈ dimension join, kept as a
DIFFERENTIAL and a FULL stream table and as a plain ``INSERT OVERWRITE`` table -- built once
in a local warehouse and once in ``s3://trickle/warehouse`` on s3proxy (objects in a local
directory, so the difference is the store's requests, not a network), each with an embedded
Spark of its own started fresh.  Each round changes ``--change`` of the fact rows, then times
the three; the DIFFERENTIAL refresh's phases are printed as medians for both warehouses, and
the count of HTTP requests the S3 side made is not available from here -- the phases show where
the request latency lands.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)


def measure(warehouse: str, storage_options: dict, rows: int, changed: int, repeat: int) -> dict:
    from airflow_trickle import Trickle
    from benchmarks.differential_vs_full import build, change, check, median_phases, timed_plain, timed_refresh

    tr = Trickle(warehouse=warehouse, spark_master="local[2]", shuffle_partitions=4, storage_options=storage_options,
                 spark_conf={"spark.driver.memory": "4g"})
    db = "bench"
    started = time.perf_counter()
    build(tr, db, rows)
    built = time.perf_counter() - started
    diffs, fulls, plains, results = [], [], [], []
    for round_no in range(repeat + 1):
        change(tr, db, rows, changed, round_no)
        diff, result = timed_refresh(tr, f"{db}.agg_differential", "DIFFERENTIAL")
        full, _ = timed_refresh(tr, f"{db}.agg_full", "FULL")
        plain = timed_plain(tr, db)
        if round_no:  # the first round warms the JVM and the store's connections
            diffs.append(diff)
            fulls.append(full)
            plains.append(plain)
            results.append(result)
    check(tr, db)
    tr.close()
    return {"built": built, "diff": statistics.median(diffs), "full": statistics.median(fulls),
            "plain": statistics.median(plains), "phases": median_phases(results)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--change", type=float, default=0.001)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--only", choices=("local", "s3"), default=None, help="one side (run by the script itself)")
    args = parser.parse_args()
    changed = max(int(args.rows * args.change), 3)
    if args.only is None:  # each side in a process of its own: a fresh JVM, no shared caches
        import json
        import subprocess

        sides = {}
        for side in ("local", "s3"):
            out = subprocess.run([sys.executable, __file__, "--rows", str(args.rows), "--change", str(args.change),
                                  "--repeat", str(args.repeat), "--only", side], capture_output=True, text=True,
                                 cwd=REPO, env={**os.environ, "PYTHONPATH": REPO})
            line = [x for x in out.stdout.splitlines() if x.startswith("{")]
            if out.returncode or not line:
                print(out.stdout[-2000:], out.stderr[-3000:], file=sys.stderr)
                return 1
            sides[side] = json.loads(line[-1])
        print(f"{args.rows:,} fact rows, {changed:,} changed per round, median of {args.repeat} rounds (seconds)")
        print(f"{'warehouse':<10} {'build':>7} {'DIFF':>7} {'FULL':>7} {'plain':>7} {'plain/DIFF':>11}")
        for side, m in sides.items():
            print(f"{side:<10} {m['built']:7.1f} {m['diff']:7.2f} {m['full']:7.2f} {m['plain']:7.2f} "
                  f"{m['plain'] / m['diff']:10.1f}x")
        print(f"S3 / local: DIFF {sides['s3']['diff'] / sides['local']['diff']:.2f}x, "
              f"FULL {sides['s3']['full'] / sides['local']['full']:.2f}x, "
              f"plain {sides['s3']['plain'] / sides['local']['plain']:.2f}x")
        print("\nDIFFERENTIAL phases (median ms):")
        names = list(dict.fromkeys(k for m in sides.values() for k in m["phases"]))
        print(f"{'phase':<14}" + "".join(f"{side:>10}" for side in sides))
        for name in names:
            print(f"{name:<14}" + "".join(f"{m['phases'].get(name, 0):10.0f}" for m in sides.values()))
        return 0
    import json

    with tempfile.TemporaryDirectory(prefix="trickle-bench-s3-") as scratch:
        if args.only == "local":
            measured = measure(os.path.join(scratch, "warehouse"), {}, args.rows, changed, args.repeat)
        else:
            from tests.helpers.s3proxy import S3Server

            with S3Server(scratch) as s3:
                measured = measure(s3.warehouse, s3.storage_options, args.rows, changed, args.repeat)
    print(json.dumps(measured), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
