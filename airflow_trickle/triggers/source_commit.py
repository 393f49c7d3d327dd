"""``SourceCommitTrigger``: the asset watcher that refreshes ``on_commit`` stream tables.

It runs on Airflow's triggerer, one per watched base source, and reads the source's Delta log
with delta-rs (a handle opened without its file list, brought up to date each poll: one listing
of ``_delta_log`` from the version last seen, and the new commits' JSON). No Spark, no JVM.
When the source has versions its readers have not consumed, it fires an event; Airflow records
it on the source's asset, and the DAG ``<dag_id>__on_commit``, scheduled on those assets, runs.

A burst of commits is one event (:class:`Coalescer`): the watcher waits until no new commit
has arrived for ``debounce`` seconds -- counted from the newest commit's own timestamp, so the
time until the poll that saw it is not waited twice -- and never holds a commit back longer than
``max_wait``.
A refresh in flight when the next commit lands is followed by exactly one more run: Airflow
queues the asset events of a DAG at its ``max_active_runs`` (1) and starts one run for them all.
"""
from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from typing import Any, AsyncIterator

from airflow.triggers.base import BaseEventTrigger, TriggerEvent


@dataclass
class Coalescer:
    """When to fire for a source whose newest version is observed poll after poll.

    ``reported``: the version up to which the readers have been told (their consumed frontier
    at the start). :meth:`observe` returns ``(reported, newest)`` when it is time to fire --
    ``debounce`` seconds without a new commit, or ``max_wait`` since the first unreported one.

    >>> c = Coalescer(reported=3, debounce=2.0, max_wait=10.0)
    >>> c.observe(3, 0.0), c.observe(4, 1.0), c.observe(5, 2.0), c.observe(5, 3.0), c.observe(5, 4.0)
    (None, None, None, None, (3, 5))
    >>> c.observe(5, 5.0), [c.observe(v, float(v)) for v in range(6, 17)][-1]  # a long burst: held 10 s at most
    (None, (5, 16))
    >>> c.observe(17, 20.0, age=1.5), c.observe(18, 21.0, age=0.5), c.observe(18, 22.5)  # quiet since 20.5
    (None, None, (16, 18))
    """

    reported: int
    debounce: float
    max_wait: float
    newest: int = -1
    changed_at: float | None = None
    waiting_since: float | None = None

    def observe(self, version: int, now: float, age: float = 0.0) -> tuple[int, int] | None:
        """``version`` seen at ``now``; ``age``: how long before ``now`` it was committed (by
        its commit's timestamp; a writer's clock ahead of this one's counts as 0)."""
        if version > self.newest:
            self.newest, self.changed_at = version, now - max(0.0, age)
        if self.newest <= self.reported:
            self.waiting_since = None
            return None
        if self.waiting_since is None:
            self.waiting_since = now
        if now - self.changed_at >= self.debounce or now - self.waiting_since >= self.max_wait:
            fired = (self.reported, self.newest)
            self.reported, self.waiting_since = self.newest, None
            return fired
        return None

    def wait(self, now: float, poll_interval: float) -> float:
        """Seconds until the next poll: the poll interval, or less when a debounce ends sooner."""
        if self.waiting_since is None or self.changed_at is None:
            return poll_interval
        due = min(self.changed_at + self.debounce, self.waiting_since + self.max_wait)
        return max(0.05, min(poll_interval, due - now))


class SourceLog:
    """A watched source's Delta log and its readers' progress (blocking: run in a thread)."""

    def __init__(self, hook, source: str, readers: list[str]):
        self.hook, self.source, self.readers = hook, source, list(readers)
        self._table = None
        self._version, self._committed_at = None, 0.0

    def consumed(self) -> tuple[int, str | None]:
        """The lowest version of the source any reader has consumed (-1 when one was never
        refreshed, or is not created yet), and the source's location as the catalog knows it."""
        lowest, location = None, None
        for name in self.readers:
            st = self.hook.catalog.get(name)
            frontier = st.frontier.get(self.source, -1) if st is not None else -1
            lowest = frontier if lowest is None else min(lowest, frontier)
            if st is not None and location is None:
                location = next((d.source_location for d in self.hook.catalog.dependencies(name)
                                 if d.source_name == self.source and d.source_location), None)
        return (-1 if lowest is None else lowest), location

    def forget(self) -> None:
        """Drop the open handle (the source may have been recreated): the next poll opens it anew."""
        self._table = None
        self._version = None

    def newest(self, location: str) -> tuple[int, float]:
        """The source's newest version (the open handle brought up to date), and how many
        seconds ago it was committed by its commit's timestamp (0 when the log does not say)."""
        from deltalake import DeltaTable

        if self._table is None:
            at = self.hook.catalog.location.at(location)
            self._table = DeltaTable(at.uri, storage_options=at.delta_options, without_files=True)
        else:
            self._table.update_incremental()
        version = int(self._table.version())
        if version != self._version:
            self._version = version
            commit = (self._table.history(1) or [{}])[0]
            self._committed_at = commit.get("timestamp", time.time() * 1000) / 1000.0
        return version, max(0.0, time.time() - self._committed_at)


