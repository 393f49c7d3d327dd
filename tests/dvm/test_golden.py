"""The DVM compiler's SQL, case by case, against reviewed golden output (no JVM).

The oracle tests (``tests/test_dvm_oracle.py``) prove that this SQL is *right* on Spark; these
pin down *what* it is, so a change to an operator shows up as a readable diff of SQL.
"""
from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.dvm.golden import compile_case, dump, load, pretty

FIXTURES = sorted((Path(__file__).parent / "fixtures").glob("*.sql"))
CASES = [(path, case) for path in FIXTURES for case in load(path)]


@pytest.mark.parametrize("path,case", CASES, ids=[f"{p.stem}:{c.name}" for p, c in CASES])
def test_golden_sql(path, case):
    produced = pretty(compile_case(case))
    assert produced == pretty(case.expected), f"{case.name}: the compiler's SQL changed (TRICKLE_UPDATE_GOLDEN=1 " \
                                              "rewrites the fixtures; review the diff)"


def test_every_fixture_has_cases_and_unique_names():
    assert FIXTURES
    for path in FIXTURES:
        names = [c.name for c in load(path)]
        assert names and len(names) == len(set(names)), path


if os.environ.get("TRICKLE_UPDATE_GOLDEN") == "1":  # pragma: no cover - a developer's tool
    for fixture in FIXTURES:
        cases = load(fixture)
        fixture.write_text(dump(cases, {c.name: compile_case(c) for c in cases}))
