"""Housekeeping: storage and catalog tables stay small however many refreshes they take.

Every refresh commits a few small files to its storage table (and rows to the catalog), so
without care a table that refreshes every minute gathers thousands of files a week and every
read of it slows down.  :func:`maintain` compacts each stream table's storage (``OPTIMIZE``:
no data change, so readers of its change feed see nothing; on a table with ``cluster_by`` it
also clusters the rows written since the last run, so that file skipping works on those
columns) and removes the files no version worth keeping needs (``VACUUM``) -- with a retention long enough for every stream table that
reads it: a reader whose frontier is version F still needs the files of F and of the changes
after it, which are all younger than the commit F + 1, so the retention is stretched to reach
back past that commit.  The catalog tables are compacted and vacuumed likewise (with delta-rs).
``trickle maintain`` runs it.
"""
from __future__ import annotations

import logging
import math
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING

from airflow_trickle.catalog.model import utcnow
from airflow_trickle.ops.health import DEFAULT_DELETED_FILE_RETENTION, parse_interval
from airflow_trickle.names import quote_name
from airflow_trickle.spark.engine import session_settings
from airflow_trickle.storage.lease import lease_of

if TYPE_CHECKING:
    from airflow_trickle.location import Location

log = logging.getLogger(__name__)

_CHECK = "spark.databricks.delta.retentionDurationCheck.enabled"
#: VACUUM lists the table's directory in this many Spark tasks (Spark's default, 10000, made a
#: small table's VACUUM take 38 s on 2 cores instead of 3 s); set from the table's file count.
_LISTING = "spark.sql.sources.parallelPartitionDiscovery.parallelism"
#: Added to the history a reader needs.
MARGIN_HOURS = 0.25


@dataclass
class Maintained:
    """What maintenance did to one table."""

    table: str
    active_files_before: int
    active_files_after: int
    #: Data files in storage (active or not) before and after, as listed there.
    files_on_disk_before: int | None
    files_on_disk_after: int | None
    #: The VACUUM retention used (hours), and why it is longer than asked, if it is.
    retained_hours: float
    note: str = ""


def maintain(env, names: list[str] | None = None, *, retention_hours: float | None = None,
             now: datetime | None = None) -> list[Maintained]:
    """OPTIMIZE and VACUUM the storage of ``names`` (default: every stream table), then compact
    the catalog.  ``retention_hours``: the VACUUM retention to aim for (default: each table's
    ``delta.deletedFileRetentionDuration``, 7 days unless set); it is stretched for readers that
    still need older files, never shortened below what they need."""
    now = now or utcnow()
    tables = {st.name: st for st in env.catalog.list()}
    wanted = list(names) if names else sorted(tables)
    dependencies = env.catalog.dependencies()
    done = []
    for name in wanted:
        st = tables.get(name)
        if st is None or not st.location:
            continue
        with lease_of(env, [name]):  # OPTIMIZE and VACUUM commit to the storage table
            done.append(_maintain_storage(env, st, [d for d in dependencies if d.source_name == name], tables,
                                          retention_hours, now))
    done += _maintain_catalog(env)
    return done


def needed_hours(location: "Location", readers, tables, now: datetime) -> tuple[float, str]:
    """Hours of history the readers of the table at ``location`` still need, and which reader
    needs the most (0 when every reader is up to date)."""
    from airflow_trickle.storage.deltalog import commit_history, commit_time, latest_version

    latest = latest_version(location)
    behind = {}
    for dep in readers:
        reader = tables.get(dep.st_name)
        frontier = reader.frontier.get(dep.source_name) if reader else None
        if reader is not None and reader.effective_mode == "DIFFERENTIAL" and frontier is not None \
                and frontier < latest:
            behind[reader.name] = frontier
    if not behind:
        return 0.0, ""
    slowest = min(behind, key=behind.get)
    commits = {int(c["version"]): c for c in commit_history(location, latest - behind[slowest]) if "version" in c}
    since = commit_time(commits.get(behind[slowest] + 1))
    if since is None:  # the commit is gone from the log: nothing left to protect
        return 0.0, ""
    return max(0.0, (now - since).total_seconds() / 3600), slowest