class SourceCommitTrigger(BaseEventTrigger):
    """Fires when ``source`` commits versions its ``readers`` have not consumed.

    :param project: the project's name (the heartbeat's folder).
    :param warehouse: the warehouse URI; ``settings`` its public settings (credentials come from
        the triggerer's environment: trigger arguments are stored in Airflow's database).
    :param source: the watched base source; ``readers`` the stream tables reading it directly;
        ``serves`` every stream table its commits refresh (for ``trickle status``).
    :param dag_id: the on-commit DAG's id (named in status messages).
    """

    def __init__(self, *, project: str, warehouse: str, source: str, readers: list[str],
                 serves: list[str] | None = None, dag_id: str = "", poll_interval: float = 5.0,
                 debounce: float = 2.0, max_wait: float = 30.0, settings: dict | None = None):
        super().__init__()
        self.project, self.warehouse, self.source = project, warehouse, source
        self.readers, self.serves = list(readers), list(serves or readers)
        self.dag_id = dag_id
        self.poll_interval, self.debounce, self.max_wait = float(poll_interval), float(debounce), float(max_wait)
        self.settings = dict(settings or {})

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return ("airflow_trickle.triggers.source_commit.SourceCommitTrigger",
                {"project": self.project, "warehouse": self.warehouse, "source": self.source,
                 "readers": self.readers, "serves": self.serves, "dag_id": self.dag_id,
                 "poll_interval": self.poll_interval, "debounce": self.debounce, "max_wait": self.max_wait,
                 "settings": self.settings})

    async def run(self) -> AsyncIterator[TriggerEvent]:
        from airflow_trickle.catalog.model import utcnow
        from airflow_trickle.hooks.trickle import TrickleHook
        from airflow_trickle.ops.watchers import HEARTBEAT, record_beat

        hook = TrickleHook(self.warehouse, settings=self.settings)
        log = SourceLog(hook, self.source, self.readers)
        coalescer: Coalescer | None = None
        location = None
        beat = {"project": self.project, "source": self.source, "serves": self.serves, "dag_id": self.dag_id,
                "poll_interval_s": self.poll_interval, "started_at": utcnow().isoformat()}
        last_beat = -HEARTBEAT.total_seconds()
        while True:
            now = time.monotonic()
            event = None
            try:
                if location is None:
                    consumed, location = await asyncio.to_thread(log.consumed)
                    if location is None:
                        if coalescer is None:  # no reader created yet: a run creates them
                            coalescer = Coalescer(reported=-1, debounce=self.debounce, max_wait=self.max_wait)
                            event = {"reason": "its stream tables are not created yet", "version": None}
                    else:
                        told = consumed if coalescer is None else max(consumed, coalescer.reported)
                        coalescer = Coalescer(reported=told, debounce=self.debounce, max_wait=self.max_wait)
                if location is not None:
                    newest, age = await asyncio.to_thread(log.newest, location)
                    beat.update(version=newest, error=None)
                    fired = coalescer.observe(newest, now, age)
                    if fired:
                        event = {"reason": "commit", "after_version": fired[0], "version": fired[1]}
            except Exception as err:  # noqa: BLE001 - a source being recreated, a network blip: retried
                self.log.warning("watching %s: %s (retrying in %.0f s)", self.source, err, self.poll_interval)
                beat["error"] = f"{type(err).__name__}: {err}"[:500]
                location = None
                log.forget()
            if event is not None:
                event = {"source": self.source, "project": self.project, **event}
                beat["fired_at"] = utcnow().isoformat()
            if event is not None or now - last_beat >= HEARTBEAT.total_seconds():
                beat["polled_at"] = utcnow().isoformat()
                try:
                    await asyncio.to_thread(record_beat, hook.catalog.location, beat)
                    last_beat = now
                except Exception as err:  # noqa: BLE001 - a missed heartbeat only makes status warn
                    self.log.warning("cannot write the watcher's heartbeat: %s", err)
            if event is not None:
                self.log.info("%s committed: %s", self.source, event)
                yield TriggerEvent(event)
            pause = coalescer.wait(time.monotonic(), self.poll_interval) if coalescer else self.poll_interval
            await asyncio.sleep(pause)
