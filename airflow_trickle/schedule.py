"""Schedules: a duration (``30s``, ``5m``, ``1h30m``, ``2d``), a cron expression, or ``on_commit``.

An empty schedule (``None``) means CALCULATED: the stream table is refreshed when
a downstream stream table needs it, at the tightest downstream cadence.  ``on_commit`` has no
clock: the stream table is refreshed when one of its sources commits (an Airflow asset watcher
on the triggerer sees the commit, :mod:`airflow_trickle.triggers.source_commit`).
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import datetime, timedelta

from croniter import croniter

from airflow_trickle.errors import InvalidScheduleError

#: The longest duration schedule: a year (beyond it, a cron expression says what is meant).
MAX_EVERY = timedelta(days=366)

#: The schedule of a stream table refreshed when its sources commit, not on a clock.
ON_COMMIT = "on_commit"

_DURATION = re.compile(r"^(?:(?P<d>\d+)d)?(?:(?P<h>\d+)h)?(?:(?P<m>\d+)m)?(?:(?P<s>\d+)s)?$")


@dataclass(frozen=True)
class Schedule:
    """A parsed schedule: one of ``every``, ``cron`` and ``on_commit`` is set, or none (CALCULATED)."""

    text: str | None
    every: timedelta | None = None
    cron: str | None = None
    on_commit: bool = False

    @property
    def is_calculated(self) -> bool:
        return self.every is None and self.cron is None and not self.on_commit

    def nominal_period(self, now: datetime | None = None) -> timedelta | None:
        """The time between two runs: the duration, or the gap between the next two cron fires."""
        if self.every is not None:
            return self.every
        if self.cron is not None:
            it = croniter(self.cron, now or datetime(2000, 1, 1))
            first = it.get_next(datetime)
            return it.get_next(datetime) - first
        return None

    def next_due(self, last_refresh: datetime) -> datetime | None:
        """When a refresh last done at ``last_refresh`` is due again (``None``: CALCULATED)."""
        if self.every is not None:
            return last_refresh + self.every
        if self.cron is not None:
            return croniter(self.cron, last_refresh).get_next(datetime)
        return None

    def is_due(self, last_refresh: datetime | None, now: datetime) -> bool:
        """True when a refresh last done at ``last_refresh`` is due again at ``now``."""
        if last_refresh is None:
            return True
        if self.every is not None:
            return now - last_refresh >= self.every
        if self.cron is not None:
            return croniter(self.cron, last_refresh).get_next(datetime) <= now
        return False


def format_duration(value: timedelta) -> str:
    """A duration as schedules are written, the one format of docs, logs and the UI.

    >>> format_duration(timedelta(minutes=90)), format_duration(timedelta(seconds=61)), format_duration(timedelta(0))
    ('1h30m', '1m1s', '0s')
    """
    seconds = max(0, int(value.total_seconds()))
    days, seconds = divmod(seconds, 86400)
    hours, seconds = divmod(seconds, 3600)
    minutes, seconds = divmod(seconds, 60)
    return "".join(f"{v}{u}" for v, u in ((days, "d"), (hours, "h"), (minutes, "m"), (seconds, "s")) if v) or "0s"


def parse_schedule(text: str | None, *, stream_table: str | None = None) -> Schedule:
    """Parse ``text`` into a :class:`Schedule`; raise :class:`InvalidScheduleError` naming the table.

    >>> parse_schedule("1h30m").every
    datetime.timedelta(seconds=5400)
    >>> parse_schedule("*/5 * * * *").cron
    '*/5 * * * *'
    >>> parse_schedule("ON_COMMIT")
    Schedule(text='on_commit', every=None, cron=None, on_commit=True)
    """
    if text is None or str(text).strip() == "":
        return Schedule(text=None)
    raw = str(text).strip()
    if raw.lower() == ON_COMMIT:
        return Schedule(text=ON_COMMIT, on_commit=True)
    match = _DURATION.match(raw)
    if match and any(match.groupdict().values()):
        parts = {k: int(v) for k, v in match.groupdict().items() if v}
        seconds = parts.get("d", 0) * 86400 + parts.get("h", 0) * 3600 + parts.get("m", 0) * 60 + parts.get("s", 0)
        if seconds > MAX_EVERY.total_seconds():
            raise InvalidScheduleError(f"schedule {raw!r} is longer than {format_duration(MAX_EVERY)}",
                                       stream_table=stream_table, hint="for rarer refreshes use a cron expression "
                                                                       "such as '@yearly', or no schedule")
        every = timedelta(seconds=seconds)
        if every <= timedelta(0):
            raise InvalidScheduleError(f"schedule {raw!r} must be longer than zero", stream_table=stream_table)
        return Schedule(text=raw, every=every)
    if len(raw.split()) == 6:  # croniter reads a sixth field as seconds; Airflow's cron has five
        raise InvalidScheduleError(f"cron expression {raw!r} has six fields", stream_table=stream_table,
                                   hint="a cron expression has five fields: minute hour day-of-month month "
                                        "day-of-week (no seconds), e.g. '0 9 * * *'")
    if len(raw.split()) == 5 or raw.startswith("@"):
        if croniter.is_valid(raw):
            return Schedule(text=raw, cron=raw)
    raise InvalidScheduleError(
        f"invalid schedule {raw!r}",
        stream_table=stream_table,
        hint="use a duration such as '30s', '5m', '1h30m', '1d', a cron expression such as '*/5 * * * *', "
             "or 'on_commit'",
    )
