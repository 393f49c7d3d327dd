"""A recursive CTE's iterations read the rows of its joined table their keys reach, looked up
in an arrangement, instead of scanning the table at every level.

A refresh of a recursive CTE runs two recursions (``dvm/recursive.py``): the derivations
removed, from their seed through E's kept rows, and those added, through E's new rows.  Spark
runs each as a loop of jobs, and each iteration scans E again -- a refresh of an org chart of
100,000 people ran 45 jobs and cost more than recomputing the chart.  Where the term joins E on
``E.a = r.b`` and carries E's own column c as the next level's b
(:class:`~airflow_trickle.dvm.reach.ReachKey`), the rows of E a recursion can reach follow
from the keys its seed can hold and E alone: E's rows with a among the keys, their c the next
level's keys, and so on until no row of E matches.  The seed's keys are known from the changes
before any recursion runs -- a seed row is a changed base row, or a row stepped through a
changed row of E, carrying that row's c -- so the rows are looked up once the changes are
read, level by level in E's arrangement by a (``storage/arrangements.py``, at the version each
recursion reads E at), handed to Spark as local relations, and bound with the number of levels
the keys reach: the recursions then join a few rows instead of E, unrolled into one statement
when the levels are few.  A row of E no key reaches joins no row of the recursion, so the
result is the same.  The seeds also join r's old rows through E's change only: where r's old
rows are the stream table's, delta-rs reads just those whose key E's change holds.

Everything here is an optimisation, exact either way: no arrangement (turned off, a key that is
not an integer or a date, a table delta-rs does not read), more reachable rows than a lookup
pays for, or any error, and the recursion reads E as before.
"""
from __future__ import annotations

import logging
import time

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from airflow_trickle.dvm.base import Versions
from airflow_trickle.dvm.reach import ReachKey
from airflow_trickle.dvm.bindings import Reach
from airflow_trickle.dvm.recursive import MAX_UNROLLED_LEVELS
from airflow_trickle.options import Placement
from airflow_trickle.refresh.writable import why_not_writable
from airflow_trickle.refresh.lookup import DECLINED, SourceTables, arrangements_of, check_share, comparable, handed_to_spark
from airflow_trickle.refresh.plan import MAX_SEED_KEYS, placement_of
from airflow_trickle.storage.arrangement import Stale, Unarrangeable
from airflow_trickle.storage.deltalog import open_table

log = logging.getLogger(__name__)

#: The keys are followed this many levels at most when counting them (the plan is unrolled up to
#: :data:`~airflow_trickle.dvm.recursive.MAX_UNROLLED_LEVELS`); past it -- a cycle in E, or a
#: deep hierarchy -- the rows reached are still collected, and Spark's recursion runs over them.
MAX_COUNTED_LEVELS = 100


