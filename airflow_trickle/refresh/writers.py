"""How a refresh's rows reach storage: one small writer per way, behind one interface.

The action is decided before a writer is chosen (``refresh/decide.py``); a writer only says
which statement it runs and how it commits it:

=====================  =========================================================================
``DeltaMerge``         a DIFFERENTIAL MERGE, run by Spark
``LocalMerge``         the same MERGE resolved by Spark and committed by delta-rs, for small
                       changes (``refresh/local_merge.py``); Spark's MERGE when that cannot apply
``Append``             a DIFFERENTIAL delta that only adds rows: an INSERT, no MERGE
``LocalAppend``        the same rows computed by Spark and appended by delta-rs, for a small change
                       (``refresh/local_overwrite.append_locally``); Spark's INSERT else
``FirstFill``          the first population of empty storage: an INSERT of the recomputed rows
``Overwrite``          a FULL refresh nothing reads the change feed of: INSERT OVERWRITE
``LocalOverwrite``     the same rows computed by Spark and written by delta-rs, for a small table
                       and result (``refresh/local_overwrite.py``); Spark's overwrite else
``DiffMerge``          a FULL refresh a DIFFERENTIAL stream table reads: a MERGE of the difference
``LocalDiffMerge``     a bag table's difference computed once and committed by delta-rs as a small
                       bag delta (``refresh/local_difference.py``); Spark's MERGE when larger
``Replace``            a REINITIALIZE whose columns change: the storage table replaced in one commit
=====================  =========================================================================

``inserting`` writers return no MERGE metrics (they are read back from the commit) and
``rewriting`` ones replace every stored row.  A new way to write is a new class here and a line
in :func:`choose_writer`.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Callable, ClassVar

from sqlglot import exp, parse_one

from airflow_trickle.model import Action, RefreshMode, SourceType
from airflow_trickle.names import quote_name
from airflow_trickle.options import FullRefreshWrite
from airflow_trickle.refresh.committer import Commits
from airflow_trickle.sql.parse import DIALECT

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Writer:
    """A statement and the committer that commits it (``refresh/committer.py``)."""

    sql: str
    #: An INSERT or a CTAS: no MERGE metrics, they are read back from its commit.
    inserting: ClassVar[bool] = False
    #: Every stored row goes (it deleted as many as were stored before).
    rewriting: ClassVar[bool] = False
    #: Which committer it asks first: Spark, or delta-rs (Spark where delta-rs does not apply).
    committer: ClassVar[str] = "spark"
    #: What it commits, for the refresh's plan.
    what: ClassVar[str] = "a MERGE"

    def write(self, commits: Commits) -> dict | None:
        """Commit; the metrics (None: Delta skipped it, the transaction had landed)."""
        return commits.spark.run(self.sql)


class DeltaMerge(Writer):
    """A DIFFERENTIAL MERGE, run by Spark."""


@dataclass(frozen=True)
class LocalMerge(Writer):
    """The MERGE committed by delta-rs where that applies, else by Spark; ``resolved(table)``:
    its changes resolved in this process already (a top-K's, a bag table's), or None."""

    resolved: Callable | None = None
    committer: ClassVar[str] = "delta-rs"
    what: ClassVar[str] = "the MERGE's changes resolved by Spark"

    def write(self, commits: Commits) -> dict | None:
        return commits.through_delta_rs(commits.delta_rs.merge(self.sql, resolved=self.resolved), self.sql)


class Append(Writer):
    """A delta that only adds rows: an INSERT."""

    inserting = True
    what: ClassVar[str] = "an append: the change only adds rows"


@dataclass(frozen=True)
class LocalAppend(Append):
    """The append's rows (``rows_sql``, the INSERT's query) computed by Spark and appended by
    delta-rs where the plan expects a small change (``refresh/local_overwrite.append_locally``);
    Spark's INSERT (``sql``) where that does not apply."""

    rows_sql: str = ""
    committer: ClassVar[str] = "delta-rs"
    what: ClassVar[str] = "an append: the change only adds rows, computed by Spark and appended by delta-rs"

    def write(self, commits: Commits) -> dict | None:
        commits.through_delta_rs(commits.delta_rs.append(self.rows_sql), self.sql)
        return None  # an inserting writer's metrics are read back from its commit


class FirstFill(Writer):
    """The first population of empty storage: an INSERT."""

    inserting = True
    what: ClassVar[str] = "the first population: an INSERT"


class Overwrite(Writer):
    """A FULL refresh replacing every stored row: INSERT OVERWRITE."""

    inserting = rewriting = True
    what: ClassVar[str] = "INSERT OVERWRITE of the recomputed rows"


@dataclass(frozen=True)
class LocalOverwrite(Overwrite):
    """A FULL refresh replacing every stored row: ``rows_sql`` computed by Spark and written by
    delta-rs where the table and the result are small, else Spark's INSERT OVERWRITE (``sql``)."""

    rows_sql: str = ""
    committer: ClassVar[str] = "delta-rs"
    what: ClassVar[str] = "the recomputed rows, where they and the table hold at most local_commit_max_rows"

    def write(self, commits: Commits) -> dict | None:
        commits.through_delta_rs(commits.delta_rs.overwrite(self.rows_sql), self.sql)
        return None  # an inserting writer's metrics are read back from its commit


