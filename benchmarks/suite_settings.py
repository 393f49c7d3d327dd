"""The test suite's Spark settings, measured on the suite's heaviest workload: the 22 TPC-H
stream tables at SF 0.01 (``tests/test_tpch.py``: load, create, cycles of refresh functions,
every table refreshed DIFFERENTIAL and checked equal to its query).

    python benchmarks/suite_settings.py [--cycles 1] [--variant 'name={"spark.conf": "value"}' ...]

Each variant runs in a fresh process and JVM (some settings, such as the code-generation cache's
size, are fixed when the JVM starts), one after the other.  Printed per variant and phase: wall
time, the JVM's CPU time, and how many classes Spark's code generation compiled (Janino, on the
driver).  Without ``--variant``: the suite's settings (``tests/conftest.py`` ``TINY_TABLES_SPARK``)
against the same without their code-generation lines, i.e. Spark's default code generation.
Reads the JVM's metrics through py4j: a classic session only, a benchmark's privilege.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.conftest import TEST_SETTINGS, TINY_TABLES_SPARK  # noqa: E402

CODEGEN_KEYS = ("spark.sql.codegen.wholeStage", "spark.sql.codegen.factoryMode")


def default_variants() -> dict[str, dict]:
    with_codegen = {k: v for k, v in TINY_TABLES_SPARK.items() if k not in CODEGEN_KEYS}
    return {"suite settings": dict(TINY_TABLES_SPARK), "suite, Spark's code generation": with_codegen}


def run_one(spark_conf: dict, cycles: int) -> list[dict]:
    """The workload in this process; one record per phase."""
    from airflow_trickle import Trickle
    from tests import tpch

    warehouse = tempfile.mkdtemp(prefix="trickle-suite-settings-")
    tr = Trickle(warehouse=warehouse, spark_master="local[2]", **dict(TEST_SETTINGS, spark_conf=spark_conf))
    jvm = tr.spark._jvm
    pid = jvm.java.lang.ProcessHandle.current().pid()
    compilation = jvm.org.apache.spark.metrics.source.CodegenMetrics.METRIC_COMPILATION_TIME()

    def jvm_cpu() -> float:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    phases: list[dict] = []
    mark = {"wall": time.monotonic(), "cpu": jvm_cpu(), "compiles": compilation.getCount()}

    def phase(name: str) -> None:
        now = {"wall": time.monotonic(), "cpu": jvm_cpu(), "compiles": compilation.getCount()}
        phases.append({"phase": name, **{k: now[k] - mark[k] for k in now}})
        mark.update(now)

    database = "tpch_oracle"
    tpch.load(tr, 0.01, Path(warehouse) / "tpch-data", database)
    phase("load")
    stream_tables = tpch.create_differential(tr, database)
    phase("create 22")
    for cycle in range(cycles):
        tpch.refresh_functions(tr, cycle, database)
        phase(f"cycle {cycle}: refresh functions")
        tpch.refresh_and_check(tr, stream_tables, cycle)
        phase(f"cycle {cycle}: 22 refreshes + checks")
    tr.close()
    return phases


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--cycles", type=int, default=1)
    parser.add_argument("--variant", action="append", default=[],
                        help='name=JSON object of Spark settings (the whole spark_conf of that run)')
    parser.add_argument("--one", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one is not None:
        print("RESULT " + json.dumps(run_one(json.loads(args.one), args.cycles)), flush=True)
        return
    variants = dict(v.split("=", 1) for v in args.variant)
    variants = {k: json.loads(v) for k, v in variants.items()} or default_variants()
    results = {}
    for name, conf in variants.items():
        print(f"{name}: {json.dumps(conf)}", flush=True)
        done = subprocess.run([sys.executable, __file__, "--cycles", str(args.cycles), "--one", json.dumps(conf)],
                              capture_output=True, text=True)
        lines = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
        if not lines:
            sys.exit(f"{name} failed:\n{done.stdout[-2000:]}\n{done.stderr[-4000:]}")
        results[name] = json.loads(lines[-1][len("RESULT "):])
    print(f"\n{'variant':<34} {'phase':<36} {'wall s':>8} {'JVM CPU s':>10} {'compiles':>9}")
    for name, phases in results.items():
        for p in phases:
            print(f"{name:<34} {p['phase']:<36} {p['wall']:8.1f} {p['cpu']:10.1f} {p['compiles']:9d}")
        total = {k: sum(p[k] for p in phases) for k in ("wall", "cpu", "compiles")}
        print(f"{name:<34} {'total':<36} {total['wall']:8.1f} {total['cpu']:10.1f} {total['compiles']:9d}")


if __name__ == "__main__":
    main()
