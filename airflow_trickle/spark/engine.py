"""The engine seam: the one place that knows a classic Spark session from a Spark Connect one.

The refresh path runs the same statements over an embedded session, the Spark service (Spark
Connect) and spark-submit jobs; everything it needs of Spark beyond ``sql`` -- local
checkpoints, temporary views, counting a refresh's Spark jobs, removing a dropped table's
files, quieting the JVM's logs -- goes through :class:`SparkEngine`, which chooses public
APIs where both kinds of session have them and says what a Connect session cannot do.
Nothing outside ``spark/`` touches py4j (``_jvm``, ``_jsc``) or ``sparkContext``.
"""
from __future__ import annotations

import contextlib
import logging
import threading

log = logging.getLogger(__name__)


def is_connect(spark) -> bool:
    """True for a Spark Connect session (no JVM in this process: public APIs only)."""
    try:
        from pyspark.sql.connect.session import SparkSession as ConnectSession
    except Exception:  # noqa: BLE001 - the Connect client's dependencies are missing: not Connect
        return False
    return isinstance(spark, ConnectSession)


def frame_of(spark, rows, schema=None):
    """A DataFrame of the Arrow table ``rows`` (in ``schema``'s Spark types when given), its
    chunks combined first.

    Why: PySpark 4.2's ``createDataFrame`` of an Arrow table whose first two record batches are
    empty returns no rows at all -- and a delta-rs scan with a filter yields one batch per data
    file, most of them empty (a bag table's deletes were lost that way once the table held a
    dozen files).  ``tests/test_spark_engine.py`` has the case."""
    rows = rows.combine_chunks()
    return spark.createDataFrame(rows) if schema is None else spark.createDataFrame(rows, schema=schema)


def expression(spark, text: str):
    """The column expression ``text`` (Spark SQL) for a DataFrame of ``spark``: pyspark's
    ``functions.expr`` picks the classic or Connect kind by a process-wide mark, not by the
    session, and a Connect session here runs without that mark."""
    if is_connect(spark):
        from pyspark.sql.connect.functions import expr
    else:
        from pyspark.sql.functions import expr
    return expr(text)


#: Rows above which a classic session gets a local relation as a distributed dataset of Arrow
#: batches rather than rows held in the query plan (:func:`_outside_the_plan`).
PLAN_HELD_MAX_ROWS = 10_000
_THRESHOLD = "spark.sql.execution.arrow.localRelationThreshold"
_THRESHOLD_LOCK = threading.Lock()


@contextlib.contextmanager
def session_settings(spark, settings: dict[str, str]):
    """Within: ``settings`` on the session (classic or Connect); after: each key as it was before
    -- its earlier value back, or unset where it had none.

    Why restore rather than unset: a key we set for one statement (a commit's metadata, a
    VACUUM's retention check) may be one the user set for the session, and must outlive us.
    Not thread-safe by itself: callers sharing a session across threads hold a lock around it.
    """
    conf = spark.conf
    before = {key: conf.get(key, None) for key in settings}
    try:
        for key, value in settings.items():
            conf.set(key, value)
        yield
    finally:
        for key, value in before.items():
            if value is None:
                conf.unset(key)
            else:
                conf.set(key, value)


@contextlib.contextmanager
def _outside_the_plan(spark, rows: int):
    """Within: an Arrow table of more than :data:`PLAN_HELD_MAX_ROWS` rows handed to a classic
    session becomes a dataset of its Arrow batches, not a ``LocalRelation``.

    Why: a ``LocalRelation`` carries its rows in the plan, and Spark's optimizer walks every
    element of a plan node's arguments in each rule that rewrites expressions -- a few hundred
    walks per query, over every row of a large relation (benchmarks/README.md, "TPC-H at SF 3,
    all 22: large local relations kept out of Spark's plans").  A small relation stays in the plan, where Spark folds projections over it at once.  Spark
    Connect sends local relations its own way (this setting is the server's).
    """
    if rows <= PLAN_HELD_MAX_ROWS or is_connect(spark):
        yield
        return
    with _THRESHOLD_LOCK, session_settings(spark, {_THRESHOLD: "0"}):
        yield