def _maintain_storage(env, st, readers, tables, retention_hours, now) -> Maintained:
    from airflow_trickle.storage.deltalog import active_file_count, table_configuration

    table = quote_name(st.name)
    location = env.catalog.at(st.location)
    active_before, disk_before = active_file_count(location), _files_on_disk(location)
    env.spark.sql(f"OPTIMIZE {table}")
    default = parse_interval(table_configuration(location).get("delta.deletedFileRetentionDuration"),
                             DEFAULT_DELETED_FILE_RETENTION).total_seconds() / 3600
    aim = default if retention_hours is None else float(retention_hours)
    for_readers, needed, slowest = readers_retention(location, readers, tables, now)
    retained = max(aim, for_readers)
    note = (f"retention stretched to {retained:g}h: {slowest} still reads the version before a commit "
            f"of {needed:.2f}h ago" if retained > aim else "")
    vacuum(env.spark, table, retained, active_files=active_before, below_table_retention=retained < default)
    result = Maintained(st.name, active_before, active_file_count(location), disk_before,
                        _files_on_disk(location), retained, note)
    log.info("maintained %s: %s", st.name, result)
    return result


def readers_retention(location: "Location", readers, tables, now: datetime) -> tuple[float, float, str]:
    """The VACUUM retention (hours) the readers of the table at ``location`` need -- 0 when every
    one is up to date -- with the hours they need and the slowest of them (:func:`needed_hours`).

    A margin for the moments between this reading of the clock and the VACUUM's own; whole
    hours, because Delta rounds a VACUUM's retention to the nearest hour."""
    needed, slowest = needed_hours(location, readers, tables, now)
    return (float(math.ceil(needed + MARGIN_HOURS)) if slowest else 0.0), needed, slowest


def vacuum(spark, table: str, retained_hours: float, *, active_files: int, below_table_retention: bool) -> None:
    """``VACUUM table RETAIN retained_hours HOURS`` (``table`` quoted), its directory listed in a
    few Spark tasks (:func:`_listing_parallelism`); ``below_table_retention``: shorter than the
    table's own retention, which Delta refuses unless its check is off."""
    settings = _listing_parallelism(active_files)
    if below_table_retention:
        settings[_CHECK] = "false"
    with session_settings(spark, settings):
        spark.sql(f"VACUUM {table} RETAIN {retained_hours:g} HOURS")


def _listing_parallelism(active_files: int) -> dict[str, str]:
    """The setting that has a VACUUM of a table of ``active_files`` files list its directory in
    a few Spark tasks rather than Spark's default 10,000 (:data:`_LISTING`).

    >>> _listing_parallelism(120), _listing_parallelism(50_000)
    ({'spark.sql.sources.parallelPartitionDiscovery.parallelism': '8'}, {'spark.sql.sources.parallelPartitionDiscovery.parallelism': '500'})
    """
    return {_LISTING: str(max(8, min(10000, active_files // 100)))}


def _maintain_catalog(env) -> list[Maintained]:
    """Compact the catalog tables; first, with ``history_retention_days`` set, remove the refresh
    history older than that (each stream table keeps its newest rows whatever their age)."""
    from datetime import timedelta

    pruned = ""
    days = getattr(env.config, "history_retention_days", None)
    if days is not None:
        removed = env.catalog.prune_history(utcnow() - timedelta(days=float(days)))
        pruned = f"; {removed} history rows older than {float(days):g} days removed"
        log.info("refresh history: %s rows older than %g days removed", removed, float(days))
    done = []
    for table, before, after in env.catalog.compact_all():
        note = "compacted with delta-rs" + (pruned if table == "refresh_history" else "")
        done.append(Maintained(f"_trickle.{table}", before, after, None, None, 0.0, note))
    return done


def _files_on_disk(location: "Location") -> int | None:
    """Data files (Parquet, change files) in a table's storage, the log left out (a listing of
    the directory or the object-store prefix); None when it cannot be listed."""
    try:
        return sum(1 for path in location.list_files(".parquet") if not path.startswith("_delta_log/"))
    except Exception:  # noqa: BLE001 - an unlistable store: the count is informative only
        return None
