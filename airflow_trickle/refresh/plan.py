"""One execution plan per refresh, decided before any row moves, and shown.

``refresh/decide.py`` chooses the action (FULL, DIFFERENTIAL, ...).  This module decides how
the action runs, once, from what the Delta logs say before anything is read:

* the **committer** (:func:`plan_commit`): Spark's MERGE / INSERT / OVERWRITE, or delta-rs from
  the refreshing process, with the rows the change is expected to touch and the bytes of the
  files a delta-rs commit would rewrite (files touched times their size);
* for each part of a DIFFERENTIAL's delta that could read its inputs through arrangements
  (``refresh/arranged.plan_lookups``), its **read path**: a lookup, or Spark's scans,
  with the change rows it reads into the process and the bytes of the arrangements it builds.

Every path that moves rows or bytes through the refreshing process has a bound checked here,
first: :data:`MAX_CHANGE_ROWS` change rows read into it, ``arrangement_build_max_bytes`` of a
table read to build an arrangement, ``local_commit_max_rows`` rows and ``local_commit_max_bytes``
bytes a delta-rs commit resolves and rewrites.  Above a bound the distributed path runs.  A
table with ``placement: spark`` runs everything there.  The code that executes obeys the plan;
where execution departs from it (an arrangement turned out stale, a commit path did not
apply), the refresh records a :class:`Fallback` with the cause.  The plan and its fallbacks
are kept in the refresh's history row and shown by ``trickle explain`` and ``trickle history``.
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace
from enum import StrEnum

from airflow_trickle.model import Action
from airflow_trickle.options import Placement
from airflow_trickle.refresh.writable import why_not_writable
from airflow_trickle.storage.deltalog import changed_rows, data_files, open_table, stored_row_count

#: A change of more rows than this (by its commits' metrics) is not read into the refreshing
#: process: Spark joins it.
MAX_CHANGE_ROWS = 2_000_000
#: A lookup that would gather more than this share of an arrangement's rows, and more than
#: ``PROBED_ROWS_FLOOR`` rows, is left to Spark's scan (counted before the rows are gathered):
#: rows handed to Spark as a local relation cost some microseconds each, a scan a fraction of
#: one (benchmarks/README.md, "TPC-H at SF 1, all 22: subqueries, outer joins and nested
#: aggregates probed").
MAX_PROBED_SHARE, PROBED_ROWS_FLOOR = 0.05, 100_000
#: A recursive CTE's changes with more distinct keys than this are not followed through an
#: arrangement (``refresh/arranged_recursion.py``): the recursions read their table.
MAX_SEED_KEYS = 100_000
#: A change of more rows than this is read by Spark's ``table_changes`` at each use instead of
#: once by delta-rs and handed over (``refresh/changes_once.py``): a local relation costs some
#: microseconds a row.
MAX_CHANGE_VIEW_ROWS = 200_000
#: A delta-rs commit reads the stored rows its change matches by delta-rs up to this many stored
#: rows (beyond, Spark reads them), and up to ``STORED_SHIPPED_WHOLE_ROWS`` all of them, shipped
#: whole to Spark with the query computing the changes (:func:`stored_read`).
STORED_READ_MAX_ROWS, STORED_SHIPPED_WHOLE_ROWS = 20_000_000, 20_000
#: A top-K's candidates collected into the refreshing process at most; more keep Spark's
#: checkpoint and probe (``refresh/differential.py``).
MAX_CANDIDATES = 100_000
#: Up to this many groups touched by an aggregate's input delta are counted into the process and
#: written into the SQL as literals; more are left to a subquery.
KNOWN_GROUPS_LIMIT = 10_000


class Committer(StrEnum):
    """Who commits a refresh's rows (``refresh/committer.py``)."""

    SPARK = "spark"
    DELTA_RS = "delta-rs"


class ReadPath(StrEnum):
    """How a part of a delta reads its inputs."""

    PROBED = "probed"  # looked up through arrangements, in the refreshing process
    READ_ONCE = "read once"  # a change read by delta-rs, handed to every scan of it
    SCANNED = "scanned"  # Spark's scans


