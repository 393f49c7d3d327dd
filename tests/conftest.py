"""Shared fixtures: one local Spark (with Delta) per test process and Spark mode, one warehouse each.

Tests isolate themselves by database name (``db`` fixture), not by warehouse: the warehouse
directory is fixed when the JVM starts.

Modules marked ``both_spark_modes`` (lifecycle, differential, cascade) run in the modes that
``$TRICKLE_TEST_SPARK_MODES`` lists: ``connect`` by default -- through the Spark service over
Spark Connect, the path Airflow tasks take (a service of the test process's own, no JVM in the
test process for that warehouse) -- and ``classic,connect`` for both, which doubles their time.
Every other Spark test runs on a classic embedded session, so the default run covers both.
"""
from __future__ import annotations

import os
import uuid
from collections import Counter

import pytest

import tempfile

from tests.helpers import class_archive

os.environ.setdefault("PYSPARK_PYTHON", os.sys.executable)
# Airflow reads its home when first imported; keep tests away from ~/airflow.
os.environ.setdefault("AIRFLOW_HOME", tempfile.mkdtemp(prefix="trickle-airflow-home-"))
os.environ.setdefault("AIRFLOW__CORE__LOAD_EXAMPLES", "False")
#: The JVMs the suite starts for a minute or two (the example's Spark service, the kill trials'
#: and racers' children, another application on the metastore, spark-submit jobs, s3proxy, the
#: Hive metastore, and spark-submit's own launcher) compile with C1 only: over tables of a few
#: rows, C2's compilations of Spark's planner cost more CPU than its faster code saves in so
#: short a life.  ``java`` reads JDK_JAVA_OPTIONS itself, so every child inherits it.  The
#: Sparks a test process keeps for all its tests (``LONG_LIVED_SPARK``) turn C2 back on: over
#: twenty minutes of refreshes its code pays (measured, the suite with C1 everywhere against
#: both compilers: the example's module 267.7 / 379.7 s, the metastore's 78.8 / 124.5 s, but the
#: modules on the test processes' Sparks 1.4-1.8x as long, 40:42 against 32:30 in all).
os.environ.setdefault("JDK_JAVA_OPTIONS", "-XX:TieredStopAtLevel=1 -XX:+UseParallelGC")


SPARK_MODES = ("classic", "connect")
# Test tables are tiny, so any change is a large share of them, and a delta costs as much as the
# query: the cost model's change-ratio, touched-rows and time rules would turn every refresh FULL.  Tests of those rules set them per table.
#: Spark tuned for tables of a few rows, where Spark's fixed costs are the whole cost: adaptive
#: execution re-plans every stage (an extra job each) to save on shuffles that carry nothing;
#: the parallel collector costs less CPU than G1 on 2 cores (measured: a refresh 4.3 s -> 3.0 s);
#: and Delta's data skipping, which parses every file's statistics at planning to skip files of
#: tables that have one or two, is off (the 22 TPC-H stream tables at SF 0.01 in one JVM,
#: alternating per cycle: a cycle's refreshes 198.5 / 202.0 s with it, 179.4 / 171.5 s without);
#: and code generation is off: Spark compiles Java for nearly every distinct statement (Janino,
#: ~20 ms each on the driver, about 80 compiles per TPC-H refresh and its check) to run it over a
#: few rows, where interpreting them costs nothing (``benchmarks/suite_settings.py``, the TPC-H
#: test: 383.8 s, 4,140 compiles with code generation; 328.4 s, 145 without); and joins are not
#: broadcast: every table here is under the broadcast threshold, so each join collected its side
#: to the driver in a job of its own and shipped it back, where a sort-merge join of a few rows
#: stays within the query's stages (the same test: 294 s of JVM CPU without broadcasts against
#: 324 and 345 s with them, both orders; the suite is CPU-bound); and one partition per shuffle,
#: per Delta snapshot's state and per parallelized collection: a second task of a few rows
#: is scheduling, not parallelism, where two test processes share two cores (the same test:
#: 235.6 s of JVM CPU with two, 221.0 s with one).  The driver maps Spark's classes from a
#: class-data archive where ``run-tests.sh`` made one (``tests/helpers/class_archive.py``).
#: No Spark UI either (a web server per JVM that no test reads).
#: The product keeps Spark's defaults, and the example and the product's benchmarks run with them.
TINY_TABLES_SPARK = {"spark.sql.adaptive.enabled": "false", "spark.ui.enabled": "false",
                     "spark.driver.extraJavaOptions": f"-XX:+UseParallelGC {class_archive.java_options()}".strip(),
                     "spark.databricks.delta.stats.skipping": "false",
                     "spark.sql.codegen.wholeStage": "false", "spark.sql.codegen.factoryMode": "NO_CODEGEN",
                     "spark.sql.autoBroadcastJoinThreshold": "-1",
                     "spark.sql.shuffle.partitions": "1", "spark.databricks.delta.snapshotPartitions": "1",
                     "spark.default.parallelism": "1"}
