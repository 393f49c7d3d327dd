"""The embedded default: a local Spark session with Delta, whose tables live under a warehouse dir.

The embedded session uses Spark's in-memory catalog rather than an embedded Hive metastore:
an embedded Derby metastore admits one process at a time, and two refresh jobs must be able to
run at once.  The warehouse directory itself is the metastore: Delta tables are self-describing,
so :func:`sync_warehouse_tables` registers every ``<warehouse>/<db>.db/<table>`` (and
``<warehouse>/<table>`` for the default database) under its name in a session, and forgets names
whose directory another application removed.
"""
from __future__ import annotations

import importlib.metadata
import os
from pathlib import Path
from urllib.parse import urlparse

from airflow_trickle.config import TrickleConfig

CATALOG_DIR = "_trickle"


def delta_package() -> str:
    """Maven coordinates of the Delta jar matching the installed pyspark and delta-spark."""
    spark_minor = ".".join(importlib.metadata.version("pyspark").split(".")[:2])
    delta_version = importlib.metadata.version("delta-spark")
    return f"io.delta:delta-spark_{spark_minor}_2.13:{delta_version}"


def _jar_cache_file() -> Path:
    root = os.environ.get("TRICKLE_JAR_CACHE") or os.path.join(os.path.expanduser("~"), ".cache", "airflow_trickle")
    return Path(root) / (delta_package().replace(":", "_") + ".jars")


def delta_jars_conf() -> dict[str, str]:
    """``spark.jars`` with the Delta jars resolved earlier, else ``spark.jars.packages`` to resolve them.

    Resolution through Maven Central happens once; its result is remembered, so later sessions
    start without Ivy (faster, quiet, and offline).
    """
    cache = _jar_cache_file()
    if cache.is_file():
        jars = [line.strip() for line in cache.read_text().splitlines() if line.strip()]
        if jars and all(os.path.isfile(j) for j in jars):
            return {"spark.jars": ",".join(jars)}
    return {"spark.jars.packages": delta_package()}


def _remember_resolved_jars(spark) -> None:
    conf = spark.sparkContext.getConf()
    if not conf.get("spark.jars.packages", None):
        return
    jars = [j.removeprefix("file://").removeprefix("file:") for j in (conf.get("spark.jars", "") or "").split(",") if j]
    if jars and all(os.path.isfile(j) for j in jars):
        cache = _jar_cache_file()
        cache.parent.mkdir(parents=True, exist_ok=True)
        cache.write_text("\n".join(jars) + "\n")


def session_conf(config: TrickleConfig, warehouse: str) -> dict[str, str]:
    """The Spark configuration of an embedded session, also used for spark-submit jobs."""
    conf = {
        "spark.sql.extensions": "io.delta.sql.DeltaSparkSessionExtension",
        "spark.sql.catalog.spark_catalog": "org.apache.spark.sql.delta.catalog.DeltaCatalog",
        "spark.sql.catalogImplementation": "in-memory",
        "spark.sql.warehouse.dir": warehouse,
        **delta_jars_conf(),
        "spark.sql.shuffle.partitions": str(config.shuffle_partitions),
        # Delta rebuilds table state with this many partitions; its default of 50 dominates
        # small reads on one machine.
        "spark.databricks.delta.snapshotPartitions": str(max(1, config.shuffle_partitions)),
        "spark.ui.showConsoleProgress": "false",
        "spark.sql.session.timeZone": "UTC",
    }
    conf.update(config.spark_conf)
    return conf


def build_session(config: TrickleConfig, warehouse: str):
    """Start (or reuse) the embedded local Spark session for ``warehouse``.

    The Delta jars are resolved from Maven Central by ``spark.jars.packages`` on first use
    (cached by Ivy in ``~/.ivy2.5.2``); later sessions load the resolved jars directly.
    """
    from pyspark.sql import SparkSession

    local = _local_path(warehouse)
    if local:
        Path(local).mkdir(parents=True, exist_ok=True)
    builder = SparkSession.builder.master(config.spark_master).appName("airflow_trickle")
    for key, value in session_conf(config, warehouse).items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    _quiet_query_errors(spark)
    _remember_resolved_jars(spark)
    return spark


def _quiet_query_errors(spark) -> None:
    """Spark logs every failed query's stack trace; airflow_trickle reports errors itself."""
    try:
        jvm = spark._jvm
        level = jvm.org.apache.logging.log4j.Level.OFF
        jvm.org.apache.logging.log4j.core.config.Configurator.setLevel("SQLQueryContextLogger", level)
    except Exception:  # noqa: BLE001 - logging is cosmetic
        pass


def default_warehouse(spark) -> str:
    """The warehouse directory of a session the user brought."""
    return spark.conf.get("spark.sql.warehouse.dir")


def _local_path(location: str) -> str | None:
    parsed = urlparse(location)
    if parsed.scheme in ("", "file"):
        return os.path.abspath(parsed.path if parsed.scheme else location)
    return None