class RecursionLookups:
    """The lookups of one refresh's recursions: called with each part of a recursive CTE's
    delta once it is computed (``refresh/differential.statement``), it returns the versions
    with what the part let it look up bound in -- once E's change and the base's are computed,
    r's stored rows E's change joins, and the rows of E each recursion reaches -- or the
    versions unchanged.  ``built`` collects the milliseconds spent building arrangements (kept apart
    from the delta's cost)."""

    def __init__(self, env, plan, scratch: list[str], built: list[int] | None = None):
        self.env, self.plan, self.scratch, self.built = env, plan, scratch, built
        self.lines: list[str] = []
        self._ready: dict[int, object] = {}

    def __call__(self, node, part: str, view: str, v: Versions) -> Versions:
        key: ReachKey | None = getattr(node, "reach_key", None)
        change_view = v.bindings.part(node, "__trickle_e_delta")
        if (part != "__trickle_base_delta" or key is None or change_view is None
                or placement_of(self.plan.st) is Placement.SPARK):
            return v
        # the keys both lookups need, in one statement over the two changes (small)
        rows = self.env.engine.collect(
            f"SELECT DISTINCT * FROM (SELECT 0 AS __which, `{key.other_key}` AS __k FROM {change_view} "
            f"UNION ALL SELECT 1, `{key.next_key or key.other_key}` FROM {change_view} "
            f"UNION ALL SELECT 1, `{key.self_key}` FROM {view}) AS __keys WHERE __k IS NOT NULL "
            f"LIMIT {2 * MAX_SEED_KEYS + 1}")
        if len(rows) > 2 * MAX_SEED_KEYS:  # cut by the LIMIT: neither list is known whole
            self.lines.append(f"{node.name}: more than {MAX_SEED_KEYS} keys in the changes; read by Spark")
            return v
        joined, reached = ([row[1] for row in rows if row[0] == which] for which in (0, 1))
        v = self._old_joined(node, _keys(joined), v)
        return self._reach(node, _keys(reached), v)

    def _old_joined(self, node, keys: pa.Array | None, v: Versions) -> Versions:
        """``v`` with the stored rows of r that E's change can join (their key among the
        change's) read by delta-rs and bound: both seeds step r's old rows through E's change
        only, so they need no other row -- Spark would scan the stream table for them, and
        first rebuild its snapshot after delta-rs's last commit (0.4-1 s at 100,000 rows)."""
        key: ReachKey | None = getattr(node, "reach_key", None)
        if key is None or not node.stored_columns or not self.plan.st.location:
            return v
        stored_key = node.stored_columns[node.columns.index(key.self_key)]
        try:
            if keys is None:
                raise Stale(f"more than {MAX_SEED_KEYS} keys in E's change")
            table = open_table(self.env.catalog.at(self.plan.st.location))
            why_not = why_not_writable(table)  # what delta-rs reads as Spark does: the tables it writes
            if why_not:
                raise Stale(f"delta-rs does not read the stream table as Spark does: {why_not}")
            kind = pa.schema(table.schema().to_arrow()).field(stored_key).type
            if len(keys) and not comparable(keys.type, kind):
                raise Stale(f"a key of type {kind} is not looked up here")
            dataset = table.to_pyarrow_dataset()
            rows = (dataset.to_table(columns=list(node.stored_columns), filter=pc.field(stored_key).isin(keys.cast(kind)))
                    if len(keys) else dataset.schema.empty_table().select(list(node.stored_columns)))
            if rows.num_rows > MAX_SEED_KEYS:
                raise Stale(f"{rows.num_rows} stored rows match E's change")
            rows = rows.rename_columns(list(node.columns))
        except DECLINED as err:  # Spark reads the stream table
            self.lines.append(f"{node.name}: its old rows read by Spark ({type(err).__name__}: {err})")
            log.info("%s: the stored rows are read by Spark: %s", self.plan.st.name, err,
                     exc_info=not isinstance(err, Stale))
            return v
        view = handed_to_spark(self.env, rows, node.columns, self.scratch).view
        self.lines.append(f"{node.name}: {rows.num_rows} stored rows joined by E's change, read by delta-rs")
        return v.bound(v.bindings.with_old_joined(node, view))

    def _reach(self, node, keys: pa.Array | None, v: Versions) -> Versions:
        """``v`` with the rows of E each recursion can reach bound (``"reach removed"`` at E's old
        version, ``"reach added"`` at its new), from every key a seed can hold: a seed row is a
        changed base row (its key in the base's change) or a row stepped through a changed row
        of E (carrying that row's next key, or, passed on, the key it joined by)."""
        key: ReachKey | None = getattr(node, "reach_key", None)
        arrangements = arrangements_of(self.env.config)
        if arrangements is None:
            return v
        source = node.other.name
        try:
            tables = SourceTables(self.env, self.plan.st.name)
            if source not in tables.locations:
                return v
            if keys is None:
                self.lines.append(f"{node.name}: more than {MAX_SEED_KEYS} keys in the changes; {source} scanned")
                return v
            arranged = self._arrangement(node, key, tables, arrangements, v)
            if len(keys) and not comparable(keys.type, arranged.base.schema.field(key.other_key).type):
                raise Stale(f"a key of type {keys.type} is not looked up in the arrangement")
            reached = {recursion: reach(arranged, v.at(which)[source], keys, key)
                       for recursion, which in (("removed", "old"), ("added", "new"))}
        except DECLINED as err:  # the recursions read E
            self.lines.append(f"{node.name}: {source} scanned at every level ({type(err).__name__}: {err})")
            log.info("%s: the recursions scan %s: %s", self.plan.st.name, source, err,
                     exc_info=not isinstance(err, (Stale, Unarrangeable)))
            return v
        for recursion, (rows, levels) in reached.items():
            view = handed_to_spark(self.env, rows, key.columns, self.scratch).view
            v = v.bound(v.bindings.with_reach(node, recursion, Reach(view, levels)))
            self.lines.append(
                f"{node.name} {recursion}: {len(keys)} keys of the changes reach {rows.num_rows} rows of {source}"
                + (f" in {levels} levels (unrolled)" if levels is not None and levels <= MAX_UNROLLED_LEVELS
                   else " (levels not counted: Spark's recursion over them)"))
        return v

    def _arrangement(self, node, key: ReachKey, tables: SourceTables, arrangements, v: Versions):
        """E's arrangement by its join key, able to give both versions (the removed recursion
        reads the old, the added one the new: asked once, so that it is not rebuilt between)."""
        if id(node) not in self._ready:
            source = node.other.name
            started = time.monotonic()
            before = arrangements.build_seconds
            self._ready[id(node)] = arrangements.ready(
                tables.uri(source), key.other_key, list(key.columns), {v.old[source], v.new[source]},
                table_id=tables.table(source).metadata().id)
            if self.built is not None and arrangements.build_seconds > before:
                self.built.append(int((time.monotonic() - started) * 1000))
            for event in arrangements.events:
                log.info("%s: arrangement %s", self.plan.st.name, event)
        return self._ready[id(node)]


