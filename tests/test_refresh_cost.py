"""The cost model, the insert-only check and the shape of the generated delta SQL: no JVM."""
from __future__ import annotations

from dataclasses import replace
from types import SimpleNamespace

import pyarrow as pa
import pytest

from airflow_trickle.location import Location
from airflow_trickle.storage.deltalog import insert_only_commits
from airflow_trickle.dvm.delta_plan import plan_refresh
from airflow_trickle.dvm.bag import bag_append_sql
from airflow_trickle.dvm.base import Versions
from airflow_trickle.model import Action, StorageLayout
from airflow_trickle.refresh.cost import (MAX_FANOUT_REMEASURE_AFTER, ChangeEstimate, MeasuredFanout, carried_fanout,
                                          full_is_cheaper, observed_fanout)
from airflow_trickle.refresh.time_rule import (REMEASURE_AFTER, ObservedTimes, delta_planner, observed_times,
                                               slower_than_full)
from airflow_trickle.refresh.phases import PhaseClock, format_phases

LIMITS = {"max_change_ratio": 0.15, "max_touched_ratio": 0.5}


def test_small_change_with_small_fanout_stays_differential():
    estimate = ChangeEstimate(changed_rows=1_000, source_rows=1_000_000, stored_rows=10_000, fanout=0.65)
    assert full_is_cheaper(estimate, **LIMITS) is None


def test_large_change_ratio_runs_full():
    estimate = ChangeEstimate(changed_rows=200_000, source_rows=1_000_000, stored_rows=10_000)
    assert "change ratio 0.20" in full_is_cheaper(estimate, **LIMITS)


def test_a_delta_that_reaches_most_stored_rows_runs_full():
    # the diamond: 1,000 changed source rows reach every group joined back to its detail
    estimate = ChangeEstimate(changed_rows=1_000, source_rows=1_000_000, stored_rows=500_000, fanout=480.0)
    reason = full_is_cheaper(estimate, **LIMITS)
    assert reason.startswith("expected to touch ~480,000 of 500,000 stored rows")


def test_empty_stream_table_never_blocks_differential():
    estimate = ChangeEstimate(changed_rows=10, source_rows=1_000, stored_rows=0, fanout=5.0)
    assert full_is_cheaper(estimate, **LIMITS) is None


MERGED = {"changed_rows": 4, "metrics": {"numTargetRowsInserted": "2", "numTargetRowsUpdated": "5",
                                         "numTargetRowsDeleted": "1"}}
#: a FULL's commit: no MERGE metrics
OVERWRITTEN = {"action": "FULL", "changed_rows": 28_000, "metrics": {"numOutputRows": "553"}}


@pytest.mark.parametrize("records,fanout", [
    ([], None),
    ([{"changed_rows": 0, "metrics": {}}], None),
    ([{"changed_rows": 4, "metrics": {"numTargetRowsInserted": "10"}}], None),  # not a MERGE's full metrics
    ([MERGED], MeasuredFanout(2.0, 0)),
    ([OVERWRITTEN, OVERWRITTEN, MERGED], MeasuredFanout(2.0, 2)),  # FULL refreshes since measure nothing: counted
    ([OVERWRITTEN], None),
    # a FULL commit that carried it forward (written before this code: passed over, as any FULL)
    ([OVERWRITTEN, {**OVERWRITTEN, "fanout": {"per_row": 3.5, "fulls_since": 49, "remeasure_after": 97}}, MERGED],
     MeasuredFanout(3.5, 50, 97)),
])
def test_observed_fanout_from_the_newest_refresh_commit_that_measured_it(records, fanout):
    assert observed_fanout(records) == fanout


