"""The embedded default: a local Spark session with Delta, whose tables live under a warehouse.

The embedded session uses Spark's in-memory catalog rather than an embedded Hive metastore:
an embedded Derby metastore admits one process at a time, and two refresh jobs must be able to
run at once.  The warehouse itself is then the metastore: Delta tables are self-describing,
so :func:`sync_warehouse_tables` registers every ``<warehouse>/<db>.db/<table>`` (and
``<warehouse>/<table>`` for the default database) under its name in a session, and forgets names
whose files another application removed -- listing a directory, or an object-store prefix.
With ``metastore_uri`` (a shared Hive metastore) the sessions, the Spark service and
spark-submit jobs use the metastore instead, and names are shared through it.
"""
from __future__ import annotations

import os
import re
import threading
from pathlib import Path
from typing import TYPE_CHECKING
from urllib.parse import urlparse

from airflow_trickle.config import TrickleConfig
from airflow_trickle.errors import TrickleError
from airflow_trickle.names import quote_identifier, quote_string
from airflow_trickle.spark import require_engine
from airflow_trickle.spark.jars import delta_jars_conf, remember_resolved_jars, s3a_jars

if TYPE_CHECKING:
    from airflow_trickle.location import Location

CATALOG_DIR = "_trickle"


def session_conf(config: TrickleConfig, warehouse: str, *, secrets: bool = True, jars: bool = True) -> dict[str, str]:
    """The Spark configuration of an embedded session, also used for spark-submit jobs and the
    Spark service.  An S3 warehouse adds the S3A jars and the ``fs.s3a.*`` settings of its
    storage options; ``secrets=False`` leaves the credentials out (a process started with a
    command line gets them from its environment instead: :func:`secret_environment`)."""
    from airflow_trickle.location import Location, public_options, spark_settings

    location = Location(warehouse, config.storage_options if secrets else public_options(config.storage_options))
    artifacts = delta_jars_conf() if jars else {}
    if jars and location.is_s3:
        extra = ",".join(s3a_jars())
        artifacts["spark.jars"] = f"{artifacts['spark.jars']},{extra}" if "spark.jars" in artifacts else extra
    conf = {
        "spark.sql.extensions": "io.delta.sql.DeltaSparkSessionExtension",
        "spark.sql.catalog.spark_catalog": "org.apache.spark.sql.delta.catalog.DeltaCatalog",
        "spark.sql.catalogImplementation": "hive" if config.metastore_uri else "in-memory",
        "spark.sql.warehouse.dir": warehouse,
        **artifacts,
        **spark_settings(location),
        "spark.sql.shuffle.partitions": str(config.shuffle_partitions),
        # Delta rebuilds table state with this many partitions; its default of 50 dominates
        # small reads on one machine.
        "spark.databricks.delta.snapshotPartitions": str(max(1, config.shuffle_partitions)),
        # a Delta optimizer rule that folds the metrics of Delta's own commands walks every
        # expression of every query, twice or more -- a third of the time Spark takes to optimize
        # a large join's delta (its outputs are long CASE expressions) -- finding nothing
        "spark.databricks.delta.optimize.conditionalIncrementMetric.enabled": "false",
        "spark.ui.showConsoleProgress": "false",
        "spark.sql.session.timeZone": "UTC",
    }
    if config.metastore_uri:
        conf["spark.hadoop.hive.metastore.uris"] = config.metastore_uri
    conf.update(config.spark_conf)
    return conf


def build_session(config: TrickleConfig, warehouse: str):
    """Start (or reuse) the embedded local Spark session for ``warehouse``.

    The Delta jars are resolved from Maven Central by ``spark.jars.packages`` on first use
    (cached by Ivy in ``~/.ivy2.5.2``); later sessions load the resolved jars directly.
    """
    require_engine("an embedded Spark session")
    from pyspark.sql import SparkSession

    local = local_path(warehouse)
    if local:
        Path(local).mkdir(parents=True, exist_ok=True)
    running = running_warehouse()
    if running is not None and not same_warehouse(running, warehouse):
        # getOrCreate would hand back that session, whose warehouse is fixed at its start: every
        # table created here would land in the other warehouse
        raise TrickleError(
            f"this process already runs an embedded Spark session for the warehouse "
            f"{running!r}; it cannot serve {warehouse!r}",
            hint="one process's embedded Spark serves one warehouse: close the other Trickle first "
                 "(tr.close()), run over a Spark service (remote=...), or pass that session as spark=")
    builder = SparkSession.builder.master(config.spark_master).appName("airflow_trickle")
    for key, value in session_conf(config, warehouse).items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    _quiet_query_errors(spark)
    remember_resolved_jars(spark)
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


