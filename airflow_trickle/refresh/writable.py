"""Whether delta-rs writes a stored table exactly as Spark would, and its columns' Spark types.

Why one module: the planner (``refresh/plan.py``) reads it to choose the committer, and every
delta-rs committer (``local_merge``, ``local_overwrite``, ``local_bag``, the top-K resolved here)
checks the table as opened at commit time by the same rule.
"""
from __future__ import annotations

from airflow_trickle.model import DUP, ROW_ID
from airflow_trickle.refresh.resolution import spark_type
from airflow_trickle.storage.deltalog import why_rows_unreadable

#: Writer features delta-rs writes as Spark does (``changeDataFeed`` included: it writes the
#: ``_change_data`` files a downstream stream table reads).
WRITABLE_FEATURES = {"appendOnly", "invariants", "checkConstraints", "changeDataFeed", "timestampNtz",
                     "generatedColumns"}


def writable_columns(table) -> list[tuple[str, str]] | None:
    """The columns and Spark types of the delta-rs ``table``, or None when delta-rs should not
    write it (:func:`why_not_writable`)."""
    return None if why_not_writable(table) else spark_columns(table)


def spark_columns(table) -> list[tuple[str, str]]:
    return [(field.name, spark_type(field.type.type)) for field in table.schema().fields]


def why_not_writable(table) -> str | None:
    """Why delta-rs should not write the delta-rs ``table`` (None: it may): a writer feature it
    does not write as Spark does, column mapping, a column type other than a primitive one, no
    row identity."""
    protocol = table.protocol()
    features = set(protocol.writer_features or []) - WRITABLE_FEATURES
    if protocol.min_writer_version > 7 or features:
        return f"table features {', '.join(sorted(features)) or f'of writer version {protocol.min_writer_version}'}"
    if protocol.min_writer_version > 4 and protocol.writer_features is None:
        return "column mapping"  # writer versions 5 and 6 imply it
    unreadable = why_rows_unreadable(table)
    if unreadable:
        return unreadable
    for field in table.schema().fields:
        if spark_type(getattr(field.type, "type", "")) is None:
            return f"column {field.name} is not of a primitive type"
    if not {ROW_ID, DUP} <= {field.name for field in table.schema().fields}:
        return "no row identity columns"
    return None
