"""A standalone Hive Metastore 3.1.3 on 127.0.0.1 for tests (Derby-backed, a directory of its own).

``org.apache.hive:hive-standalone-metastore:3.1.3:tar.gz:bin`` comes from Maven Central into
the project's cache folder, with ``commons-collections`` 3.2.2 which the tarball leaves out;
the Hadoop client classes and a few common libraries come from pyspark's own jars (the
tarball expects an installed Hadoop).  Spark 4.2's built-in Hive 2.3 client speaks to it.
"""
from __future__ import annotations

import os
import tarfile
from pathlib import Path

from tests.helpers.servers import LocalServer

HIVE = ("org.apache.hive", "hive-standalone-metastore", "3.1.3")
COLLECTIONS = ("commons-collections", "commons-collections", "3.2.2")
#: pyspark jars left off the metastore's classpath: its own Hive, Spark, and the libraries the
#: tarball carries in other versions.
_NOT_FROM_PYSPARK = ("hive-", "spark-", "derby", "datanucleus", "log4j", "scala-", "orc-", "parquet-", "arrow-",
                     "netty-", "jul-to")


def _installed() -> Path:
    from airflow_trickle.spark.jars import cache_root, maven_artifact

    home = cache_root() / "hive-metastore-3.1.3"
    if not (home / "lib").is_dir():
        archive = maven_artifact(*HIVE, classifier="bin", extension="tar.gz")
        unpacking = home.with_name(home.name + ".unpacking")
        with tarfile.open(archive) as tar:
            tar.extractall(unpacking)
        (next(unpacking.iterdir())).rename(home)
        unpacking.rmdir()
    return home


class Metastore(LocalServer):
    """A metastore serving ``thrift://127.0.0.1:<port>``, its database and warehouse in ``directory``."""

    name = "metastore"

    def __init__(self, directory: str | os.PathLike, warehouse: str):
        super().__init__(directory)
        self.warehouse = warehouse

    @property
    def uri(self) -> str:
        return f"thrift://127.0.0.1:{self.port}"

    def command(self) -> list[str]:
        import pyspark

        from airflow_trickle.spark.jars import maven_artifact

        home = _installed()
        conf = self.directory / "conf"
        conf.mkdir(parents=True, exist_ok=True)
        settings = {
            "javax.jdo.option.ConnectionURL": f"jdbc:derby:;databaseName={self.directory / 'metastore_db'};create=true",
            "javax.jdo.option.ConnectionDriverName": "org.apache.derby.jdbc.EmbeddedDriver",
            "datanucleus.schema.autoCreateAll": "true", "metastore.schema.verification": "false",
            "metastore.warehouse.dir": self.warehouse, "metastore.thrift.port": str(self.port),
            "metastore.expression.proxy": "org.apache.hadoop.hive.metastore.DefaultPartitionExpressionProxy",
            "metastore.task.threads.always": "org.apache.hadoop.hive.metastore.events.EventCleanerTask",
        }
        (conf / "metastore-site.xml").write_text("<configuration>\n" + "".join(
            f"  <property><name>{k}</name><value>{v}</value></property>\n" for k, v in settings.items())
            + "</configuration>\n")
        jars = Path(pyspark.__file__).parent / "jars"
        borrowed = [str(j) for j in sorted(jars.glob("*.jar")) if not j.name.startswith(_NOT_FROM_PYSPARK)]
        classpath = ":".join([str(conf), str(home / "lib" / "*"), str(maven_artifact(*COLLECTIONS)), *borrowed])
        return ["java", "-Xmx512m", "-cp", classpath, "org.apache.hadoop.hive.metastore.HiveMetaStore"]