def running_warehouse() -> str | None:
    """The warehouse of the embedded Spark this process already runs (``None``: none runs).
    Asked of the running SparkContext, not of ``SparkSession.getActiveSession()``: once a
    process has made a Spark Connect session, that answers with the Connect one."""
    from pyspark import SparkContext

    context = SparkContext._active_spark_context
    return None if context is None else context.getConf().get("spark.sql.warehouse.dir", None)


def same_warehouse(first: str, second: str) -> bool:
    """Whether two spellings name one warehouse (``file:/w`` and ``/w/``; ``s3a://`` and ``s3://``).

    >>> same_warehouse("file:/data/wh", "/data/wh/"), same_warehouse("s3a://b/wh", "s3://b/wh")
    (True, True)
    >>> same_warehouse("/data/wh", "/data/other")
    False
    """
    def spelled(location: str) -> str:
        local = local_path(location)
        if local:
            return local.rstrip("/")
        return re.sub(r"^s3[an]?://", "s3://", location).rstrip("/")

    return spelled(first) == spelled(second)


def local_path(location: str) -> str | None:
    parsed = urlparse(location)
    if parsed.scheme in ("", "file"):
        return os.path.abspath(parsed.path if parsed.scheme else location)
    return None


def uses_in_memory_catalog(spark) -> bool:
    return spark.conf.get("spark.sql.catalogImplementation", "in-memory") == "in-memory"


def sync_warehouse_tables(spark, warehouse: "Location") -> None:
    """Make every Delta table stored under ``warehouse`` visible by name in ``spark``.

    Only for sessions on the in-memory catalog (the embedded default and the Spark service); a
    real metastore already shares names between applications.  Public catalog APIs and SQL
    only, so it works the same over Spark Connect: the listing (of the directory, or of the
    object-store prefix) runs here, the registrations on the server, whose in-memory catalog
    every Connect session shares.  Tables registered here are *external* (``CREATE TABLE ...
    LOCATION``): dropping a stream table removes its files explicitly
    (:func:`airflow_trickle.storage.tables.drop_storage_table`).
    """
    from airflow_trickle.location import Location, warehouse_tables

    location = Location.of(warehouse)  # a plain path: a local warehouse
    if not uses_in_memory_catalog(spark):
        return
    on_disk = warehouse_tables(location)
    # Only what changed in storage since the last sync costs catalog calls: with many tables a
    # full pass (a SHOW TABLES per database, an exists check per table) took a second.  What
    # appeared is checked name by name: an exists check costs a few milliseconds, while listing
    # a database's tables runs Spark jobs and grows with the database (measured, 200 tables: a
    # sync after one create 0.54-0.63 s by listing, 5-6 ms by name).
    seen = _seen_on_disk.setdefault((id(spark), location.uri), set())
    appeared = [key for key in sorted(on_disk) if key not in seen]
    databases: dict[str, bool] = {}  # database -> whether it existed before this sync
    for key in appeared:
        database, table = key.split(".", 1)
        if database not in databases:
            databases[database] = spark.catalog.databaseExists(database)
            if not databases[database]:
                spark.sql(f"CREATE DATABASE IF NOT EXISTS {quote_identifier(database)}")
        name = f"{quote_identifier(database)}.{quote_identifier(table)}"
        if table and not (databases[database] and spark.catalog.tableExists(name)):
            try:
                name_table_at(spark, name, on_disk[key])
            except Exception:  # noqa: BLE001 - a table being created or dropped right now: next sync
                continue
        seen.add(key)
    for key in sorted(seen - set(on_disk)):  # gone from disk since the last sync: dropped elsewhere
        seen.discard(key)
        database, table = key.split(".", 1)
        if table:
            try:
                spark.sql(f"DROP TABLE IF EXISTS {quote_identifier(database)}.{quote_identifier(table)}")
            except Exception:  # noqa: BLE001 - the name is unusable either way; the next sync retries
                seen.add(key)


