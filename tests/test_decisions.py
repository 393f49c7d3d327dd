"""The pure decisions of a refresh, without a JVM: the action, error classes, modes, layouts."""
from __future__ import annotations

from datetime import timedelta

import pytest

from airflow_trickle.catalog import StreamTable
from airflow_trickle.errors import InvalidRefreshModeError, RefreshError
from airflow_trickle.model import (
    Action,
    Identity,
    RefreshMode,
    RunMode,
    StateRole,
    StorageLayout,
    Strategy,
    parse_state_column,
    state_column,
)
from airflow_trickle.project import StreamTableSpec
from airflow_trickle.refresh.decide import choose_action
from airflow_trickle.refresh.failures import (
    is_change_feed_unavailable,
    is_evaluation_error,
    is_retryable,
    short,
    with_retries,
)


def table(**fields) -> StreamTable:
    values = dict(name="s.t", st_id="id", defining_query="q", original_query="q", schedule="1m",
                  refresh_mode=RefreshMode.AUTO, effective_mode=RefreshMode.DIFFERENTIAL, is_populated=True,
                  frontier={"s.a": 3})
    values.update(fields)
    return StreamTable(**values)


@pytest.mark.parametrize("fields,current,requested,action,reason", [
    ({}, {"s.a": 3}, None, Action.NO_DATA, "no source has a new version"),
    ({}, {"s.a": 4}, None, Action.DIFFERENTIAL, None),
    ({}, {"s.a": 3}, RunMode.FULL, Action.FULL, "requested"),
    ({}, {"s.a": 3}, RunMode.DIFFERENTIAL, Action.DIFFERENTIAL, None),  # forced: runs even with nothing new
    ({"is_populated": False}, {"s.a": 3}, None, Action.FULL, "initial population"),
    ({"needs_reinit": True}, {"s.a": 4}, None, Action.REINITIALIZE, "a source changed its schema"),
    ({}, {"s.a": 4}, RunMode.REINITIALIZE, Action.REINITIALIZE, "requested"),
    ({"effective_mode": RefreshMode.FULL, "mode_reason": "AUTO chose FULL: LIMIT"}, {"s.a": 4}, None, Action.FULL,
     "AUTO chose FULL: LIMIT"),
])
def test_choose_action(fields, current, requested, action, reason):
    assert choose_action(table(**fields), current, requested) == (action, reason)


def test_differential_cannot_be_forced_on_a_table_that_runs_full():
    st = table(effective_mode=RefreshMode.FULL, mode_reason="AUTO chose FULL: window function")
    with pytest.raises(RefreshError, match="cannot refresh DIFFERENTIAL: AUTO chose FULL: window function"):
        choose_action(st, {"s.a": 4}, RunMode.DIFFERENTIAL)


class SparkError(Exception):
    """An error as pyspark raises it: the condition Spark or Delta attached, over either client."""

    def __init__(self, message: str, condition: str | None):
        super().__init__(message)
        self.condition = condition

    def getCondition(self):
        return self.condition


def test_errors_are_classified_by_condition_not_by_words_in_the_message():
    assert is_retryable(SparkError("Files were added", "DELTA_CONCURRENT_APPEND"))
    assert is_retryable(SparkError("metadata changed", "DELTA_METADATA_CHANGED"))
    assert is_retryable(ConnectionResetError("peer reset"))
    assert is_evaluation_error(SparkError("Division by zero", "DIVIDE_BY_ZERO"))
    assert is_evaluation_error(SparkError("x", "CAST_INVALID_INPUT"))
    assert is_change_feed_unavailable(SparkError("not recorded", "DELTA_MISSING_CHANGE_DATA"))
    assert is_change_feed_unavailable(SparkError("gone", "FAILED_READ_FILE.FILE_NOT_EXIST"))
    # the words alone decide nothing: a column called cdc, a message quoting another error
    mentions = SparkError("cannot resolve column `cdc` (DELTA_CONCURRENT_APPEND, DIVIDE_BY_ZERO)",
                          "UNRESOLVED_COLUMN.WITH_SUGGESTION")
    assert not (is_retryable(mentions) or is_evaluation_error(mentions) or is_change_feed_unavailable(mentions))
    assert not is_retryable(RuntimeError("[DELTA_CONCURRENT_APPEND] ConcurrentAppendException"))


def test_a_jvm_error_wrapped_in_another_is_classified_by_its_cause():
    # a failed broadcast on a classic session: pyspark cannot convert the wrapper, the condition
    # is in the JVM's rendering of the cause
    wrapped = Exception("An error occurred while calling o48.sql.\n: java.util.concurrent.ExecutionException: "
                        "org.apache.spark.SparkArithmeticException: [DIVIDE_BY_ZERO] Division by zero. SQLSTATE: 22012")
    assert is_evaluation_error(wrapped) and not is_retryable(wrapped)
    conflict = Exception("java.util.concurrent.ExecutionException: io.delta.exceptions.ConcurrentAppendException: "
                         "[DELTA_CONCURRENT_APPEND.WITHOUT_HINT] Files were added to the root of the table")
    assert is_retryable(conflict)


