"""The example's DAG in Airflow: refresh tasks over the Spark service vs spark-submit, side by side.

    python benchmarks/airflow_refresh.py [--modes submit,connect]

Runs ``dags_example/run_example.py`` once per mode, each in a fresh process and warehouse
(three ``dag.test()`` runs: create, all-DIFFERENTIAL, a manual FULL of two tables), and prints:

* the whole example's wall time (process start to exit, service start and stop included);
* each DAG run, trigger to last task done;
* per refresh task of the DIFFERENTIAL run: the task's duration, the refresh's own time (the
  history rows the task wrote, start to end) and the overhead beyond it (process, Spark
  session or JVM start, connection, catalog reads);
* the manual refresh of ``shop.order_lines`` (the trigger form's FULL): task duration.

The targets of issue 10 are printed next to the Spark-Connect figures.
"""
from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def run_example(mode: str) -> dict:
    with tempfile.TemporaryDirectory(prefix=f"trickle-bench-{mode}-") as scratch:
        report = Path(scratch) / "report.json"
        started = time.monotonic()
        done = subprocess.run([sys.executable, str(ROOT / "dags_example" / "run_example.py"), "--warehouse",
                               f"{scratch}/wh", "--report", str(report), "--spark", mode],
                              capture_output=True, text=True)
        wall = time.monotonic() - started
        if done.returncode != 0 or not report.exists():
            sys.exit(f"{mode}: the example failed\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}")
        data = json.loads(report.read_text())
    data["wall"] = wall
    return data


def task_figures(data: dict, run_index: int) -> list[dict]:
    """Per refresh task of one run: task seconds, refresh seconds, overhead."""
    run = data["runs"][run_index]
    refresh_seconds: dict[str, float] = {}
    for table in data["tables"].values():
        for refresh in table["refreshes"]:
            tag = refresh["initiated_by"] or ""
            if f"/{run['run_id']}/" in tag and refresh["seconds"] is not None:
                task_id = tag.rsplit("/", 1)[1].split("#")[0]
                refresh_seconds[task_id] = refresh_seconds.get(task_id, 0.0) + refresh["seconds"]
    figures = []
    for task_id, seconds in sorted(run["task_seconds"].items()):
        if task_id in refresh_seconds:
            figures.append({"task": task_id, "task_s": seconds, "refresh_s": refresh_seconds[task_id],
                            "overhead_s": seconds - refresh_seconds[task_id]})
    return figures


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--modes", default="submit,connect")
    args = parser.parse_args()
    modes = [m for m in args.modes.split(",") if m]
    results = {}
    for mode in modes:
        print(f"running the example with --spark {mode} ...", flush=True)
        results[mode] = run_example(mode)

    def column(fn):
        return "".join(f"{fn(results[m]):>16}" for m in modes)

    header = "".join(f"{m:>16}" for m in modes)
    print(f"\n{'':<46}{header}")
    print(f"{'whole example (process wall time)':<46}" + column(lambda d: "%.0f s" % d["wall"]))
    titles = ["DAG run 1: create and populate", "DAG run 2: every table DIFFERENTIAL", "DAG run 3: manual FULL of 2"]
    for index, title in enumerate(titles):
        print(f"{title:<46}" + column(lambda d, i=index: "%.1f s" % d["runs"][i]["seconds"]))
    for label, key in (("refresh task, median duration", "task_s"), ("  of which the refresh itself", "refresh_s"),
                       ("  overhead beyond the refresh, median", "overhead_s"),
                       ("  overhead beyond the refresh, max", "overhead_max")):
        def figure(d, key=key):
            rows = task_figures(d, 1)
            values = [r["overhead_s"] for r in rows] if key == "overhead_max" else [r[key] for r in rows]
            return f"{(max(values) if key == 'overhead_max' else statistics.median(values)):.2f} s"
        print(f"{label:<46}{column(figure)}")

    def manual(d):
        return f"{d['runs'][2]['task_seconds'].get('shop.order_lines', float('nan')):.1f} s"
    print(f"{'manual FULL of shop.order_lines: task':<46}{column(manual)}")
    for mode in modes:
        print(f"\n{mode}: DIFFERENTIAL run, per task (task / refresh / overhead, s)")
        for row in task_figures(results[mode], 1):
            print(f"  {row['task']:<34} {row['task_s']:6.2f} {row['refresh_s']:6.2f} {row['overhead_s']:6.2f}")
    if "connect" in modes:
        d = results["connect"]
        overheads = [r["overhead_s"] for r in task_figures(d, 1)]
        checks = [("DAG run with every table DIFFERENTIAL <= 60 s", d["runs"][1]["seconds"] <= 60),
                  ("per-task overhead <= 2 s (max)", max(overheads) <= 2),
                  ("manual refresh task <= 10 s", d["runs"][2]["task_seconds"]["shop.order_lines"] <= 10),
                  ("whole example <= 180 s", d["wall"] <= 180),
                  ("no freshness miss", not any(t["alerts"] for t in d["tables"].values()))]
        print("\ntargets (Spark Connect):")
        for text, ok in checks:
            print(f"  {'met ' if ok else 'MISSED'}  {text}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