class StoredRead(StrEnum):
    """How a delta-rs commit reads the stored rows its change matches (``refresh/stored_reads.py``)."""

    WHOLE = "stored rows shipped whole"  # a small table: all of it, with the change's query
    BY_KEYS = "stored rows read by key"  # the rows the change names, read by delta-rs
    SPARK = "stored rows read by Spark"  # a table too large to read here


def stored_read(stored_rows: float) -> StoredRead:
    """The way a delta-rs commit reads a stored table of ``stored_rows`` rows.

    >>> [stored_read(n).name for n in (10, 1_000_000, float("inf"))]
    ['WHOLE', 'BY_KEYS', 'SPARK']
    """
    if stored_rows <= STORED_SHIPPED_WHOLE_ROWS:
        return StoredRead.WHOLE
    return StoredRead.BY_KEYS if stored_rows <= STORED_READ_MAX_ROWS else StoredRead.SPARK


@dataclass(frozen=True)
class PlannedCommit:
    """The committer chosen, and what it is expected to move through the refreshing process."""

    committer: Committer
    reason: str
    rows: int | None = None  # stored rows the change is expected to touch
    bytes: int | None = None  # bytes of the files a delta-rs commit would rewrite
    stored_read: StoredRead | None = None  # a delta-rs commit's: how it reads the stored rows

    def line(self) -> str:
        how = f"; {self.stored_read}" if self.stored_read and self.committer is Committer.DELTA_RS else ""
        return f"commit: {self.committer} ({self.reason}{how})"


@dataclass(frozen=True)
class PlannedPart:
    """A part of the delta and the path it is planned to read its inputs by."""

    part: str  # e.g. ``"s.o change"``, ``"groups by cid"``
    path: ReadPath
    reason: str
    rows: int | None = None  # change rows read into the refreshing process
    bytes: int | None = None  # bytes read to build the arrangements it needs (a cold host)

    def line(self) -> str:
        moved = ", ".join(f"~{n:,} {unit}" for n, unit in ((self.rows, "rows"), (self.bytes, "bytes to arrange"))
                          if n)
        return f"{self.part}: {self.path} ({self.reason}{'; ' + moved if moved else ''})"


@dataclass(frozen=True)
class Fallback:
    """Where execution departed from the plan, and why."""

    part: str  # a part of the delta, or ``"commit"``
    planned: str
    taken: str
    cause: str

    def line(self) -> str:
        return f"fallback: {self.part} planned {self.planned}, ran {self.taken}: {self.cause}"


@dataclass(frozen=True)
class ExecutionPlan:
    """How one refresh runs: its action, its committer and each part's read path."""

    action: Action
    placement: Placement
    commit: PlannedCommit
    #: Whether delta-rs may commit at all (a FULL refresh's small result, decided by its size)
    delta_rs_allowed: bool = True
    parts: tuple[PlannedPart, ...] = ()
    fallbacks: tuple[Fallback, ...] = field(default=())


    def with_parts(self, parts) -> ExecutionPlan:
        return replace(self, parts=tuple(parts))

    def written_by(self, writer) -> ExecutionPlan:
        """The plan with the committer of ``writer`` (``refresh/writers.py``), chosen once the
        delta is known: an append or a FULL refresh's write may commit otherwise than planned."""
        if writer.committer == self.commit.committer:
            return self
        return replace(self, commit=replace(self.commit, committer=Committer(writer.committer), reason=writer.what))

    def with_fallbacks(self, fallbacks) -> ExecutionPlan:
        return replace(self, fallbacks=self.fallbacks + tuple(fallbacks))

    def lines(self) -> list[str]:
        return ([f"action: {self.action}" + (f" (placement: {self.placement})" if self.placement != Placement.AUTO
                                             else ""), self.commit.line()]
                + [p.line() for p in self.parts] + [f.line() for f in self.fallbacks])

    def to_dict(self) -> dict:
        def plain(value):
            return {k: str(v) if isinstance(v, StrEnum) else v for k, v in value.__dict__.items()}
        return {"action": str(self.action), "placement": str(self.placement), "commit": plain(self.commit),
                "parts": [plain(p) for p in self.parts], "fallbacks": [plain(f) for f in self.fallbacks]}


