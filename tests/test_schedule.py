from datetime import datetime, timedelta

import pytest

from airflow_trickle.errors import InvalidScheduleError
from airflow_trickle.schedule import parse_schedule


@pytest.mark.parametrize("text,seconds", [("30s", 30), ("5m", 300), ("1h30m", 5400), ("2d", 172800), ("1h", 3600)])
def test_durations(text, seconds):
    assert parse_schedule(text).every == timedelta(seconds=seconds)


@pytest.mark.parametrize("text", ["*/5 * * * *", "0 3 * * 1-5", "@hourly"])
def test_cron(text):
    schedule = parse_schedule(text)
    assert schedule.cron == text and schedule.every is None


def test_empty_is_calculated():
    assert parse_schedule(None).is_calculated
    assert parse_schedule("").is_calculated


@pytest.mark.parametrize("text", ["5 minutes", "0s", "m5", "* * *", "99 * * * *", "1h30", "every day"])
def test_invalid_schedule_names_the_table(text):
    with pytest.raises(InvalidScheduleError) as err:
        parse_schedule(text, stream_table="shop.totals")
    assert "shop.totals" in str(err.value) and repr(text) in str(err.value)


def test_due():
    now = datetime(2026, 1, 1, 12, 0)
    every = parse_schedule("5m")
    assert every.is_due(None, now)
    assert not every.is_due(now - timedelta(minutes=4), now)
    assert every.is_due(now - timedelta(minutes=5), now)
    cron = parse_schedule("0 * * * *")
    assert cron.is_due(datetime(2026, 1, 1, 11, 30), now)
    assert not cron.is_due(datetime(2026, 1, 1, 12, 0), now)
    assert cron.nominal_period() == timedelta(hours=1)