def _keys(values: list) -> pa.Array | None:
    """``values`` (distinct, not NULL) as an Arrow array, or None when there are more than
    :data:`MAX_SEED_KEYS`."""
    return None if len(values) > MAX_SEED_KEYS else pa.array(values)


def reach(arranged, version: int, seeds: pa.Array, key: ReachKey) -> tuple[pa.Table, int | None]:
    """The rows of the arranged table at ``version`` a recursion from ``seeds`` (the values of
    its join key in the seed) can join, and how many levels the keys reach (None: more than
    :data:`MAX_COUNTED_LEVELS`, or not known because the key is passed on unchanged).

    Level by level: the rows whose ``other_key`` is among the level's keys, their
    ``next_key`` the next level's keys; each key is looked up once.  The levels counted are
    those whose keys match a row: a recursion's level k + 1 is empty when level k's keys match
    none (its rows' keys are among them).  Raises
    :class:`~airflow_trickle.storage.arrangement.Stale` when the rows found pass the share a
    lookup pays for (``refresh/arranged.py``).
    """
    columns = list(key.columns)
    found: list[pa.Table] = []
    looked_up = np.array([], dtype=arranged.keys.dtype)
    level = _distinct(seeds, arranged)
    levels: int | None = 0
    while level.size:
        new = np.setdiff1d(level, looked_up, assume_unique=True)
        if new.size:
            found.append(arranged.probe(new, version, columns))
            looked_up = np.union1d(looked_up, new)
            check_share(arranged, sum(t.num_rows for t in found))
        if key.next_key is None:  # the key is passed on: no new keys, and the depth is not known
            return _together(found, arranged, columns), None
        every = _together(found, arranged, columns)
        # counting: every row of this level's keys (a key met again at a deeper level counts
        # again); past the count, only the rows of keys looked up for the first time
        keys = level if levels is not None else new
        matched = every.filter(pc.is_in(every[key.other_key], value_set=pa.array(keys, every[key.other_key].type)))
        if levels is not None:
            if not matched.num_rows:
                break
            levels += 1
            if levels > MAX_COUNTED_LEVELS:  # a cycle, or deeper than worth counting
                levels = None
        following = matched[key.next_key].combine_chunks()
        if not comparable(following.type, arranged.base.schema.field(key.other_key).type):
            raise Stale(f"the next key {key.next_key} is not looked up in the arrangement")
        level = _distinct(following, arranged)
        if levels is None:
            level = np.setdiff1d(level, looked_up, assume_unique=True)
    return _together(found, arranged, columns), levels


def _distinct(values: pa.Array, arranged) -> np.ndarray:
    """The distinct non-NULL ``values``, as the arrangement's keys are held."""
    values = pc.unique(values.drop_null())
    return np.unique(np.asarray(values.to_numpy(zero_copy_only=False), dtype=arranged.keys.dtype))


def _together(found: list[pa.Table], arranged, columns: list[str]) -> pa.Table:
    if not found:
        return arranged.base.select(columns).slice(0, 0)
    return pa.concat_tables([t.cast(found[0].schema) for t in found])