#: A Spark a test's child process starts for itself (a second application, a racing or killed
#: worker): the tiny tables' settings.
CHILD_SPARK = dict(TINY_TABLES_SPARK)
#: The settings of a Spark service a test starts (``start_detached(..., settings=...)``).
#: Both compilers again (a later -XX flag wins over JDK_JAVA_OPTIONS'), for a Spark that serves
#: a test process or a module throughout.
LONG_LIVED_SPARK = {**TINY_TABLES_SPARK, "spark.driver.extraJavaOptions":
                    TINY_TABLES_SPARK["spark.driver.extraJavaOptions"] + " -XX:TieredStopAtLevel=4"}
SERVICE_SETTINGS = {"shuffle_partitions": 1, "spark_conf": LONG_LIVED_SPARK}
TEST_SETTINGS = {"shuffle_partitions": 1, "differential_max_change_ratio": 1e9, "differential_max_touched_ratio": 1e9,
                 "differential_max_time_ratio": 1e9,
                 "differential_ratio_min_rows": 0, "spark_conf": LONG_LIVED_SPARK}


#: Modules that start Spark themselves (a subprocess, a service) rather than through the fixtures.
JVM_MODULES = {"test_airflow_example.py", "test_service.py", "test_spark_cluster.py", "test_object_storage.py", "test_metastore.py"}


def pytest_configure(config):
    config.addinivalue_line("markers", "both_spark_modes: run in the Spark modes $TRICKLE_TEST_SPARK_MODES lists")
    config.addinivalue_line("markers", "spark_service: runs over the test process's Spark service (connect mode) only")
    config.addinivalue_line("markers", "cluster: starts a Spark standalone cluster (run with -m cluster)")
    config.addinivalue_line("markers", "metastore: starts a Hive metastore (in the default run; -m metastore alone)")
    config.addinivalue_line("markers", "jvm: needs Spark (set on collection; -m 'not jvm' runs the rest in seconds)")


#: Seconds each long Spark module took on 2 cores (run-tests.sh, December 2026), to order the
#: xdist groups longest first: a long group started last would leave the other process idle.
LONG_MODULES = {"test_dvm_oracle.py": 360, "test_tpch.py": 215, "test_cascade.py": 235,
                "test_service.py": 230, "test_dvm_oracle_joins.py": 140, "test_airflow_example.py": 195,
                "test_differential.py": 150, "test_lifecycle.py": 160, "test_recursive.py": 70, "test_repair.py": 30,
                "test_airflow_live.py": 185, "test_object_storage.py": 360, "test_metastore.py": 70,
                "test_arranged_joins.py": 55, "test_project_apply.py": 80,
                "test_dvm_oracle_surface.py": 60}


