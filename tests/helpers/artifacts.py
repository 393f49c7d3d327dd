"""Fetch what the tests' servers and the S3 warehouse need, once, before the tests run.

    python -m tests.helpers.artifacts

The S3A jars (``airflow_trickle.spark.jars.s3a_jars``), s3proxy, the standalone Hive metastore
and the library its tarball leaves out, from Maven Central into the project's cache folder
(``run-tests.sh`` runs this, so the tests themselves need no network); then the class-data
archive of Spark's classes the suite's Spark JVMs start from (``tests/helpers/class_archive.py``).
"""
import sys

from airflow_trickle.spark.jars import maven_artifact, s3a_jars
from tests.helpers import class_archive, metastore, s3proxy


def main() -> int:
    s3a_jars()
    maven_artifact(*s3proxy.S3PROXY, classifier="jar-with-dependencies")
    maven_artifact(*metastore.HIVE, classifier="bin", extension="tar.gz")
    maven_artifact(*metastore.COLLECTIONS)
    class_archive.make()
    return 0


if __name__ == "__main__":
    sys.exit(main())
