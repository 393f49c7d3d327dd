"""What a failed refresh step means, and what a run of failures does to a stream table.

Errors are classified by what Spark and Delta say they are -- the *error condition* every
Spark 4 and Delta error carries (``DELTA_CONCURRENT_APPEND``, ``DIVIDE_BY_ZERO``), the same over
a classic session and over Spark Connect -- or by their Python class; never by searching
message text, where any word (a column named ``cdc``) could match.

* **retryable**: a concurrent Delta commit, a dropped connection: the commit is retried with
  backoff (:func:`with_retries`), which is safe because a retry recomputes the change against
  the same frontier under the same Delta transaction id;
* **evaluation**: a data-dependent expression error (ANSI mode) on change rows that cancel out:
  the refresh falls back to FULL, which evaluates only current rows;
* **change feed unavailable**: the change data of the window was vacuumed or never recorded:
  the refresh falls back to FULL.

Three failures in a row (``max_consecutive_errors``) suspend the stream table: :func:`record_failure`.
"""
from __future__ import annotations

import logging
import random
import re
import time
import uuid

from airflow_trickle.model import Action, Outcome, Status

log = logging.getLogger(__name__)

#: Conditions of a commit that lost a race with another writer: retried.
RETRYABLE_CONDITIONS = ("DELTA_CONCURRENT_", "DELTA_METADATA_CHANGED", "DELTA_PROTOCOL_CHANGED")
#: Delta's concurrency exceptions, for errors that reach us without a condition.
RETRYABLE_CLASSES = ("ConcurrentAppendException", "ConcurrentDeleteReadException", "ConcurrentDeleteDeleteException",
                     "ConcurrentTransactionException", "MetadataChangedException", "ProtocolChangedException",
                     "ConcurrentWriteException", "ConcurrentModificationException",
                     # delta-rs: a commit that met a concurrent one (refresh/local_merge.py)
                     "CommitFailedError")
#: Conditions of an expression that failed on some row (ANSI mode).
EVALUATION_CONDITIONS = ("DIVIDE_BY_ZERO", "ARITHMETIC_OVERFLOW", "CAST_INVALID_INPUT", "CAST_OVERFLOW",
                         "NUMERIC_VALUE_OUT_OF_RANGE", "INVALID_ARRAY_INDEX", "DATETIME_OVERFLOW",
                         "INTERVAL_ARITHMETIC_OVERFLOW", "BINARY_ARITHMETIC_OVERFLOW")
EVALUATION_CLASSES = ("ArithmeticException", "NumberFormatException", "DateTimeException",
                      "ArrayIndexOutOfBoundsException")
#: Conditions of a change feed that cannot be read for the window.
CHANGE_FEED_CONDITIONS = ("DELTA_MISSING_CHANGE_DATA", "DELTA_CHANGE_DATA_", "DELTA_CDC_", "DELTA_INVALID_CDC_RANGE",
                          "DELTA_NO_START_FOR_CDC_READ", "DELTA_REMOVE_FILE_CDC_", "DELTA_FILE_NOT_FOUND",
                          "DELTA_FILE_OR_DIR_NOT_FOUND", "FAILED_READ_FILE", "DELTA_VERSIONS_NOT_CONTIGUOUS",
                          "DELTA_VERSION_NOT_FOUND", "DELTA_TRUNCATED_TRANSACTION_LOG", "DELTA_LOG_FILE_NOT_FOUND")


#: How a JVM error names its condition when it is printed: ``<exception class>: [CONDITION] message``.
_JVM_HEADER = re.compile(r"[A-Za-z0-9_$]+(?:Exception|Error): \[([A-Z][A-Z0-9_]*(?:\.[A-Z0-9_]+)*)\]")


def conditions(err: BaseException) -> list[str]:
    """The Spark error conditions of ``err`` and its causes (outermost first).

    pyspark gives the condition of the error it converted (``getCondition()``).  A JVM error
    that reaches Python wrapped in another -- a failed broadcast arrives on a classic session
    as ``java.util.concurrent.ExecutionException`` around, say, a ``SparkArithmeticException``
    -- is not converted; its causes' conditions are read from the JVM's own rendering of them,
    ``<exception class>: [CONDITION] ...`` (only that header counts, not words elsewhere).
    """
    found = []
    for each in _chain(err):
        getter = getattr(each, "getCondition", None)
        if callable(getter):
            try:
                condition = getter()
            except Exception:  # noqa: BLE001 - safe: an error without a readable condition has none
                condition = None
            if condition:
                found.append(str(condition))
        found += [c for c in _JVM_HEADER.findall(str(each)[:20000]) if c not in found]
    return found


def class_names(err: BaseException) -> list[str]:
    """Names of ``err``'s Python classes (pyspark maps JVM exceptions to classes of the same name)
    and of its causes'."""
    return [kind.__name__ for each in _chain(err) for kind in type(each).__mro__]


def _chain(err: BaseException):
    """``err``, then its causes, outermost first: Python's ``__cause__`` or the cause pyspark
    attached (``_cause``), each once."""
    seen = set()
    while err is not None and id(err) not in seen:
        seen.add(id(err))
        yield err
        err = err.__cause__ or getattr(err, "_cause", None)