def test_a_measured_fanout_outlives_the_history_read_and_is_measured_again_on_its_cadence():
    """The diamond's convergence point at 10M rows changes in every row each cycle: its FULL
    takes 5 s, the delta that measures its fan-out 52-65 s.  Forgotten once 50 FULL commits had
    pushed it out of the history a refresh reads, it was measured every ~50 refreshes (~25%
    more time); carried forward in each FULL commit it is measured again after as many FULL
    refreshes as keep that delta's extra time to a tenth of theirs."""
    from airflow_trickle.config import TrickleConfig
    from airflow_trickle.options import TableOptions
    from airflow_trickle.refresh.decide import Decision, by_cost_model

    st = SimpleNamespace(name="bench.d", options=TableOptions(), storage=StorageLayout(),
                         defining_query="SELECT b.id, c.n FROM bench.b b JOIN bench.c c ON b.g = c.g", mode_reason=None)
    asked = Decision(Action.DIFFERENTIAL, None, {"bench.b": 9, "bench.c": 9})
    times = ObservedTimes(differential_ms=52_000, differential_changed=8_500, full_ms=4_900)
    # each FULL commit carries the fan-out on, counting itself; the cadence from the measured times
    records = [{"changed_rows": 8_500, "metrics": {"numTargetRowsInserted": "4845400", "numTargetRowsUpdated": "0",
                                                    "numTargetRowsDeleted": "4845350"}}]
    for full in range(1, 60):
        carried = carried_fanout(observed_fanout(records), times if full > 1 else None)
        records.insert(0, {"action": "FULL", "changed_rows": 8_500, "fanout": carried})
    measured = observed_fanout(records[:50])  # only the newest 50 commits are read: the measuring one is gone
    assert measured == MeasuredFanout(pytest.approx(1140.1, abs=0.1), 59, 97) and not measured.is_due
    estimate = ChangeEstimate(changed_rows=8_500, source_rows=10_000_000, stored_rows=4_845_400,
                              fanout=measured.per_row, fanout_due=measured.is_due)
    # the history a refresh reads holds no DIFFERENTIAL any more: only the touched rule sends it FULL
    decided = by_cost_model(asked, st, estimate, replace(times, differential_ms=None, fulls_since=50),
                            TrickleConfig())
    assert decided.action == Action.FULL and "fan-out 1.14e+03 per changed source row" in decided.reason
    # at its cadence the delta measures it again
    due = replace(estimate, fanout_due=True)
    assert by_cost_model(asked, st, due, replace(times, differential_ms=None, fulls_since=97),
                         TrickleConfig()).action == Action.DIFFERENTIAL
    # a delta about as cheap as the FULL is measured again after the shortest cadence; a very
    # slow one after at most MAX_FANOUT_REMEASURE_AFTER
    cheap = carried_fanout(MeasuredFanout(3.0, 0), ObservedTimes(differential_ms=5_000, full_ms=4_900))
    slow = carried_fanout(MeasuredFanout(3.0, 0), ObservedTimes(differential_ms=900_000, full_ms=4_900))
    assert (cheap["remeasure_after"], slow["remeasure_after"]) == (REMEASURE_AFTER, MAX_FANOUT_REMEASURE_AFTER)
    assert carried_fanout(None, times) is None


def test_a_fanout_no_refresh_measured_is_assumed_and_measured_after_fulls_in_a_row():
    """TPC-H q20 at SF 3 (553 stored rows, ~28,000 changed source rows a cycle) went FULL by an
    assumed fan-out of 1, and its FULL commits -- which measure nothing -- were then read as a
    fan-out of 1 again: it never ran its delta.  Now the assumption says so, and after
    REMEASURE_AFTER FULL refreshes in a row the delta runs once to measure it."""
    from airflow_trickle.config import TrickleConfig
    from airflow_trickle.options import TableOptions
    from airflow_trickle.refresh.decide import Decision, by_cost_model

    st = SimpleNamespace(name="s.q20", options=TableOptions(), storage=StorageLayout(),
                         defining_query="SELECT a FROM s.t", mode_reason=None)
    asked = Decision(Action.DIFFERENTIAL, None, {"s.t": 9})
    unmeasured = ChangeEstimate(changed_rows=28_000, source_rows=18_000_000, stored_rows=553)
    fulls = ObservedTimes(full_ms=2_300, fulls_since=REMEASURE_AFTER - 1)
    decided = by_cost_model(asked, st, unmeasured, fulls, TrickleConfig())
    assert decided.action == Action.FULL
    assert "(fan-out 1 per changed source row, assumed: no refresh has measured it yet)" in decided.reason
    again = by_cost_model(asked, st, unmeasured, replace(fulls, fulls_since=REMEASURE_AFTER), TrickleConfig())
    assert again.action == Action.DIFFERENTIAL
    # a measured fan-out decides, however many FULL refreshes ran since
    measured = replace(unmeasured, fanout=1.2)
    decided = by_cost_model(asked, st, measured, replace(fulls, fulls_since=50), TrickleConfig())
    assert decided.action == Action.FULL and "as observed on the last refresh that measured it" in decided.reason
    assert by_cost_model(asked, st, replace(unmeasured, fanout=0.004), fulls, TrickleConfig()).action == Action.DIFFERENTIAL