@pytest.hookimpl(tryfirst=True)  # before xdist's own hook reads the groups
def pytest_collection_modifyitems(config, items):
    """Mark every test that needs a JVM ``jvm`` and give it its xdist group; run the JVM-free
    ones first (they fail fast), then the groups, longest first.

    ``run-tests.sh`` distributes by group (``--dist loadgroup``): all tests on a classic session
    form one group and all tests over the shared Spark service another, so each test process
    starts one of the two JVMs rather than both (a JVM's start and JIT warm-up cost about 45 s
    of CPU on 2 cores, and the suite is CPU-bound); a module that starts its own Spark
    (``JVM_MODULES``) is a group of its own, so its module fixtures run once.
    """
    tests_per_module = Counter(item.path.name for item in items)
    group_seconds: dict[str, float] = {}
    for item in items:
        group = _xdist_group(item)
        if group is None:
            continue
        item.add_marker(pytest.mark.jvm)
        item.add_marker(pytest.mark.xdist_group(name=group))
        share = LONG_MODULES.get(item.path.name, 0) / tests_per_module[item.path.name]
        group_seconds[group] = group_seconds.get(group, 0) + share
    items.sort(key=lambda item: (item.get_closest_marker("jvm") is not None,
                                 -group_seconds.get(_xdist_group(item) or "", 0),
                                 -LONG_MODULES.get(item.path.name, 0)))


@pytest.hookimpl(trylast=True)
def pytest_collection_finish(session):
    """Refuse to run when ``--dist loadgroup`` did not take (a pytest that pytest-xdist cannot
    tag): the groups would scatter, and a module fixture such as the example's would run twice."""
    if not getattr(session.config.option, "loadgroup", False):
        return
    scattered = [item.nodeid for item in session.items
                 if item.get_closest_marker("xdist_group") and "@" not in item.nodeid]
    if scattered:
        raise pytest.UsageError(f"pytest-xdist did not apply its groups (e.g. {scattered[0]}); "
                                "install the test extras' pytest version: pip install -e '.[test]'")


def _xdist_group(item) -> str | None:
    """The xdist group of a test that needs a JVM: its Spark mode's, or its module's when the
    module starts Spark itself; None for a JVM-free test."""
    if item.path.name in JVM_MODULES:
        return item.path.stem
    callspec = getattr(item, "callspec", None)
    if callspec is not None and "spark_mode" in callspec.params:
        return f"spark-{callspec.params['spark_mode']}"
    return None


def marked_modes() -> list[str]:
    modes = [m.strip() for m in os.environ.get("TRICKLE_TEST_SPARK_MODES", "connect").split(",") if m.strip()]
    unknown = set(modes) - set(SPARK_MODES)
    if unknown or not modes:
        raise pytest.UsageError(f"TRICKLE_TEST_SPARK_MODES: use classic, connect or both, not {sorted(unknown)}")
    return modes


def pytest_generate_tests(metafunc):
    """Every test using Spark gets a ``spark_mode``: marked modules the listed ones (``spark_service``:
    ``connect``), others ``classic``."""
    if "spark_mode" in metafunc.fixturenames:
        if metafunc.definition.get_closest_marker("spark_service"):
            modes = ["connect"]
        elif metafunc.definition.get_closest_marker("both_spark_modes"):
            modes = marked_modes()
        else:
            modes = ["classic"]
        metafunc.parametrize("spark_mode", modes, indirect=True)


@pytest.fixture(autouse=True)
def _no_connect_mark_left_behind():
    """pyspark marks a process that made a Spark Connect session as Spark Connect
    (``SPARK_CONNECT_MODE_ENABLED``); the mark breaks every classic Spark started after it in
    this process and its children (a kill trial's child failed with CONNECT_URL_NOT_SET).
    ``connect_session`` takes it off; a test that makes a Connect session another way fails
    here, and the mark is taken off so that the tests after it are not hurt."""
    before = os.environ.get("SPARK_CONNECT_MODE_ENABLED")
    yield
    if before is None and os.environ.pop("SPARK_CONNECT_MODE_ENABLED", None) is not None:
        pytest.fail("this test left pyspark's Spark Connect mark (SPARK_CONNECT_MODE_ENABLED) on the test "
                    "process: make Connect sessions with airflow_trickle.spark.session.connect_session")


@pytest.fixture
def spark_mode(request) -> str:
    return request.param


