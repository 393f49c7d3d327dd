"""How long Airflow takes to parse a dags-folder file whose project has N stream tables.

    python benchmarks/dag_parse.py [--tables 200] [--repeat 5]

Generates a project of N stream tables over 10 source tables in 5 databases -- chains, joins,
aggregates, CALCULATED schedules and atomic diamonds -- and measures, in one process:

* ``load_project``: YAML read, SQL parse, sources, cycles, schedules, diamonds;
* ``stream_table_dag``: the above plus building the DAG (task groups, tasks, params, assets);
* a full ``DagBag`` parse of a dags folder holding the factory call, as the DAG processor does it.

The Airflow import itself is paid once per DAG-processor process and is reported separately.
"""
from __future__ import annotations

import argparse
import os
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

import yaml


def generate_project(count: int, seed: int = 7) -> dict:
    rng = random.Random(seed)
    databases = [f"db{i}" for i in range(5)]
    sources = [f"{databases[i % 5]}.src{i}" for i in range(10)]
    tables: list[dict] = []
    names: list[str] = []
    for i in range(count):
        name = f"{databases[i % 5]}.st{i:03d}"
        upstream = names[-40:] + sources
        kind = rng.random()
        if kind < 0.4 or len(names) < 2:
            source = rng.choice(upstream)
            query = f"SELECT k, v FROM {source} WHERE v > {rng.randint(0, 100)}"
        elif kind < 0.7:
            left, right = rng.sample(upstream, 2)
            query = f"SELECT l.k, l.v + r.v AS v FROM {left} l JOIN {right} r ON l.k = r.k"
        else:
            source = rng.choice(upstream)
            query = f"SELECT k, SUM(v) AS v FROM {source} GROUP BY k"
        schedule = rng.choice(["1m", "5m", "15m", "1h", "*/10 * * * *", None])
        tables.append({"name": name, "query": query, "schedule": schedule,
                       "diamond_consistency": rng.choice(["atomic", "none"])})
        names.append(name)
    return {"project": "bench", "warehouse": "/tmp/bench-warehouse", "sources": sources,
            "stream_tables": tables}


def timed(action, repeat: int) -> tuple[float, object]:
    samples, result = [], None
    for _ in range(repeat):
        started = time.perf_counter()
        result = action()
        samples.append(time.perf_counter() - started)
    return statistics.median(samples), result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tables", type=int, default=200)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()

    folder = Path(tempfile.mkdtemp(prefix="trickle-parse-"))
    project_file = folder / "bench.yaml"
    project_file.write_text(yaml.safe_dump(generate_project(args.tables), sort_keys=False))
    (folder / "bench_dag.py").write_text(
        "# airflow dag\nfrom airflow_trickle.dag_factory import stream_table_dag\n"
        f"dag = stream_table_dag({str(project_file)!r})\n")
    os.environ.setdefault("AIRFLOW_HOME", str(folder / "airflow"))
    os.environ["AIRFLOW__CORE__DAGS_FOLDER"] = str(folder)
    os.environ["AIRFLOW__CORE__LOAD_EXAMPLES"] = "False"

    started = time.perf_counter()
    import airflow.sdk  # noqa: F401 - paid once per DAG-processor process
    from airflow.dag_processing.dagbag import DagBag

    from airflow_trickle.dag_factory import stream_table_dag
    from airflow_trickle.project import load_project
    imports = time.perf_counter() - started

    load, project = timed(lambda: load_project(project_file), args.repeat)
    build, dag = timed(lambda: stream_table_dag(project_file), args.repeat)
    bag, dagbag = timed(lambda: DagBag(dag_folder=str(folder)), args.repeat)
    assert not dagbag.import_errors, dagbag.import_errors
    groups = [u for u in project.units if u.is_group]
    print(f"project: {args.tables} stream tables, {len(project.units)} refresh tasks "
          f"({len(groups)} atomic groups holding {sum(len(g.members) for g in groups)} tables), "
          f"{len(dag.tasks)} tasks in the DAG")
    print(f"import airflow.sdk + airflow_trickle (once per process): {imports:.2f} s")
    print(f"load_project (median of {args.repeat}):                   {load * 1000:.0f} ms")
    print(f"stream_table_dag (load + build):                  {build * 1000:.0f} ms")
    print(f"DagBag parse of the dags folder:                  {bag * 1000:.0f} ms")
    print(f"pyspark imported: {'pyspark' in sys.modules}")


if __name__ == "__main__":
    main()