def test_below_the_size_floor_the_ratios_do_not_decide_and_the_time_rule_does():
    """The cascade's fifth hop: a filter of a 50-row aggregate every row of which changes each
    cycle.  Its change ratio (2.0) sent it FULL through Spark (1.3-1.8 s) where its delta took
    0.7-0.8 s; below ``differential_ratio_min_rows`` the ratios do not decide, the measured
    times do."""
    from airflow_trickle.config import TrickleConfig
    from airflow_trickle.options import TableOptions
    from airflow_trickle.refresh.decide import Decision, by_cost_model

    st = SimpleNamespace(name="s.c5", options=TableOptions(), storage=StorageLayout(),
                         defining_query="SELECT label FROM s.c4 WHERE n > 1", mode_reason=None)
    asked = Decision(Action.DIFFERENTIAL, None, {"s.c4": 9})
    every_row = ChangeEstimate(changed_rows=100, source_rows=50, stored_rows=50, fanout=2.0)
    assert TrickleConfig().differential_ratio_min_rows == 10_000
    assert by_cost_model(asked, st, every_row, None, TrickleConfig()).action == Action.DIFFERENTIAL
    floorless = by_cost_model(asked, st, every_row, None, TrickleConfig(differential_ratio_min_rows=0))
    assert floorless.action == Action.FULL and floorless.reason.startswith("change ratio 2.00")
    # the floor counts the sources' rows and the stored rows together, and ends at its value
    at_floor = replace(every_row, source_rows=5_000, stored_rows=5_000, changed_rows=6_000)
    assert by_cost_model(asked, st, at_floor, None, TrickleConfig()).action == Action.DIFFERENTIAL
    above = replace(at_floor, stored_rows=5_001)
    assert by_cost_model(asked, st, above, None, TrickleConfig()).action == Action.FULL
    # below the floor, a delta measured slower than recomputing still runs FULL
    slow = ObservedTimes(differential_ms=1_900, differential_changed=100, full_ms=1_300)
    decided = by_cost_model(asked, st, every_row, slow, TrickleConfig())
    assert decided.action == Action.FULL and decided.reason.startswith("its DIFFERENTIAL refreshes took 1.9 s")


def _record(action, commit_ms=None, *, changed=None, status="COMPLETED", plan_ms=0, planner=None, arrange_ms=None):
    phases = {} if commit_ms is None else {"plan": plan_ms, "commit": commit_ms}
    if arrange_ms is not None:
        phases["arrange"] = arrange_ms
    if changed is not None:
        phases["changed_rows"] = changed
    if planner is not None:
        phases["planner"] = planner
    return SimpleNamespace(action=action, status=status, phases=phases)


def test_a_build_counts_where_builds_recur():
    """A warm host builds an arrangement once: its first delta's build is not what the delta
    costs.  A cold host (a new worker pod each time) builds at every refresh: once two deltas
    built, the builds count, and the time rule sees a delta slower than recomputing."""
    once = [_record("DIFFERENTIAL", 800, changed=5), _record("DIFFERENTIAL", 900, changed=5, arrange_ms=6_000),
            _record("FULL", 2_000)]
    assert observed_times(once).differential_ms == 800
    assert observed_times(once[1:]).differential_ms == 900  # the first delta: its build not counted
    cold = [_record("DIFFERENTIAL", 800, changed=5, arrange_ms=6_000),
            _record("DIFFERENTIAL", 900, changed=5, arrange_ms=6_000), _record("FULL", 2_000)]
    seen = observed_times(cold)
    assert seen.differential_ms == 6_800 and slower_than_full(5, seen, max_time_ratio=1.0) is not None