class Sparks:
    """One warehouse and one Spark per mode for the whole test process, made on first use and
    kept until the end (a session-scoped parametrized fixture would be torn down and rebuilt
    each time the tests' order switches between modes)."""

    def __init__(self, tmp_path_factory):
        self.tmp_path_factory = tmp_path_factory
        self.made: dict[str, dict] = {}

    def get(self, mode: str) -> dict:
        if mode not in self.made:
            from airflow_trickle import Trickle

            warehouse = str(self.tmp_path_factory.mktemp(f"warehouse-{mode}"))
            service = None
            if mode == "connect":
                from airflow_trickle.spark.service import start_detached

                service = start_detached(warehouse, port=0, master="local[2]", settings=SERVICE_SETTINGS)
                trickle = Trickle(warehouse=warehouse, remote=service.address, **TEST_SETTINGS)
            else:
                trickle = Trickle(warehouse=warehouse, spark_master="local[2]", **TEST_SETTINGS)
            trickle.spark  # start the JVM (or connect) once
            self.made[mode] = {"warehouse": warehouse, "service": service, "tr": trickle}
        return self.made[mode]

    def release_embedded(self) -> None:
        """Stop this process's embedded (classic) Spark and its JVM, for a module that starts a
        Spark of its own: one process's embedded Spark serves one warehouse, and a JVM started
        without the S3A jars cannot load them later (a new session in it failed with
        ``S3AFileSystem not found``). The classic tests (one xdist group, run as a unit) make a
        new one should they come later."""
        made = self.made.pop("classic", None)
        if made is None:
            return
        made["tr"].close()
        from pyspark import SparkContext

        gateway = SparkContext._gateway
        if gateway is not None:  # the next session launches a JVM of its own
            gateway.shutdown()
            process = getattr(gateway, "proc", None)
            if process is not None:
                process.stdin.close()  # the JVM exits when its parent's pipe closes
                process.wait(60)
            SparkContext._gateway = SparkContext._jvm = None

    def close(self) -> None:
        import logging

        # py4j closes its connections from __del__ at interpreter exit, after pytest closed the
        # streams its log records would go to: keep those closing notes out of the run's end.
        for name in [n for n in logging.root.manager.loggerDict if n.startswith("py4j")] + ["py4j"]:
            logging.getLogger(name).disabled = True
        logging.raiseExceptions = False
        for made in self.made.values():
            made["tr"].close()
            if made["service"] is not None:
                from airflow_trickle.spark.service import stop_service

                stop_service(made["warehouse"])


@pytest.fixture(scope="session")
def sparks(tmp_path_factory):
    pool = Sparks(tmp_path_factory)
    yield pool
    pool.close()


@pytest.fixture
def warehouse(sparks, spark_mode) -> str:
    return sparks.get(spark_mode)["warehouse"]


@pytest.fixture
def service(sparks, spark_mode):
    """The Spark service of the ``connect`` warehouse (None in ``classic`` mode)."""
    return sparks.get(spark_mode)["service"]


@pytest.fixture
def tr(sparks, spark_mode):
    return sparks.get(spark_mode)["tr"]


@pytest.fixture
def subprocess_env(service) -> dict:
    """Environment for a child process (CLI, worker) that should use the same Spark as ``tr``."""
    env = {**os.environ, "PYTHONPATH": os.path.dirname(os.path.dirname(os.path.abspath(__file__)))}
    if service is not None:
        env["TRICKLE_REMOTE"] = service.address
    else:
        env.pop("TRICKLE_REMOTE", None)
    return env


@pytest.fixture
def spark(tr):
    return tr.spark


@pytest.fixture
def db(tr) -> str:
    """A fresh database for one test."""
    name = f"t_{uuid.uuid4().hex[:10]}"
    tr.sql(f"CREATE DATABASE {name}")
    return name


def rows(frame) -> list[tuple]:
    """A DataFrame's rows as a sorted list of tuples (a multiset, comparable with ==)."""
    return sorted((tuple(r) for r in frame.collect()), key=repr)


def visible(tr, name: str) -> list[tuple]:
    return rows(tr.read(name))
