"""Making a local warehouse's Delta tables visible by name (``sync_warehouse_tables``), without a
JVM: a recording stand-in for the session's catalog shows which calls a sync makes.

Every create and refresh syncs, so a sync must cost what changed on disk, not what the
warehouse holds: listing a database's tables runs Spark jobs and grows with the database.
"""
from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from airflow_trickle.spark import session


class RecordingCatalog:
    def __init__(self, databases: set[str], tables: set[str]):
        self.databases, self.tables, self.calls = databases, tables, []

    def databaseExists(self, name):  # noqa: N802 - pyspark's name
        self.calls.append(("databaseExists", name))
        return name in self.databases

    def tableExists(self, name):  # noqa: N802 - pyspark's name
        self.calls.append(("tableExists", name))
        return name.replace("`", "") in self.tables

    def listTables(self, *args, **kwargs):  # noqa: N802 - pyspark's name
        raise AssertionError("a sync lists no database's tables")


class RecordingSpark:
    """What ``sync_warehouse_tables`` uses of a session: its conf, catalog and ``sql``."""

    def __init__(self, databases=(), tables=()):
        self.catalog = RecordingCatalog(set(databases), set(tables))
        self.statements: list[str] = []
        self.conf = self

    def get(self, key, default=None):
        return "in-memory" if key == "spark.sql.catalogImplementation" else default

    def sql(self, text):
        self.statements.append(text)


def delta_table(root: Path, database: str, table: str) -> None:
    (root / f"{database}.db" / table / "_delta_log").mkdir(parents=True)


@pytest.fixture(autouse=True)
def fresh_memory():
    session._seen_on_disk.clear()
    yield
    session._seen_on_disk.clear()


def test_tables_on_disk_are_registered_once_and_only_what_appeared_is_checked(tmp_path):
    for name in ("a", "b", "c"):
        delta_table(tmp_path, "shop", name)
    spark = RecordingSpark(databases={"default", "shop"}, tables={"shop.a"})
    session.sync_warehouse_tables(spark, str(tmp_path))
    # shop.a is registered already; b and c are registered at their locations
    assert [s.split(" USING")[0] for s in spark.statements] == ["CREATE TABLE IF NOT EXISTS `shop`.`b`",
                                                                "CREATE TABLE IF NOT EXISTS `shop`.`c`"]
    assert str(tmp_path / "shop.db" / "b") in spark.statements[0]

    spark.catalog.calls.clear()
    spark.statements.clear()
    session.sync_warehouse_tables(spark, str(tmp_path))
    assert spark.catalog.calls == [] and spark.statements == []  # nothing changed on disk: no catalog call

    delta_table(tmp_path, "shop", "d")
    session.sync_warehouse_tables(spark, str(tmp_path))
    assert spark.catalog.calls == [("databaseExists", "shop"), ("tableExists", "`shop`.`d`")]
    assert len(spark.statements) == 1 and spark.statements[0].startswith("CREATE TABLE IF NOT EXISTS `shop`.`d`")


def test_a_new_database_is_created_and_its_tables_registered_without_checks(tmp_path):
    delta_table(tmp_path, "sales", "orders")
    spark = RecordingSpark(databases={"default"})
    session.sync_warehouse_tables(spark, str(tmp_path))
    assert spark.statements[0] == "CREATE DATABASE IF NOT EXISTS `sales`"
    assert spark.statements[1].startswith("CREATE TABLE IF NOT EXISTS `sales`.`orders` USING delta LOCATION")
    assert ("tableExists", "`sales`.`orders`") not in spark.catalog.calls


def test_a_table_gone_from_disk_is_dropped_by_name(tmp_path):
    delta_table(tmp_path, "shop", "a")
    spark = RecordingSpark(databases={"default", "shop"}, tables={"shop.a"})
    session.sync_warehouse_tables(spark, str(tmp_path))
    shutil.rmtree(tmp_path / "shop.db" / "a")
    session.sync_warehouse_tables(spark, str(tmp_path))
    assert spark.statements == ["DROP TABLE IF EXISTS `shop`.`a`"]


def test_a_session_already_running_for_another_warehouse_is_refused_not_reused(tmp_path, monkeypatch):
    """``getOrCreate`` would hand back a running session whose warehouse is fixed at its start,
    and every table would land in the other warehouse: refused, naming both (no JVM: the
    running session is a stand-in)."""
    from pyspark import SparkContext

    from airflow_trickle.config import TrickleConfig
    from airflow_trickle.errors import TrickleError

    conf = type("Conf", (), {"get": lambda self, key, default=None: "file:/data/first"})()
    monkeypatch.setattr(SparkContext, "_active_spark_context", type("Context", (), {"getConf": lambda self: conf})())
    with pytest.raises(TrickleError, match=r"already runs an embedded Spark session for the warehouse "
                                           r"'file:/data/first'; it cannot serve '.*second'"):
        session.build_session(TrickleConfig(), str(tmp_path / "second"))
    assert session.same_warehouse("file:/data/first", "/data/first/")