class DiffMerge(Writer):
    """A FULL refresh applied as a MERGE of the difference, run by Spark."""

    what: ClassVar[str] = "a MERGE of the difference"


@dataclass(frozen=True)
class LocalDiffMerge(DiffMerge):
    """A FULL refresh of a bag table applied as its difference, computed by Spark once and
    committed as a small bag delta (``refresh/local_difference.py``); a larger difference by
    Spark's MERGE of the whole statement (``sql``).  ``result_sql``: the recomputed rows."""

    result_sql: str = ""
    committer: ClassVar[str] = "delta-rs"
    what: ClassVar[str] = "the difference as a bag delta, where it holds at most local_commit_max_rows rows"

    def write(self, commits: Commits) -> dict | None:
        return commits.through_delta_rs(commits.delta_rs.difference(self.result_sql, commits.spark), self.sql)


class Replace(Writer):
    """The storage table replaced in one commit (a REINITIALIZE whose columns change)."""

    inserting = rewriting = True
    what: ClassVar[str] = "the storage table replaced"


def inserted_rows_sql(insert_sql: str) -> str:
    """The query of an ``INSERT INTO t (columns) <query>`` (its columns named as the list names them).

    >>> inserted_rows_sql("INSERT INTO s.t (a, b) SELECT a, b FROM (SELECT 1 AS a, 2 AS b)")
    'SELECT a, b FROM (SELECT 1 AS a, 2 AS b)'
    """
    insert = parse_one(insert_sql, dialect=DIALECT)
    if not isinstance(insert, exp.Insert):
        raise ValueError(f"not an INSERT: {insert_sql[:80]}")
    return insert.expression.sql(DIALECT)


def kept_clustering(st) -> list[str]:
    """The clustering columns a replaced storage table keeps: those of ``cluster_by`` its new
    columns still have (an ALTER of the query checked them; a source whose columns changed
    may have taken one away, and then the table is clustered by the others, with a warning)."""
    columns = {name.lower() for name, _ in st.storage.columns} or {name.lower() for name in st.output_columns}
    kept = [name for name in st.options.clustering if name.lower() in columns]
    if len(kept) < len(st.options.clustering):
        log.warning("%s: no longer clustered by %s (its new columns do not have them)", st.name,
                    ", ".join(n for n in st.options.clustering if n not in kept))
    return kept


def choose_writer(env, st, action: Action, current: dict[str, int], *, delta_sql: str | None, appending: bool,
                  local: bool, delta_rs: bool = True, resolved=None) -> Writer:
    """The writer of a decided refresh: ``delta_sql`` is the DIFFERENTIAL statement (None for
    FULL and REINITIALIZE), ``resolved`` its changes resolved in this process already (or None);
    ``local``: the plan commits the change through delta-rs (small enough for it); ``delta_rs``:
    the plan lets delta-rs commit at all (``refresh/plan.py``)."""
    from airflow_trickle.storage.deltalog import has_no_data_files
    from airflow_trickle.refresh.schema import storage_changes
    from airflow_trickle.storage.definitions import definition_properties
    from airflow_trickle.storage.tables import replace_storage_sql

    if delta_sql is not None:
        if appending:
            return LocalAppend(delta_sql, inserted_rows_sql(delta_sql)) if local else Append(delta_sql)
        return LocalMerge(delta_sql, resolved) if local else DeltaMerge(delta_sql)
    if action == Action.REINITIALIZE and storage_changes(env, st):
        rows = full_rows_sql(env, st, current)
        return Replace(replace_storage_sql(st.name, rows, st.output_columns, st.storage,
                                           definition_properties(st, env.catalog.dependencies(st.name)),
                                           cluster_by=kept_clustering(st)))
    # A FULL refresh into empty storage (the first population) has nothing to diff against: a
    # plain INSERT writes the same rows without the MERGE's scans and joins.  Only a table the
    # catalog has never seen populated is worth the log read (after a crash it may hold data).
    if not st.is_populated and has_no_data_files(env.catalog.at(st.location)):
        return FirstFill(fill_storage_sql(env, st, current))
    return full_writer(env, st, current, local=local, delta_rs=delta_rs)


def full_writer(env, st, current: dict[str, int], *, local: bool = False, delta_rs: bool = True) -> Writer:
    """A FULL recompute into populated storage: replace the stored rows in one INSERT OVERWRITE
    when no stream table reads this one's change feed (the diffing MERGE joins new and stored
    rows first), else MERGE only the difference (:func:`full_overwrites`) -- of a bag table
    through delta-rs when ``local`` (the cost model expects a small change)."""
    if full_overwrites(env, st):
        rows = full_storage_rows_sql(env, st, current)
        insert = fill_storage_sql(env, st, current, overwrite=True, rows=rows)
        return LocalOverwrite(insert, rows) if delta_rs else Overwrite(insert)
    if local and not st.storage.is_keyed and delta_rs:
        from airflow_trickle.refresh.full import bag_full_merge_sql, pinned_query_sql

        result = pinned_query_sql(env, st, current)
        return LocalDiffMerge(bag_full_merge_sql(st.name, result, st.output_columns, st.storage.dup_type), result)
    return DiffMerge(full_refresh_sql(env, st, current, overwrite=False))


