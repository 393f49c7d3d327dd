"""A class-data archive of Spark's classes for the suite's Spark JVMs (JDK AppCDS).

    python -m tests.helpers.class_archive    # made once, beside the cached jars

Why: the suite starts about thirty Spark JVMs (the test processes' Sparks, the Spark services,
the example's, the kill trials' children, another application on the metastore), and each loads
and verifies some twenty thousand of Spark's classes from its jars before its first query.  A
dynamic archive (``-XX:ArchiveClassesAtExit``) written by one short Spark workload holds those
classes parsed and verified; a JVM started with it maps them instead.  Measured on 2 cores, a
Spark start, two tables, a stream table created and refreshed: 32.0 s of JVM CPU without it,
24.1 s with it (three runs each; the start alone 6.7 / 4.6 s of wall time); the whole suite
26:27 before, 24:15 with it (and ``is_delta`` answered from the catalog's metadata).

The archive is only as good as the JDK and the class path it was made with: it is named by
both, made again when either changes, and a JVM that cannot use it (another class path: the
Spark launcher, s3proxy, the metastore) silently loads its classes as before -- the archive
changes how fast classes load, never which.  ``tests/conftest.py`` passes it to the suite's
Spark drivers (``spark.driver.extraJavaOptions``) when it exists.
"""
from __future__ import annotations

import hashlib
import importlib.metadata
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from airflow_trickle.spark.jars import cache_root

#: Options that keep a JVM quiet about an archive it cannot use (a warning on its standard
#: output otherwise, where the Spark launcher's output is read as a command).
QUIET = "-Xlog:cds*=off"
#: Archives kept (one per JDK and pyspark installation; about 200 MB each).
KEPT = 3


def path() -> Path:
    """The archive for this JDK and pyspark (it may not exist yet)."""
    home = os.environ.get("JAVA_HOME")  # the JDK Spark's scripts start, as they choose it
    found = os.path.join(home, "bin", "java") if home else shutil.which("java")
    if found is None or not os.path.exists(found):
        return cache_root() / "class-archives" / "no-java"
    binary = Path(found).resolve()  # the JDK's own folder, and its build by the file's size and time
    java = f"{binary} {binary.stat().st_size} {binary.stat().st_mtime_ns}"
    pyspark = Path(importlib.metadata.distribution("pyspark").locate_file("pyspark")).resolve()
    key = hashlib.sha1(f"{java}\n{pyspark}\n{importlib.metadata.version('pyspark')}".encode()).hexdigest()[:16]
    return cache_root() / "class-archives" / f"spark-{key}.jsa"


def java_options() -> str:
    """The driver options that use the archive; empty when it has not been made."""
    archive = path()
    return f"-XX:SharedArchiveFile={archive} {QUIET}" if archive.is_file() else ""


def make() -> Path:
    """The archive, made by a short Spark workload in a JVM of its own the first time."""
    archive = path()
    if archive.is_file():
        return archive
    archive.parent.mkdir(parents=True, exist_ok=True)
    partial = archive.with_suffix(f".{os.getpid()}.partial")
    done = subprocess.run([sys.executable, "-m", "tests.helpers.class_archive", "--workload", str(partial)],
                          capture_output=True, text=True, timeout=600)
    if done.returncode != 0 or not partial.is_file():
        partial.unlink(missing_ok=True)
        print(f"no class-data archive (the suite runs without it): {done.stderr[-2000:]}", file=sys.stderr)
        return archive
    partial.replace(archive)  # atomic: a JVM never maps a half-written archive
    for other in sorted(archive.parent.glob("spark-*.jsa"), key=lambda f: f.stat().st_mtime)[:-KEPT]:
        other.unlink(missing_ok=True)  # another JDK's or checkout's: the newest few stay
    return archive


def workload(target: str) -> None:
    """What a test does, in one Spark whose JVM writes its loaded classes to ``target`` at exit:
    Delta tables with change feeds, a join + aggregate and a window as stream tables, refreshes
    committed by delta-rs and by Spark's MERGE."""
    from airflow_trickle import Trickle
    from tests.conftest import TEST_SETTINGS

    conf = dict(TEST_SETTINGS["spark_conf"])
    conf["spark.driver.extraJavaOptions"] += f" -XX:ArchiveClassesAtExit={target}"
    tr = Trickle(warehouse=tempfile.mkdtemp(prefix="trickle-class-archive-"), spark_master="local[2]",
                 **{**TEST_SETTINGS, "spark_conf": conf})
    tr.sql("CREATE TABLE o (id INT, c INT, amount DECIMAL(10,2)) USING delta "
           "TBLPROPERTIES (delta.enableChangeDataFeed = true)")
    tr.sql("CREATE TABLE c (id INT, region STRING) USING delta TBLPROPERTIES (delta.enableChangeDataFeed = true)")
    tr.sql("INSERT INTO o VALUES (1, 1, 10.5), (2, 1, 20), (3, 2, NULL), (4, NULL, 7)")
    tr.sql("INSERT INTO c VALUES (1, 'north'), (2, 'south')")
    tr.create_stream_table("default.per_region", "SELECT c.region, COUNT(*) AS n, SUM(o.amount) AS total "
                           "FROM o JOIN c ON o.c = c.id GROUP BY c.region", refresh_mode="DIFFERENTIAL", schedule=None)
    tr.create_stream_table("default.ranked", "SELECT id, c, amount, ROW_NUMBER() OVER (PARTITION BY c ORDER BY id) "
                           "AS r FROM o", refresh_mode="DIFFERENTIAL", schedule=None)
    for step in ("INSERT INTO o VALUES (5, 2, 1.25)", "UPDATE c SET region = 'west' WHERE id = 2",
                 "DELETE FROM o WHERE id = 1"):
        tr.sql(step)
        for name in ("default.per_region", "default.ranked"):
            tr.refresh_stream_table(name)
            tr.refresh_stream_table(name, "FULL")
    tr.read("default.per_region").collect()
    tr.close()
    from pyspark import SparkContext

    gateway = SparkContext._gateway  # the JVM writes the archive as it exits: wait for it
    gateway.shutdown()
    gateway.proc.stdin.close()
    gateway.proc.wait(300)


if __name__ == "__main__":
    if sys.argv[1:2] == ["--workload"]:
        workload(sys.argv[2])
    else:
        print(make())
