"""The Java artifacts Spark needs beyond pyspark's own, resolved once into a cache folder.

* **Delta** (``io.delta:delta-spark`` matching the installed pyspark and delta-spark): resolved
  by Spark's Ivy from Maven Central alone (an ``ivysettings.xml`` that names no other
  repository, so a first run prints no ``Host ... not found`` for repositories this machine
  cannot reach), without the Hadoop client jars pyspark already bundles; the resolved paths are
  remembered, so later sessions start without Ivy (faster, quiet, offline).
* **S3A** (Hadoop's S3 file system and the AWS SDK it calls), only when a warehouse is on S3:
  the three jars that match the Hadoop pyspark bundles, downloaded straight from Maven Central
  (the SDK bundle alone is 686 MB; it is fetched once, checked against its SHA-1).
* Any other artifact a test or a script starts a server from (s3proxy, a Hive metastore):
  :func:`maven_artifact`.

``python -m airflow_trickle.spark.resolve [--s3]`` resolves them ahead of time.
The cache folder is ``$TRICKLE_JAR_CACHE`` or ``~/.cache/airflow_trickle``.
"""
from __future__ import annotations

import hashlib
import importlib.metadata
import os
import sys
import tempfile
import urllib.request
from pathlib import Path

#: Where artifacts come from (``$TRICKLE_MAVEN_REPOSITORY`` for a mirror).
MAVEN_CENTRAL = "https://repo1.maven.org/maven2"
#: Jars pyspark bundles in a newer version than Delta's dependency list names.
_BUNDLED_BY_PYSPARK = ("org.apache.hadoop:hadoop-client-api", "org.apache.hadoop:hadoop-client-runtime")
#: The S3A artifacts matching each Hadoop version pyspark bundles (read from hadoop-aws's POM).
S3A_ARTIFACTS = {
    "3.5.0": (("org.apache.hadoop", "hadoop-aws", "3.5.0"),
              ("software.amazon.awssdk", "bundle", "2.35.4"),
              ("software.amazon.s3.analyticsaccelerator", "analyticsaccelerator-s3", "1.3.1")),
}


def cache_root() -> Path:
    root = os.environ.get("TRICKLE_JAR_CACHE") or os.path.join(os.path.expanduser("~"), ".cache", "airflow_trickle")
    return Path(root)


# -- Delta, through Spark's Ivy ------------------------------------------------------------------


def delta_package() -> str:
    """Maven coordinates of the Delta jar matching the installed pyspark and delta-spark: from
    Delta 4.1 one artifact per Spark minor version, before it one for Spark 4.0."""
    return delta_coordinates(importlib.metadata.version("pyspark"), importlib.metadata.version("delta-spark"))


def delta_coordinates(pyspark_version: str, delta_version: str) -> str:
    """
    >>> delta_coordinates("4.2.0", "4.4.0"), delta_coordinates("4.0.1", "4.0.0")
    ('io.delta:delta-spark_4.2_2.13:4.4.0', 'io.delta:delta-spark_2.13:4.0.0')
    """
    spark_minor = ".".join(pyspark_version.split(".")[:2])
    if tuple(int(part) for part in delta_version.split(".")[:2]) < (4, 1):
        return f"io.delta:delta-spark_2.13:{delta_version}"
    return f"io.delta:delta-spark_{spark_minor}_2.13:{delta_version}"


def _delta_cache_file() -> Path:
    return cache_root() / (delta_package().replace(":", "_") + ".jars")


def _bundled(jar: str) -> bool:
    name = os.path.basename(jar)
    return any(name.startswith(coordinate.replace(":", "_") + "-") for coordinate in _BUNDLED_BY_PYSPARK)


def delta_jars_conf() -> dict[str, str]:
    """``spark.jars`` with the Delta jars resolved earlier, else the settings that resolve them."""
    cache = _delta_cache_file()
    if cache.is_file():
        jars = [line.strip() for line in cache.read_text().splitlines() if line.strip() and not _bundled(line.strip())]
        if jars and all(os.path.isfile(j) for j in jars):
            return {"spark.jars": ",".join(jars)}
    return {"spark.jars.packages": delta_package(), "spark.jars.ivySettings": str(_ivy_settings()),
            "spark.jars.excludes": ",".join(_BUNDLED_BY_PYSPARK)}


