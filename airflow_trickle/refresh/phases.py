"""Where a refresh's time goes: named phases in milliseconds, and the Spark jobs it ran.

Every refresh records its phases in its history row (``phases``), so a slow refresh can be
explained from ``trickle history --json`` alone, and the benchmarks print the same breakdown:

* ``catalog``  — catalog reads and frontier recovery (delta-rs, no Spark)
* ``versions`` — source versions, empty-commit check, change estimate, action choice (Delta logs)
* ``schema``   — source schema check (Spark analysis only, no job)
* ``plan``     — the delta SQL built (sqlglot), and the statements it needs first (a top-K's
  candidates, a recursive CTE's parts)
* ``probe``    — a join delta's change read and its partners probed in arrangements
  (``refresh/arranged.py``; 0 when no term is probed)
* ``arrange``  — arrangements built on the way (once per input, after a restart or an
  eviction: left out of what the cost model counts as the delta's time)
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
PHASES = ("catalog", "versions", "schema", "plan", "probe", "arrange", "commit", "record")


class PhaseClock:
    """Accumulates milliseconds per phase name, in the order phases first ran."""

    def __init__(self):
        self.ms: dict[str, int] = {}
        self._jobs = None

    def track_jobs(self, engine, job_group: str) -> None:
        """Count the Spark jobs this thread starts from now on (where the engine can tell)."""
        self._jobs = engine.job_counter(job_group) if engine is not None else None

    @contextmanager
    def phase(self, name: str) -> Iterator[None]:
        started = time.monotonic()
        try:
            yield
        finally:
            self.ms[name] = self.ms.get(name, 0) + int((time.monotonic() - started) * 1000)

    def move(self, ms: int, source: str, target: str) -> None:
        """Count ``ms`` of phase ``source`` under ``target`` instead (a part timed inside it)."""
        if ms > 0:
            self.ms[source] = max(self.ms.get(source, 0) - ms, 0)
            self.ms[target] = self.ms.get(target, 0) + ms

    def spark_jobs(self) -> int | None:
        return self._jobs.count() if self._jobs is not None else None

    def close(self) -> None:
        """Stop tagging this thread's jobs with the refresh's job group."""
        if self._jobs is not None:
            self._jobs.close()

    def to_dict(self) -> dict[str, int]:
        """``{phase: ms, ..., "spark_jobs": n}`` (``spark_jobs`` only when known)."""
        result = dict(self.ms)
        jobs = self.spark_jobs()
        if jobs is not None:
            result["spark_jobs"] = jobs
        return result


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
