"""pyspark marks a process that made a Spark Connect session as Spark Connect; ``connect_session``
takes the mark off again.  Sessions made by several threads at once must not leave it behind
(the service's concurrent-refresh test did once: each thread saw the other's mark as one that
was there before it)."""
from __future__ import annotations

import os
import threading
import time

from airflow_trickle.config import TrickleConfig
from airflow_trickle.spark import address, session


class _MarkingBuilder:
    """Stands in for ``SparkSession.builder``: ``create`` marks the process as pyspark does, in
    the midst of the time a round trip to the server takes."""

    def remote(self, _address):
        return self

    def config(self, map):  # noqa: A002 - pyspark's keyword
        return self

    def create(self):
        time.sleep(0.3)
        os.environ["SPARK_CONNECT_MODE_ENABLED"] = "1"
        time.sleep(0.2)
        return object()


def test_sessions_made_by_threads_at_once_leave_no_connect_mark(monkeypatch):
    from pyspark.sql import SparkSession

    monkeypatch.delenv("SPARK_CONNECT_MODE_ENABLED", raising=False)
    monkeypatch.setattr(SparkSession, "builder", _MarkingBuilder())
    monkeypatch.setattr(address, "reachable", lambda _address: True)
    made = []
    threads = [threading.Thread(target=lambda: made.append(session.connect_session("sc://127.0.0.1:1",
                                                                                    TrickleConfig())))
               for _ in range(2)]
    # the second thread looks for the mark after the first set it and sets its own after the
    # first took it off: without a lock it would leave its own, thinking it was there before
    for thread in threads:
        thread.start()
        time.sleep(0.35)
    for thread in threads:
        thread.join(10)
    assert len(made) == 2
    assert "SPARK_CONNECT_MODE_ENABLED" not in os.environ


def test_a_mark_that_was_there_before_stays(monkeypatch):
    from pyspark.sql import SparkSession

    monkeypatch.setenv("SPARK_CONNECT_MODE_ENABLED", "1")
    monkeypatch.setattr(SparkSession, "builder", _MarkingBuilder())
    monkeypatch.setattr(address, "reachable", lambda _address: True)
    session.connect_session("sc://127.0.0.1:1", TrickleConfig())
    assert os.environ.get("SPARK_CONNECT_MODE_ENABLED") == "1"
