"""One interface to commit a refresh's rows, two implementations: Spark, and delta-rs.

Every commit of a refresh carries the same tag (:class:`CommitTag`): the refresh's metadata
(frontier, refresh number: what recovery reads back), its idempotent transaction id (a replay
of the same refresh number is skipped, by Spark and delta-rs alike) and the writer lease's
fence, run just before the commit.  They are set here, once, for both engines.

:class:`SparkCommitter` runs a statement -- MERGE, INSERT, INSERT OVERWRITE -- under the tag.
:class:`DeltaRsCommitter` commits from the refreshing process, with Spark still computing every
value: a MERGE's resolved changes (``refresh/local_merge.py``, with a top-K's or a bag table's
changes resolved here plugged in), a FULL refresh's small result (``refresh/local_overwrite.py``)
or a bag table's difference (``refresh/local_difference.py``).  Where its path does not apply
it returns :class:`NotApplicable` with the reason, computing nothing twice: the writer then
commits through Spark and the refresh records the fallback.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from airflow_trickle.refresh.commit_tag import CommitTag, NotApplicable
from airflow_trickle.refresh.local_difference import apply_difference
from airflow_trickle.refresh.local_merge import merge_locally
from airflow_trickle.refresh.local_overwrite import append_locally, overwrite_locally
from airflow_trickle.spark.delta import refresh_commit
from airflow_trickle.sql.rewrite import hoist_nested_ctes


class SparkCommitter:
    """Statements run by Spark under the refresh's :class:`CommitTag`."""

    def __init__(self, env, tag: CommitTag):
        self.env, self.tag = env, tag

    def run(self, sql: str) -> dict | None:
        """Run ``sql`` (its MERGE-shaped metrics; None where Delta skipped it by the tag)."""
        self.tag.fence()
        with refresh_commit(self.env.spark, metadata=self.tag.metadata, txn_app_id=self.tag.txn_app_id,
                            txn_version=self.tag.txn_version):
            return self.env.engine.first(hoist_nested_ctes(sql))


class DeltaRsCommitter:
    """Commits from the refreshing process by delta-rs, of at most ``max_rows`` resolved rows
    (``local_commit_max_rows``), each value computed by Spark; :class:`NotApplicable` where not."""

    def __init__(self, env, st, tag: CommitTag):
        self.env, self.st, self.tag = env, st, tag
        self.max_rows = env.config.local_commit_max_rows

    def merge(self, merge_sql: str, *, resolved=None, expected_version: int | None = None):
        """``merge_sql`` applied (``refresh/local_merge.merge_locally``); ``resolved(table)``: its
        changes resolved in this process already (a top-K's, a bag table's)."""
        return merge_locally(self.env.spark, self.env.catalog.at(self.st.location), merge_sql, tag=self.tag,
                             max_rows=self.max_rows, resolved=resolved, expected_version=expected_version)

    def overwrite(self, rows_sql: str):
        """The stored rows replaced by ``rows_sql``'s (``refresh/local_overwrite.py``)."""
        return overwrite_locally(self.env.spark, self.env.catalog.at(self.st.location), rows_sql, tag=self.tag,
                                 max_rows=self.max_rows)

    def append(self, rows_sql: str):
        """``rows_sql``'s rows appended (``refresh/local_overwrite.append_locally``)."""
        return append_locally(self.env.spark, self.env.catalog.at(self.st.location), rows_sql, tag=self.tag,
                              max_rows=self.max_rows)

    def difference(self, result_sql: str, spark: SparkCommitter):
        """A bag table's difference with ``result_sql``'s rows, computed once and committed as a
        bag delta -- by delta-rs, or by ``spark`` where delta-rs does not write it
        (``refresh/local_difference.py``)."""
        st = self.st
        return apply_difference(self.env.spark, self.env.engine, self.env.catalog.at(st.location), result_sql,
                                target=st.name, columns=st.output_columns, dup_type=st.storage.dup_type,
                                max_rows=self.max_rows, merge=self.merge, commit=spark.run)


@dataclass
class Commits:
    """The two committers of one refresh, and the fallbacks from delta-rs to Spark taken."""

    spark: SparkCommitter
    delta_rs: DeltaRsCommitter
    fallbacks: list[str] = field(default_factory=list)

    def through_delta_rs(self, done, sql: str) -> dict | None:
        """``done`` (what delta-rs did), or -- where its path did not apply -- ``sql`` run by
        Spark, the reason recorded."""
        if isinstance(done, NotApplicable):
            self.fallbacks.append(done.reason)
            return self.spark.run(sql)
        return done