def full_overwrites(env, st) -> bool:
    """Whether a FULL refresh of ``st`` replaces its stored rows (INSERT OVERWRITE) rather than
    MERGE the difference in (``full_refresh_write``: ``auto``, ``merge`` or ``overwrite``).

    Both leave the same rows.  The MERGE joins the recomputed rows with the stored ones to
    change only what differs, so its change feed holds only real changes -- what a stream table
    reading this one needs to stay cheap; the overwrite skips that join, and its change feed
    holds every row removed and added.  ``auto`` overwrites unless a stream table that refreshes
    DIFFERENTIAL reads this one (:func:`reads_change_feed`): a reader that runs FULL recomputes
    from the rows, never from the feed, and the MERGE's join makes each hop of a chain of FULL
    stream tables cost many times the overwrite (benchmarks/README.md, "FULL refreshes that no
    DIFFERENTIAL table reads overwrite; one that is read is applied as its difference").
    """
    how = st.options.full_write(env.config)
    if how != FullRefreshWrite.AUTO:
        return how == FullRefreshWrite.OVERWRITE
    readers = {dep.st_name for dep in env.catalog.dependencies()
               if dep.source_name == st.name and dep.source_type == SourceType.STREAM_TABLE}
    return not any(reads_change_feed(env.catalog.get(name)) for name in readers)


def reads_change_feed(reader) -> bool:
    """Whether the stream table ``reader`` (a catalog row; None: gone since, or not yet seen)
    may read its sources' change feeds: unless it refreshes FULL (as asked, or because its
    query has no delta).  A reader altered to DIFFERENTIAL later reads the feed from its
    frontier on: an overwrite there is exact, only larger (every row removed and added).

    >>> from types import SimpleNamespace as R
    >>> [reads_change_feed(R(effective_mode=m)) for m in ("DIFFERENTIAL", "FULL")], reads_change_feed(None)
    ([True, False], True)
    """
    return reader is None or str(reader.effective_mode) != RefreshMode.FULL.value


def full_rows_sql(env, st, current: dict[str, int]) -> str:
    """The stream table's rows at ``current``, visible and hidden columns: a FULL refresh's source.

    A bag table's copies are numbered without a shuffle, but for INT copy numbers (a table
    created by an older version: :func:`~airflow_trickle.refresh.full.numbered_rows_sql`)."""
    from airflow_trickle.dvm.apply import full_source_sql
    from airflow_trickle.refresh.differential import source_columns
    from airflow_trickle.refresh.full import numbered_rows_sql, pinned_query_sql

    if st.storage.is_keyed:
        return full_source_sql(st, source_columns(env, st), current)
    return numbered_rows_sql(pinned_query_sql(env, st, current), st.output_columns,
                             stable=st.storage.dup_type != "bigint")


def full_refresh_sql(env, st, current: dict[str, int], *, overwrite: bool | None = None) -> str:
    """The statement of a FULL refresh into populated storage: recompute at ``current``, then
    replace the stored rows (INSERT OVERWRITE) or MERGE only the difference in, as
    :func:`full_overwrites` decides unless ``overwrite`` says (a keyed table's by key, a bag
    table's by content: ``refresh/full.py``)."""
    from airflow_trickle.refresh.full import bag_full_merge_sql, full_merge_sql, pinned_query_sql

    if full_overwrites(env, st) if overwrite is None else overwrite:
        return fill_storage_sql(env, st, current, overwrite=True)
    if not st.storage.is_keyed:
        return bag_full_merge_sql(st.name, pinned_query_sql(env, st, current), st.output_columns,
                                  st.storage.dup_type)
    return full_merge_sql(st.name, full_rows_sql(env, st, current), st.output_columns + st.storage.state_names())


def fill_storage_sql(env, st, current: dict[str, int], *, overwrite: bool = False, rows: str | None = None) -> str:
    """The INSERT of a FULL refresh into empty storage (or, ``overwrite``, in place of every stored
    row): the recomputed rows (``rows``: :func:`full_storage_rows_sql`'s, when made already)."""
    rows = rows or full_storage_rows_sql(env, st, current)
    return f"INSERT {'OVERWRITE TABLE' if overwrite else 'INTO'} {quote_name(st.name)} ({_stored_columns(st)}) {rows}"


def full_storage_rows_sql(env, st, current: dict[str, int]) -> str:
    """The recomputed rows as stored: every stored column, visible and hidden, by name."""
    columns = _stored_columns(st)
    return f"SELECT {columns} FROM ({full_rows_sql(env, st, current)}) AS __full"


def _stored_columns(st) -> str:
    return ", ".join(f"`{c}`" for c in st.output_columns + [name for name, _ in st.storage.hidden_columns()])