class SparkEngine:
    """What a refresh asks of a Spark session (``spark``, classic or Connect)."""

    def __init__(self, spark):
        self.spark = spark

    @property
    def is_connect(self) -> bool:
        return is_connect(self.spark)

    # -- statements -----------------------------------------------------------------------------

    def sql(self, text: str):
        return self.spark.sql(text)

    def first(self, text: str):
        """The first row of a statement (its metrics, for a MERGE)."""
        return self.spark.sql(text).first()

    def collect(self, text: str) -> list:
        return self.spark.sql(text).collect()

    def checkpoint(self, text: str, view: str) -> None:
        """Compute ``text`` once, into a local checkpoint readable as the temporary view ``view``
        (CTEs nested in subqueries are hoisted first: Spark plans them only at the top)."""
        from airflow_trickle.sql.rewrite import hoist_nested_ctes

        self.spark.sql(hoist_nested_ctes(text)).localCheckpoint().createOrReplaceTempView(view)

    def local_relation(self, rows, view: str, schema=None):
        """Hand the Arrow table ``rows`` (a change, or the rows a probe found: small) to Spark as
        the temporary view ``view``, and return its DataFrame (to read the rows again without
        sending them twice); string and binary views are sent as plain strings and bytes.
        ``schema`` (a Spark ``StructType``) gives the columns' Spark types where Arrow's would
        not be exact."""
        import pyarrow as pa

        fields = []
        for f in rows.schema:
            kind = f.type
            if pa.types.is_large_string(kind) or pa.types.is_string_view(kind):
                kind = pa.string()
            elif pa.types.is_large_binary(kind) or pa.types.is_binary_view(kind):
                kind = pa.binary()
            fields.append(pa.field(f.name, kind, nullable=True))
        plain = pa.schema(fields)
        if schema is None and not rows.num_rows:
            # Nothing to infer a schema from: Arrow's own, given.  Not ``createDataFrame([], ...)``,
            # which makes an RDD of Python rows -- Spark starts Python workers to read it (3.9 s
            # the first time in a process, 0.3 s after, on two cores).
            from pyspark.sql.pandas.types import from_arrow_schema

            schema = from_arrow_schema(plain)
        with _outside_the_plan(self.spark, rows.num_rows):
            frame = frame_of(self.spark, rows.cast(plain), schema=schema)
        frame.createOrReplaceTempView(view)
        return frame

    def drop_view(self, view: str) -> None:
        try:
            self.spark.catalog.dropTempView(view)
        except Exception:  # noqa: BLE001 - a view left behind is only a name in this session
            log.debug("could not drop the temporary view %s", view, exc_info=True)

    # -- jobs ----------------------------------------------------------------------------------

    def job_counter(self, job_group: str) -> "JobCounter | None":
        """Count the Spark jobs this thread starts from now on, under ``job_group``; None where
        the session has no status tracker (Spark Connect, or a stand-in session in tests)."""
        if self.spark is None or self.is_connect:
            return None
        try:
            context = self.spark.sparkContext
            tracker = context.statusTracker()
            context.setJobGroup(job_group, "airflow_trickle refresh", interruptOnCancel=False)
        except Exception:  # noqa: BLE001 - diagnostics only: no job count then
            return None
        return JobCounter(context, tracker, job_group)

    # -- files and logs ------------------------------------------------------------------------

    def interrupt(self) -> None:
        """Stop the Spark work this session has in flight (a writer that lost its lease)."""
        try:
            if self.is_connect:
                self.spark.interruptAll()
            else:
                self.spark.sparkContext.cancelAllJobs()
        except Exception:  # noqa: BLE001 - nothing in flight, or the session is gone
            pass

    def remove_path(self, location: str) -> None:
        """Remove the files under ``location`` through Hadoop's file system, where this process
        has a JVM (a classic session); over Spark Connect the server's managed ``DROP TABLE``
        removed them."""
        if self.is_connect:
            return
        jvm = self.spark._jvm
        path = jvm.org.apache.hadoop.fs.Path(location)
        fs = path.getFileSystem(self.spark._jsc.hadoopConfiguration())
        if fs.exists(path):
            fs.delete(path, True)

    def quiet_logs(self) -> None:
        """Only errors from Spark's own logs (a spark-submit job's driver)."""
        if not self.is_connect:
            self.spark.sparkContext.setLogLevel("ERROR")


class JobCounter:
    """The Spark jobs of one job group (a classic session's status tracker)."""

    def __init__(self, context, tracker, job_group: str):
        self._context, self._tracker, self._job_group = context, tracker, job_group

    def count(self) -> int | None:
        try:
            return len(self._tracker.getJobIdsForGroup(self._job_group))
        except Exception:  # noqa: BLE001 - diagnostics only
            return None

    def close(self) -> None:
        """Stop tagging this thread's jobs with the job group."""
        try:
            self._context.setLocalProperty("spark.jobGroup.id", None)
            self._context.setLocalProperty("spark.job.description", None)
        except Exception:  # noqa: BLE001 - diagnostics only
            pass