def test_observed_times_take_the_fastest_of_the_newest_deltas_and_recomputes():
    history = [_record("NO_DATA"), _record("SKIP"),
               _record("DIFFERENTIAL", 900, changed=10, status="FAILED"),  # failed: measures nothing
               _record("FULL", 3_500), _record("FULL", 3_000),
               _record("DIFFERENTIAL", 6_000, changed=1_500, plan_ms=400),
               _record("DIFFERENTIAL", 5_000, changed=2_000, plan_ms=400),
               _record("FULL", 4_000),
               _record("DIFFERENTIAL", 7_000, changed=2_500),
               _record("DIFFERENTIAL", 1_000, changed=1), _record("FULL", 2_000)]  # older than 3 of each
    assert observed_times(history) == ObservedTimes(differential_ms=5_400, differential_changed=2_000,
                                                    full_ms=3_000, fulls_since=2)
    assert observed_times([_record("DIFFERENTIAL", 800, changed=5)]) == ObservedTimes(800, 5, None, 0)
    assert observed_times([]) == ObservedTimes()
    # every FULL since the newest delta counts, not only the sampled ones
    assert observed_times([_record("FULL", 3_000)] * 9 + [_record("DIFFERENTIAL", 5_000, changed=3)]).fulls_since == 9


def test_a_delta_measured_slower_than_recomputing_runs_full_until_it_is_measured_again():
    slow = ObservedTimes(differential_ms=5_400, differential_changed=2_000, full_ms=3_000)
    reason = slower_than_full(2_000, slow, max_time_ratio=1.0)
    assert reason == ("its DIFFERENTIAL refreshes took 5.4 s (2,000 changed source rows), its FULL ones 3.0 s "
                      "(the fastest of the last 3 of each); recomputed (differential_max_time_ratio 1)")
    assert slower_than_full(1_000, slow, max_time_ratio=1.0) is not None  # half the change: still FULL
    assert slower_than_full(999, slow, max_time_ratio=1.0) is None  # a smaller change: the delta may win
    assert slower_than_full(2_000, slow, max_time_ratio=2.0) is None  # allowed up to twice the FULL
    # never measured both ways: nothing to go by
    assert slower_than_full(2_000, ObservedTimes(differential_ms=5_400, differential_changed=2_000), max_time_ratio=1) is None
    assert slower_than_full(2_000, ObservedTimes(full_ms=10), max_time_ratio=1.0) is None
    # FULL after FULL: after REMEASURE_AFTER of them the delta runs once more to be measured again
    stale = ObservedTimes(5_400, 2_000, 3_000, fulls_since=REMEASURE_AFTER)
    assert slower_than_full(2_000, stale, max_time_ratio=1.0) is None
    history = [_record("FULL", 3_000)] * (REMEASURE_AFTER - 1) + [_record("DIFFERENTIAL", 5_400, changed=2_000)]
    assert slower_than_full(2_000, observed_times(history), max_time_ratio=1.0) is not None
    assert slower_than_full(2_000, observed_times([_record("FULL", 3_000)] + history), max_time_ratio=1.0) is None


def test_a_delta_measured_under_another_planner_is_measured_again():
    now, before = delta_planner(True), delta_planner(False)
    assert now != before and now == delta_planner(True)  # the arrangements' setting counts; stable
    # measured slow without arrangements (or by older code, or before the planner was recorded)
    history = [_record("FULL", 3_000), _record("DIFFERENTIAL", 9_000, changed=2_000, planner=before),
               _record("DIFFERENTIAL", 8_000, changed=2_000), _record("FULL", 3_100)]
    assert observed_times(history) == ObservedTimes(8_000, 2_000, 3_000, fulls_since=1)
    unmeasured = observed_times(history, planner=now)
    assert unmeasured.differential_ms is None and unmeasured.full_ms == 3_000
    assert slower_than_full(2_000, unmeasured, max_time_ratio=1.0) is None  # the delta runs, measured anew
    # once measured under the current planner, that measurement decides
    measured = [_record("DIFFERENTIAL", 1_200, changed=2_000, planner=now)] + history
    assert observed_times(measured, planner=now) == ObservedTimes(1_200, 2_000, 3_000, fulls_since=0)
    slow_now = [_record("DIFFERENTIAL", 6_000, changed=2_000, planner=now)] + history
    assert slower_than_full(2_000, observed_times(slow_now, planner=now), max_time_ratio=1.0) is not None