def _ivy_settings() -> Path:
    """An Ivy configuration that asks Maven Central (or the configured mirror) only."""
    repository = os.environ.get("TRICKLE_MAVEN_REPOSITORY", MAVEN_CENTRAL).rstrip("/")
    ivy_home = os.path.join(os.path.expanduser("~"), ".ivy2.5.2")
    text = f"""<ivysettings>
  <settings defaultResolver="trickle"/>
  <caches defaultCacheDir="{ivy_home}/cache"/>
  <resolvers>
    <ibiblio name="trickle" m2compatible="true" root="{repository}/"/>
  </resolvers>
</ivysettings>
"""
    path = cache_root() / "ivysettings.xml"
    if not path.is_file() or path.read_text() != text:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return path


def remember_resolved_jars(spark) -> None:
    """After a session resolved Delta through Ivy: remember the jars' paths for later sessions."""
    conf = spark.sparkContext.getConf()
    if not conf.get("spark.jars.packages", None):
        return
    jars = [j.removeprefix("file://").removeprefix("file:") for j in (conf.get("spark.jars", "") or "").split(",") if j]
    jars = [j for j in jars if not _bundled(j) and not j.startswith(str(cache_root() / "maven"))]
    if jars and all(os.path.isfile(j) for j in jars):
        cache = _delta_cache_file()
        cache.parent.mkdir(parents=True, exist_ok=True)
        cache.write_text("\n".join(jars) + "\n")


# -- artifacts fetched directly ------------------------------------------------------------------


def maven_artifact(group: str, artifact: str, version: str, *, classifier: str | None = None,
                   extension: str = "jar") -> Path:
    """The artifact's file in the cache, downloaded from Maven Central the first time (checked
    against the repository's SHA-1, written under a temporary name and renamed, so a download
    killed halfway leaves nothing that looks complete)."""
    name = f"{artifact}-{version}{'-' + classifier if classifier else ''}.{extension}"
    target = cache_root() / "maven" / group.replace(".", "/") / artifact / version / name
    if target.is_file():
        return target
    repository = os.environ.get("TRICKLE_MAVEN_REPOSITORY", MAVEN_CENTRAL).rstrip("/")
    url = f"{repository}/{group.replace('.', '/')}/{artifact}/{version}/{name}"
    target.parent.mkdir(parents=True, exist_ok=True)
    print(f"airflow_trickle: downloading {url}", file=sys.stderr)
    digest = hashlib.sha1()
    with tempfile.NamedTemporaryFile(dir=target.parent, prefix=f".{name}.", delete=False) as part:
        try:
            with urllib.request.urlopen(url, timeout=60) as response:
                while chunk := response.read(1 << 20):
                    digest.update(chunk)
                    part.write(chunk)
            with urllib.request.urlopen(url + ".sha1", timeout=60) as response:
                expected = response.read().decode().split()[0].strip().lower()
        except BaseException:
            os.unlink(part.name)
            raise
    if digest.hexdigest() != expected:
        os.unlink(part.name)
        raise OSError(f"{url}: SHA-1 {digest.hexdigest()} does not match the repository's {expected}")
    os.replace(part.name, target)
    return target


def bundled_hadoop_version() -> str:
    """The Hadoop version whose client jars pyspark ships."""
    import pyspark

    jars = Path(pyspark.__file__).parent / "jars"
    for jar in sorted(jars.glob("hadoop-client-api-*.jar")):
        return jar.name[len("hadoop-client-api-"):-len(".jar")]
    raise OSError(f"no hadoop-client-api jar in {jars}")


def s3a_jars() -> list[str]:
    """Paths of Hadoop's S3A and the AWS SDK for the bundled Hadoop (downloaded once)."""
    hadoop = bundled_hadoop_version()
    artifacts = S3A_ARTIFACTS.get(hadoop)
    if artifacts is None:
        raise OSError(f"airflow_trickle knows no S3A jars for Hadoop {hadoop} (pyspark "
                      f"{importlib.metadata.version('pyspark')}); put org.apache.hadoop:hadoop-aws:{hadoop} and "
                      "the AWS SDK it names into spark_conf['spark.jars']")
    return [str(maven_artifact(*coordinates)) for coordinates in artifacts]