def placement_of(st) -> Placement:
    return Placement(st.options.placement or Placement.AUTO)


def plan_execution(env, st, action: Action, estimate) -> ExecutionPlan:
    """The plan of a refresh of ``st`` by ``action`` before its delta is planned: its committer
    (:func:`plan_commit`); the parts of a DIFFERENTIAL's delta are added once the DVM has
    planned it (``refresh/arranged.plan_lookups``)."""
    placement = placement_of(st)
    table = open_table(env.catalog.at(st.location)) if st.location else None
    unwritable = why_not_writable(table) if table is not None else None
    commit = plan_commit(env, st, action, estimate, unwritable=unwritable)
    if commit.committer is Committer.DELTA_RS and table is not None:
        commit = replace(commit, stored_read=stored_read(stored_row_count(table)))
    return ExecutionPlan(action, placement, commit,
                         delta_rs_allowed=(placement is not Placement.SPARK and env.config.local_commit_max_rows > 0
                                           and not unwritable))


def plan_commit(env, st, action: Action, estimate, *, unwritable: str | None = None) -> PlannedCommit:
    """The committer of a refresh of ``st`` by ``action``: delta-rs where it writes the table as
    Spark does (``unwritable``: why not) and the change is expected to touch at most
    ``local_commit_max_rows`` stored rows and rewrite at most ``local_commit_max_bytes`` of its
    files, else Spark."""
    config = env.config
    if placement_of(st) is Placement.SPARK:
        return PlannedCommit(Committer.SPARK, "placement: spark")
    if config.local_commit_max_rows <= 0:
        return PlannedCommit(Committer.SPARK, "local_commit_max_rows is 0")
    if estimate is None:
        return PlannedCommit(Committer.SPARK, "the change's size is not known")
    if unwritable:
        return PlannedCommit(Committer.SPARK, f"delta-rs does not write this table: {unwritable}")
    touched = estimate.touched_rows
    if touched > config.local_commit_max_rows:
        return PlannedCommit(Committer.SPARK, f"~{touched:,} stored rows touched, above local_commit_max_rows "
                                              f"{config.local_commit_max_rows:,}", rows=touched)
    rewritten = rewritten_bytes(env, st, touched) if action == Action.DIFFERENTIAL else None
    if rewritten is not None and rewritten > config.local_commit_max_bytes:
        return PlannedCommit(Committer.SPARK, f"a delta-rs commit would rewrite ~{rewritten:,} bytes of files, "
                                              f"above local_commit_max_bytes {config.local_commit_max_bytes:,}",
                             rows=touched, bytes=rewritten)
    return PlannedCommit(Committer.DELTA_RS, f"~{touched:,} stored rows touched", rows=touched, bytes=rewritten)


def rewritten_bytes(env, st, touched: int) -> int | None:
    """The bytes of the stored table's files a delta-rs commit touching ``touched`` stored rows
    rewrites (:func:`expected_rewrite`); None when there is no table yet."""
    return expected_rewrite(data_files(env.catalog.at(st.location)), touched) if st.location else None


def expected_rewrite(sizes: list[int], touched: int) -> int:
    """The bytes rewritten, on average, when ``touched`` rows are changed in files of ``sizes``:
    a stored row's file is where its identity hashes to, so the rows fall in
    ``files * (1 - (1 - 1/files) ** touched)`` of them.

    >>> expected_rewrite([100] * 10, 1), expected_rewrite([100] * 10, 10), expected_rewrite([100] * 10, 1000)
    (100, 651, 1000)
    >>> expected_rewrite([], 5)
    0
    """
    if not sizes:
        return 0
    files = len(sizes)
    return round(sum(sizes) * (1 - (1 - 1 / files) ** touched))


def change_rows_bound(location, old: int, new: int) -> tuple[int, str | None]:
    """``(the change's rows by its commits' metrics, why it is not read here or None)``."""
    rows = changed_rows(location, old, new)
    if rows > MAX_CHANGE_ROWS:
        return rows, f"a change of ~{rows:,} rows, above {MAX_CHANGE_ROWS:,}: Spark joins it"
    return rows, None