def test_insert_only_commits_reads_the_delta_log(tmp_path):
    from deltalake import DeltaTable, write_deltalake

    path = str(tmp_path / "t")
    write_deltalake(path, pa.table({"a": [1, 2]}))  # version 0
    write_deltalake(path, pa.table({"a": [3]}), mode="append")  # 1
    write_deltalake(path, pa.table({"a": [4]}), mode="append")  # 2
    DeltaTable(path).delete("a = 1")  # 3
    write_deltalake(path, pa.table({"a": [5]}), mode="append")  # 4
    assert insert_only_commits(Location(path), 0, 2)
    assert not insert_only_commits(Location(path), 0, 3)
    assert not insert_only_commits(Location(path), 2, 4)
    assert insert_only_commits(Location(path), 3, 4)
    assert not insert_only_commits(Location(path), 0, 9)  # versions that do not exist (yet) are not known inserts


def test_a_delta_rs_merge_counts_its_changed_rows_and_an_insert_only_one_is_an_insert(tmp_path):
    """A stream table's small refreshes are MERGEs committed by delta-rs, whose metrics have
    names of their own: a reader counts their rows (not the rows a MERGE copied) and knows an
    insert-only one."""
    from deltalake import DeltaTable, write_deltalake

    from airflow_trickle.storage.deltalog import changed_rows

    path = str(tmp_path / "t")
    write_deltalake(path, pa.table({"k": [1, 2, 3], "v": [10, 20, 30]}))  # version 0
    DeltaTable(path).merge(pa.table({"k": [4, 5], "v": [40, 50]}), "t.k = s.k", source_alias="s", target_alias="t") \
        .when_not_matched_insert_all().execute()  # 1: two inserted
    DeltaTable(path).merge(pa.table({"k": [1, 2, 6], "v": [11, 0, 60]}), "t.k = s.k", source_alias="s",
                           target_alias="t") \
        .when_matched_delete("s.v = 0").when_matched_update_all().when_not_matched_insert_all().execute()  # 2
    assert changed_rows(Location(path), 0, 1) == 2
    assert changed_rows(Location(path), 1, 2) == 4  # one deleted, one updated (2), one inserted; 3 copied
    assert insert_only_commits(Location(path), 0, 1)
    assert not insert_only_commits(Location(path), 0, 2)


def test_a_refresh_reuses_a_log_handle_and_sees_every_new_commit(tmp_path):
    """Within one refresh (``reused_handles``) a table's log is opened once and the handle is
    brought up to date at each later read: a commit made meanwhile is seen; a handle asked
    ``fresh`` (one that will be written through) is its own; outside a refresh nothing is kept."""
    from deltalake import write_deltalake

    from airflow_trickle.storage.deltalog import latest_version, open_table, reused_handles

    path = str(tmp_path / "t")
    write_deltalake(path, pa.table({"a": [1]}))
    with reused_handles():
        first = open_table(Location(path))
        write_deltalake(path, pa.table({"a": [2]}), mode="append")
        assert open_table(Location(path)) is first and latest_version(Location(path)) == 1
        with reused_handles():  # nested: the same handles
            assert open_table(Location(path)) is first
        assert open_table(Location(path), fresh=True) is not first
    assert open_table(Location(path)) is not first


def _stream_table(name, query, output, storage):
    return SimpleNamespace(name=name, defining_query=query, output_columns=output,
                           storage=StorageLayout.from_dict(storage), frontier={"s.f": 3}, refresh_seq=1)


def test_linear_aggregate_merge_advances_state_in_the_merge_without_reading_the_target():
    columns = {"s.f": ["id", "k", "amount"]}
    st = _stream_table("s.agg", "SELECT k, COUNT(*) AS n, SUM(amount) AS total FROM s.f GROUP BY k", ["k", "n", "total"],
                       {"strategy": "algebraic", "columns": [["k", "bigint"], ["n", "bigint"], ["total", "bigint"]],
                        "state": [["__trickle_count", "bigint"], ["__trickle_n1", "bigint"],
                                  ["__trickle_s1", "bigint"]]})
    versions = Versions(old={"s.f": 3}, new={"s.f": 5}, columns=columns, use_cdf={"s.f": True}, consolidate=False)
    sql = plan_refresh(st, versions).apply_sql()
    source = sql.split(" USING (", 1)[1].rsplit(") AS s ON", 1)[0]
    assert "`s`.`agg`" not in source  # the storage table is read only by the MERGE's own join
    assert source.lower().count("table_changes('s.f', 4, 5)") == 1  # one read of the change feed
    assert "GROUP BY" in source and source.count("GROUP BY") == 1  # per group; raw change rows summed
    assert "t.`__trickle_count` = CAST(COALESCE(t.`__trickle_count`, 0) + COALESCE(s.__dc, 0) AS bigint)" in sql
    assert "WHEN MATCHED AND CAST(COALESCE(t.`__trickle_count`, 0) + COALESCE(s.__dc, 0) AS bigint) = 0 THEN DELETE" \
        in sql


