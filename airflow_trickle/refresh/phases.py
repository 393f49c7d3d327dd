"""Where a refresh's time goes: named phases in milliseconds, and the Spark jobs it ran.

Every refresh records its phases in its history row (``phases``), so a slow refresh can be
explained from ``trickle history --json`` alone, and the benchmarks print the same breakdown:

* ``catalog``  — catalog reads and frontier recovery (delta-rs, no Spark)
* ``versions`` — source versions, empty-commit check, change estimate, action choice (Delta logs)
* ``schema``   — source schema check (Spark analysis only, no job)
* ``plan``     — the delta SQL built (sqlglot)
* ``commit``   — the Spark statement that computes and commits the change (MERGE or append)
* ``record``   — the catalog row written after the commit

``spark_jobs`` counts the Spark jobs the refresh started, where the session exposes a status
tracker (a classic session); over Spark Connect it is absent.
"""
from __future__ import annotations

import time
from contextlib import contextmanager
from typing import Iterator


#: The phases in the order a refresh runs them (stored JSON comes back sorted by name).
PHASES = ("catalog", "versions", "schema", "plan", "commit", "record")


class PhaseClock:
    """Accumulates milliseconds per phase name, in the order phases first ran."""

    def __init__(self):
        self.ms: dict[str, int] = {}
        self._tracker = self._spark = self._job_group = None

    def track_jobs(self, spark, job_group: str) -> None:
        """Count the Spark jobs this thread starts from now on (a classic session only)."""
        self._tracker = _status_tracker(spark)
        if self._tracker is None:
            return
        try:
            spark.sparkContext.setJobGroup(job_group, "airflow_trickle refresh", interruptOnCancel=False)
            self._spark, self._job_group = spark, job_group
        except Exception:  # noqa: BLE001 - diagnostics only: no job count then
            self._tracker = None

    @contextmanager
    def phase(self, name: str) -> Iterator[None]:
        started = time.monotonic()
        try:
            yield
        finally:
            self.ms[name] = self.ms.get(name, 0) + int((time.monotonic() - started) * 1000)

    def spark_jobs(self) -> int | None:
        if self._tracker is None or not self._job_group:
            return None
        try:
            return len(self._tracker.getJobIdsForGroup(self._job_group))
        except Exception:  # noqa: BLE001 - diagnostics only
            return None

    def close(self) -> None:
        """Stop tagging this thread's jobs with the refresh's job group."""
        if self._tracker is not None and self._job_group:
            try:
                self._spark.sparkContext.setLocalProperty("spark.jobGroup.id", None)
                self._spark.sparkContext.setLocalProperty("spark.job.description", None)
            except Exception:  # noqa: BLE001 - diagnostics only
                pass

    def to_dict(self) -> dict[str, int]:
        """``{phase: ms, ..., "spark_jobs": n}`` (``spark_jobs`` only when known)."""
        result = dict(self.ms)
        jobs = self.spark_jobs()
        if jobs is not None:
            result["spark_jobs"] = jobs
        return result


def _status_tracker(spark):
    """The classic session's status tracker, or None (Spark Connect has no SparkContext)."""
    if spark is None:
        return None
    try:
        return spark.sparkContext.statusTracker()
    except Exception:  # noqa: BLE001 - Spark Connect, or a stand-in session in tests
        return None


def format_phases(phases: dict | None) -> str:
    """``versions 12 · commit 2140 · record 35 ms · 15 jobs`` for tables and logs."""
    if not phases:
        return ""
    names = [n for n in PHASES if n in phases] + [n for n in phases if n not in PHASES and n != "spark_jobs"]
    parts = [f"{name} {phases[name]}" for name in names]
    text = " · ".join(parts) + " ms"
    if "spark_jobs" in phases:
        text += f" · {phases['spark_jobs']} jobs"
    return text