def _is(err: BaseException, condition_prefixes: tuple[str, ...], classes: tuple[str, ...]) -> bool:
    if any(c.startswith(condition_prefixes) for c in conditions(err)):
        return True
    return bool(set(class_names(err)) & set(classes))


def is_retryable(err: BaseException) -> bool:
    """A concurrent Delta commit, or a connection that dropped (``ConnectionError``, ``TimeoutError``)."""
    return _is(err, RETRYABLE_CONDITIONS, RETRYABLE_CLASSES) or isinstance(err, (ConnectionError, TimeoutError))


def is_evaluation_error(err: BaseException) -> bool:
    """A data-dependent expression error: division by zero, overflow, a bad cast."""
    return _is(err, EVALUATION_CONDITIONS, EVALUATION_CLASSES)


def is_change_feed_unavailable(err: BaseException) -> bool:
    """The change data of the window cannot be read (vacuumed, disabled, a gap in the log)."""
    return _is(err, CHANGE_FEED_CONDITIONS, ("FileNotFoundException",))


def with_retries(config, action):
    """Run ``action``; retry a retryable error with exponential backoff and jitter.

    Safe for refresh commits: a retry recomputes the change against the same frontier under the
    same transaction id, so a commit that did land is skipped, never applied twice.
    """
    attempts = max(1, int(config.refresh_attempts))
    for attempt in range(1, attempts + 1):
        try:
            return action()
        except Exception as err:  # noqa: BLE001 - classified here
            if attempt == attempts or not is_retryable(err):
                raise
            wait = config.retry_backoff_seconds * 2 ** (attempt - 1) * (0.5 + random.random())
            log.warning("attempt %d of %d failed (%s); retrying in %.1fs", attempt, attempts, short(err), wait)
            time.sleep(wait)
    raise AssertionError("unreachable")


#: Conditions that only wrap the error that made a task fail (a write task's, for one).
WRAPPER_CONDITIONS = ("TASK_WRITE_FAILED",)
#: A JVM cause as the JVM prints it: ``Caused by: <class>: [CONDITION] message``.
_JVM_CAUSE = re.compile(r"Caused by: [A-Za-z0-9_.$]+(?:Exception|Error): (\[[A-Z][A-Z0-9_.]*\][^\n]*)")


def short(err: BaseException) -> str:
    """The first line of an error's message (Spark appends pages of JVM stack).

    Where that line only says a task failed (``TASK_WRITE_FAILED``: a query evaluated while its
    rows are written, by a FULL refresh that writes them without a shuffle first), the error
    that made it fail follows: ``[TASK_WRITE_FAILED] ...: [DIVIDE_BY_ZERO] Division by zero``.
    """
    first = _first_line(err)
    if not first.lstrip("[").startswith(WRAPPER_CONDITIONS):
        return first[:500]
    causes = [_first_line(cause) for cause in list(_chain(err))[1:]] + _JVM_CAUSE.findall(str(err)[:50000])
    inner = [c for c in causes if c and not c.lstrip("[").startswith(WRAPPER_CONDITIONS)]
    return (f"{first[:300]}: {inner[-1][:300]}" if inner else first)[:700]


def _first_line(err: BaseException) -> str:
    return str(err).strip().split("\n")[0]


def suspended_text(config) -> str:
    return (f"suspended after {config.max_consecutive_errors} consecutive failures; "
            "alter_stream_table(status='ACTIVE') resumes it")


def record_failure(catalog, config, st, message: str, record_history) -> bool:
    """Count the failure and log it (``record_history``); at ``max_consecutive_errors`` suspend
    the table (status ERROR) and raise an alert: a ``SUSPEND`` row with status ``ALERT``.

    Returns True when this failure suspended the table.  A bookkeeping error here is logged and
    swallowed: the refresh's own error is what the caller must see.
    """
    from airflow_trickle.catalog import RefreshRecord
    from airflow_trickle.catalog.model import utcnow

    limit = config.max_consecutive_errors
    suspended = []

    def count(row) -> None:
        row.consecutive_errors += 1
        if row.consecutive_errors >= limit and row.status == Status.ACTIVE:
            row.status = Status.ERROR
            suspended.append(row.consecutive_errors)

    try:
        catalog.update(st.name, count)
        record_history()
        if suspended:
            now = utcnow()
            log.error("%s: %s", st.name, suspended_text(config))
            catalog.append_history(RefreshRecord(
                refresh_id=uuid.uuid4().hex, st_name=st.name, seq=st.refresh_seq, action=Action.SUSPEND,
                status=Outcome.ALERT, start_time=now, end_time=now, reason=suspended_text(config),
                error_message=message, initiated_by="ENGINE", frontier_from=st.frontier, frontier_to=st.frontier))
    except Exception:  # noqa: BLE001 - never hide the refresh error behind a bookkeeping error
        log.exception("%s: could not record the failure of its refresh", st.name)
    return bool(suspended)