def test_bag_append_is_an_insert_that_numbers_copies_per_refresh_without_reading_the_table():
    sql = bag_append_sql("s.bag", ["id", "v"], "SELECT id, v, 1 AS __trickle_w FROM x", seq=7)
    assert sql.startswith("INSERT INTO `s`.`bag` (`id`, `v`, `__trickle_row_id`, `__trickle_dup`) SELECT")
    assert "MERGE" not in sql and "`s`.`bag`" not in sql.split(") SELECT", 1)[1]
    assert "CAST(7 AS BIGINT) * 2147483648 + __i AS `__trickle_dup`" in sql


def test_bag_append_into_an_older_int_numbered_table_numbers_after_the_stored_copies():
    sql = bag_append_sql("s.bag", ["id", "v"], "SELECT id, v, 1 AS __trickle_w FROM x", seq=7, dup_type="int")
    assert "FROM `s`.`bag` WHERE `__trickle_row_id` IN" in sql and "sequence(__n + 1, __n + __trickle_w)" in sql


def test_phase_clock_accumulates_and_formats():
    clock = PhaseClock()
    with clock.phase("plan"):
        pass
    with clock.phase("plan"):
        pass
    assert set(clock.to_dict()) == {"plan"}  # no session: no job count
    assert format_phases({"commit": 2100, "plan": 3, "spark_jobs": 11}) == "plan 3 · commit 2100 ms · 11 jobs"


def test_a_delta_measured_over_a_much_larger_window_does_not_hide_the_small_windows_samples():
    # TPC-H q20 at SF 3: one delta over 17 cycles' changes, then two over one cycle's each
    history = [_record("DIFFERENTIAL", 41_800, changed=28_311), _record("DIFFERENTIAL", 50_300, changed=28_425),
               _record("DIFFERENTIAL", 35_100, changed=461_015), _record("FULL", 2_200)]
    observed = observed_times(history)
    assert (observed.differential_ms, observed.differential_changed) == (35_100, 461_015)  # the fastest of all
    reason = slower_than_full(28_366, observed, max_time_ratio=1.0)
    assert reason is not None and reason.startswith("its DIFFERENTIAL refreshes took 41.8 s (28,311 changed")
    # with only the large window measured, a small change still tries the delta
    assert slower_than_full(28_366, observed_times(history[2:]), max_time_ratio=1.0) is None


def test_a_delta_measured_far_slower_than_recomputing_is_measured_again_less_often():
    # TPC-H q20 at SF 1: its delta took 7.2 s, its FULL 1.7 s; measuring it every 9th refresh
    # cost 37% on average -- it waits until the measuring refresh adds a tenth of the FULLs' time
    history = [_record("FULL", 1_655)] * REMEASURE_AFTER + [_record("DIFFERENTIAL", 7_155, changed=11_850)]
    assert slower_than_full(11_850, observed_times(history), max_time_ratio=1.0) is not None
    waited = [_record("FULL", 1_655)] * 33 + history[-1:]
    assert slower_than_full(11_850, observed_times(waited), max_time_ratio=1.0) is not None
    waited = [_record("FULL", 1_655)] * 34 + history[-1:]
    assert slower_than_full(11_850, observed_times(waited), max_time_ratio=1.0) is None
    # a delta only a little slower is measured again after REMEASURE_AFTER, as before
    close = [_record("FULL", 3_000)] * REMEASURE_AFTER + [_record("DIFFERENTIAL", 3_300, changed=2_000)]
    assert slower_than_full(2_000, observed_times(close), max_time_ratio=1.0) is None
