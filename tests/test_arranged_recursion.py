"""The rows of a recursion's joined table its keys reach (``refresh/arranged_recursion.reach``),
looked up in an arrangement built by delta-rs: no JVM."""
from __future__ import annotations

import pyarrow as pa
import pytest
from deltalake import write_deltalake

from airflow_trickle.dvm.reach import ReachKey
from airflow_trickle.refresh.arranged_recursion import MAX_COUNTED_LEVELS, reach
from airflow_trickle.storage.arrangement import Arrangement

#: people(id, boss): 1 <- 2 <- 4 <- 6, 1 <- 3 <- 5, 4 also reports to 3 and 6 to 2 (6 is two
#: and three levels below 1); 9 <- 10 <- 9 a cycle; 11 with no boss (a NULL key is never
#: arranged); version 1 adds 7 under 6
EDGES = [(2, 1), (3, 1), (4, 2), (4, 3), (5, 3), (6, 4), (6, 2), (10, 9), (9, 10), (11, None)]
BY_BOSS = ReachKey(other_key="boss", self_key="id", next_key="id", columns=("id", "boss"))


@pytest.fixture
def arranged(tmp_path):
    uri = str(tmp_path / "people")
    ids, bosses = zip(*EDGES)
    write_deltalake(uri, pa.table({"id": pa.array(ids, pa.int64()), "boss": pa.array(bosses, pa.int64())}))
    write_deltalake(uri, pa.table({"id": pa.array([7], pa.int64()), "boss": pa.array([6], pa.int64())}), mode="append")
    return Arrangement.build(tmp_path / "arranged", uri, "boss", ["id", "boss"], version=0)


def rows(table: pa.Table) -> list[tuple]:
    return sorted(zip(table["id"].to_pylist(), table["boss"].to_pylist()))


def test_the_keys_are_followed_to_every_row_a_recursion_joins_and_the_levels_counted(arranged):
    arranged.catch_up(1)
    found, levels = reach(arranged, 0, pa.array([1]), BY_BOSS)
    assert rows(found) == [(2, 1), (3, 1), (4, 2), (4, 3), (5, 3), (6, 2), (6, 4)] and levels == 3
    # at version 1, 7 is below 6 at the third level and at the fourth: the levels count the
    # longest path (a recursion's rows are that deep), each row gathered once
    found, levels = reach(arranged, 1, pa.array([1]), BY_BOSS)
    assert rows(found) == [(2, 1), (3, 1), (4, 2), (4, 3), (5, 3), (6, 2), (6, 4), (7, 6)] and levels == 4
    found, levels = reach(arranged, 1, pa.array([5, None, 42]), BY_BOSS)  # no one reports to them
    assert rows(found) == [] and levels == 0


def test_a_cycle_is_gathered_once_without_a_count_and_a_key_passed_on_reaches_one_level(arranged):
    found, levels = reach(arranged, 0, pa.array([9]), BY_BOSS)
    assert rows(found) == [(9, 10), (10, 9)] and levels is None  # counted up to MAX_COUNTED_LEVELS
    assert MAX_COUNTED_LEVELS < 1000
    passed_on = ReachKey(other_key="boss", self_key="id", next_key=None, columns=("id", "boss"))
    found, levels = reach(arranged, 0, pa.array([1, 3]), passed_on)
    assert rows(found) == [(2, 1), (3, 1), (4, 3), (5, 3)] and levels is None