def uses_in_memory_catalog(spark) -> bool:
    return spark.conf.get("spark.sql.catalogImplementation", "in-memory") == "in-memory"


def sync_warehouse_tables(spark, warehouse: str) -> None:
    """Make every Delta table stored under a local ``warehouse`` visible by name in ``spark``.

    Only for sessions on the in-memory catalog (the embedded default); a real metastore already
    shares names between applications.
    """
    root = _local_path(warehouse)
    if not root or not os.path.isdir(root) or not uses_in_memory_catalog(spark):
        return
    on_disk: dict[str, str] = {}
    for entry in os.scandir(root):
        if not entry.is_dir() or entry.name.startswith(("_", ".")):
            continue
        if entry.name.endswith(".db"):
            database = entry.name[:-3]
            for table in os.scandir(entry.path):
                if table.is_dir() and os.path.isdir(os.path.join(table.path, "_delta_log")):
                    on_disk[f"{database}.{table.name}".lower()] = table.path
            on_disk.setdefault(f"{database}.", "")
        elif os.path.isdir(os.path.join(entry.path, "_delta_log")):
            on_disk[f"default.{entry.name}".lower()] = entry.path
    jcatalog = spark._jsparkSession.sessionState().catalog()
    # Only what changed on disk since the last sync costs catalog calls: with many tables a
    # full pass (a SHOW TABLES per database, an exists check per table) took a second.
    seen = _seen_on_disk.setdefault((id(spark), root), set())
    appeared = [key for key in sorted(on_disk) if key not in seen]
    known_dbs = {db.lower() for db in _scala_list(jcatalog.listDatabases())} if appeared else set()
    for key in appeared:
        database, table = key.split(".", 1)
        if database not in known_dbs:
            spark.sql(f"CREATE DATABASE IF NOT EXISTS `{database}`")
            known_dbs.add(database)
        if table and not spark.catalog.tableExists(f"`{database}`.`{table}`"):
            location = on_disk[key].replace("'", "\\'")
            try:
                spark.sql(f"CREATE TABLE IF NOT EXISTS `{database}`.`{table}` USING delta LOCATION '{location}'")
                _make_managed(spark, database, table)
            except Exception:  # noqa: BLE001 - a table being created or dropped right now: next sync
                continue
        seen.add(key)
    for key in sorted(seen - set(on_disk)):  # gone from disk since the last sync
        seen.discard(key)
        database, table = key.split(".", 1)
        if table and spark.catalog.tableExists(f"`{database}`.`{table}`") and _table_location_gone(
                spark, database, table):
            jcatalog.dropTable(_table_identifier(spark, database, table), True, False)


#: Per (session, warehouse): the tables a sync saw on disk (and made visible by name).
_seen_on_disk: dict[tuple[int, str], set[str]] = {}


def _make_managed(spark, database: str, table: str) -> None:
    """Turn a table registered over an existing location into a managed one.

    ``CREATE TABLE ... LOCATION`` registers an *external* table, whose ``DROP TABLE`` would
    keep its files, so the name could not be created again.  Tables under the warehouse are
    managed (the application that created them made them so); re-register them as such.
    Relies on Spark's internal ``CatalogTable``; when that fails the table stays external.
    """
    jvm = spark._jvm
    jcatalog = spark._jsparkSession.sessionState().catalog()
    ident = _table_identifier(spark, database, table)
    meta = jcatalog.getTableMetadata(ident)
    if meta.tableType().name() == "MANAGED":
        return
    args = []
    while len(args) < 64:  # py4j answers every attribute name: probe defaults by calling them
        try:
            args.append(getattr(meta, f"copy$default${len(args) + 1}")())
        except Exception:  # noqa: BLE001 - no such default: all parameters found
            break
    args[1] = jvm.org.apache.spark.sql.catalyst.catalog.CatalogTableType.MANAGED()
    managed = meta.copy(*args)
    jcatalog.externalCatalog().dropTable(database, table, True, False)  # external: keeps the files
    jcatalog.createTable(managed, False, False)


def _table_location_gone(spark, database: str, table: str) -> bool:
    """True for a Delta table whose log another application removed (it was dropped there)."""
    try:
        meta = spark._jsparkSession.sessionState().catalog().getTableMetadata(_table_identifier(spark, database, table))
        provider = meta.provider().get() if meta.provider().isDefined() else ""
        location = _local_path(meta.location().toString())
    except Exception:  # noqa: BLE001
        return False
    return provider.lower() == "delta" and bool(location) and not os.path.isdir(os.path.join(location, "_delta_log"))


def _table_identifier(spark, database: str, table: str):
    jvm = spark._jvm
    return jvm.org.apache.spark.sql.catalyst.TableIdentifier(table, jvm.scala.Some(database))


def _scala_list(seq) -> list[str]:
    return [seq.apply(i) for i in range(seq.size())]