def name_table_at(spark, quoted_name: str, location: str) -> None:
    """Register the Delta table at ``location`` as ``quoted_name`` (external), unless the name
    is taken: how a sync names what it finds, and how a stream table's storage is named."""
    spark.sql(f"CREATE TABLE IF NOT EXISTS {quoted_name} USING delta LOCATION {quote_string(location)}")


#: Per (session, warehouse): the tables a sync saw in storage (and made visible by name).
_seen_on_disk: dict[tuple[int, str], set[str]] = {}


def runtime_conf(config: TrickleConfig) -> dict[str, str]:
    """The part of :func:`session_conf` a session may set itself: its SQL settings, not the static keys."""
    from airflow_trickle.spark.address import STATIC_KEYS

    conf = session_conf(config, config.warehouse or "", secrets=False, jars=False)
    # only SQL settings (Spark's and Delta's) are a session's; the rest -- storage settings and
    # credentials, the driver's options, the UI -- are the server's, given when it started
    return {k: v for k, v in conf.items()
            if k not in STATIC_KEYS and k.startswith(("spark.sql.", "spark.databricks."))}


_CONNECT_MARK_LOCK = threading.Lock()


def connect_session(address: str, config: TrickleConfig, *, warehouse: str | None = None):
    """A new Spark Connect session on the service at ``address`` (``sc://host:port``).

    Fails at once, naming the address, when nothing listens there (the client would otherwise
    retry for ten minutes); a server that dies later fails the call within seconds, so the
    Airflow task fails and its retry recovers through the frontier protocol.  With
    ``warehouse``, the server must serve that warehouse: a different one would put tables
    where the catalog does not look.
    """
    from airflow_trickle.errors import TrickleError
    from airflow_trickle.spark.address import reachable, with_token, without_secrets

    require_engine("a session on the Spark service")
    remote, address = with_token(address, config.service_token), without_secrets(address)
    if not reachable(address):
        raise TrickleError(f"the Spark service at {address} is not reachable",
                           hint="start it with `trickle serve --warehouse WAREHOUSE` (the address it prints goes "
                                "into the spark_connect connection), or check the connection's host and port")
    from pyspark.errors.exceptions.connect import SparkConnectGrpcException
    from pyspark.sql import SparkSession

    # pyspark marks the whole process (and its children) as Spark Connect, after which a
    # classic session -- an embedded one, a spark-submit child -- cannot start.  The engine
    # calls only session and DataFrame methods, which need no such mark, so it is taken off
    # again -- under a lock: two threads making sessions at once would otherwise each see the
    # other's mark as one that was there before, and leave it.
    with _CONNECT_MARK_LOCK:
        connect_mode_before = os.environ.get("SPARK_CONNECT_MODE_ENABLED")
        # the settings go in one request with the session (one by one, ten of them took 0.08 s
        # of a refresh task); a static one the server started with its own value is skipped silently
        try:
            spark = SparkSession.builder.remote(remote).config(map=runtime_conf(config)).create()
        except SparkConnectGrpcException as err:
            if err.getGrpcStatusCode().name != "UNAUTHENTICATED":
                raise
            details = re.search(r'details = "([^"]*)"', err.getMessage())  # the gRPC status's words
            why = details.group(1) if details else err.getMessage()
            raise TrickleError(f"the Spark service at {address} refused the session: {why}",
                               hint="give the service's token: TRICKLE_SERVICE_TOKEN, or the password of the "
                                    "spark_connect connection") from None
        finally:
            if connect_mode_before is None:
                os.environ.pop("SPARK_CONNECT_MODE_ENABLED", None)
    _short_retries(spark)
    if warehouse is not None and uses_in_memory_catalog(spark):
        served = (local_path(default_warehouse(spark)) or default_warehouse(spark)).rstrip("/")
        wanted = (local_path(warehouse) or warehouse).rstrip("/")
        if served != wanted:
            spark.stop()
            raise TrickleError(f"the Spark service at {address} serves warehouse {served}, not {wanted}",
                               hint="start a service for this warehouse: trickle serve --warehouse " + wanted)
    return spark


def _short_retries(spark) -> None:
    """Give up on an unreachable server after seconds, not the client's default ten minutes."""
    try:
        from pyspark.sql.connect.client.retries import DefaultPolicy

        spark.client.set_retry_policies([DefaultPolicy(max_retries=6, initial_backoff=100, max_backoff=2000)])
    except Exception:  # noqa: BLE001 - an older client: its default policy stays
        pass