def test_a_cause_carries_its_condition_to_the_wrapper():
    try:
        try:
            raise SparkError("Files were added", "DELTA_CONCURRENT_APPEND")
        except SparkError as inner:
            raise RuntimeError("the MERGE failed") from inner
    except RuntimeError as outer:
        assert is_retryable(outer)


def test_a_failed_write_task_is_reported_with_the_error_that_failed_it():
    """A FULL refresh that writes its rows without a shuffle first evaluates the query in the
    write task: Spark reports TASK_WRITE_FAILED, and the message names what failed it, from the
    cause pyspark attached or from the JVM's rendering of it."""
    task = "[TASK_WRITE_FAILED] Task failed while writing rows to file:/w/t. SQLSTATE: 58030"
    try:
        try:
            raise SparkError("[DIVIDE_BY_ZERO] Division by zero. SQLSTATE: 22012", "DIVIDE_BY_ZERO")
        except SparkError as inner:
            raise SparkError(task, "TASK_WRITE_FAILED") from inner
    except SparkError as outer:
        assert short(outer) == f"{task}: [DIVIDE_BY_ZERO] Division by zero. SQLSTATE: 22012"
    rendered = SparkError(f"{task}\n\tat org.apache.spark...\nCaused by: org.apache.spark.SparkArithmeticException: "
                          "[DIVIDE_BY_ZERO] Division by zero.\n\tat ...", "TASK_WRITE_FAILED")
    assert short(rendered) == f"{task}: [DIVIDE_BY_ZERO] Division by zero."
    assert short(SparkError(f"{task}\n\tat ...", "TASK_WRITE_FAILED")) == task  # no cause to add
    assert short(SparkError("[DIVIDE_BY_ZERO] Division by zero.\n\tat ...", "DIVIDE_BY_ZERO")) == (
        "[DIVIDE_BY_ZERO] Division by zero.")


def test_with_retries_retries_only_what_is_retryable():
    class Config:
        refresh_attempts, retry_backoff_seconds = 3, 0.0

    calls = []

    def flaky():
        calls.append(1)
        if len(calls) < 3:
            raise SparkError("lost a race", "DELTA_CONCURRENT_TRANSACTION")
        return "done"

    assert with_retries(Config, flaky) == "done" and len(calls) == 3
    calls.clear()

    def broken():
        calls.append(1)
        raise SparkError("no such column", "UNRESOLVED_COLUMN")

    with pytest.raises(SparkError):
        with_retries(Config, broken)
    assert len(calls) == 1


def test_modes_are_parsed_once_with_one_message():
    assert RunMode.parse(" reinitialize ", what="mode") is RunMode.REINITIALIZE
    assert RunMode.AUTO.requested is None and RunMode.FULL.requested is RunMode.FULL
    assert RefreshMode.parse("auto", what="refresh mode") == "AUTO"  # a StrEnum equals its text
    with pytest.raises(InvalidRefreshModeError, match=r"stream table 's.t': invalid refresh mode 'FASTER' "
                                                      r"\(use one of DIFFERENTIAL, FULL or AUTO\)"):
        RefreshMode.parse("FASTER", what="refresh mode", stream_table="s.t")


def test_storage_layout_round_trips_and_reads_rows_written_before_it():
    layout = StorageLayout(identity=Identity.KEYED, strategy=Strategy.ALGEBRAIC,
                           state=[("__trickle_count", "bigint"), (state_column(StateRole.S, 2), "decimal(20,2)")],
                           state_exprs=[("__trickle_count", "COUNT(*)"), ("__trickle_s2", "SUM(price)")],
                           columns=[("k", "int"), ("s", "decimal(20,2)")], blockers=[], dup_type="bigint")
    assert StorageLayout.from_dict(layout.to_dict()) == layout
    old = StorageLayout.from_dict({"identity": "bag", "state": [], "blockers": ["LIMIT"]})  # no strategy, no dup_type
    assert (old.strategy, old.dup_type, old.blockers) == (None, "int", ["LIMIT"])
    assert old.hidden_columns() == [("__trickle_row_id", "bigint"), ("__trickle_dup", "int")]
    assert parse_state_column("__trickle_s2") == (StateRole.S, 2)
    assert parse_state_column("__trickle_count") is None and parse_state_column("amount") is None


def test_a_stream_table_spec_survives_the_trip_to_a_refresh_job():
    spec = StreamTableSpec("shop.t", "SELECT 1 AS x FROM shop.a", None, RefreshMode.FULL,
                           diamond_consistency="atomic", freshness=timedelta(minutes=7), description="d",
                           sources=("shop.a",))
    back = StreamTableSpec.from_json(spec.to_json())
    assert back == spec and back.options() == {"diamond_consistency": "atomic", "diamond_schedule_policy": "fastest",
                                               "freshness_seconds": 420}
