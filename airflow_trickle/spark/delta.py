"""Delta through Spark: table existence, locations, and the plumbing of a refresh's data commit."""
from __future__ import annotations

import json
from contextlib import contextmanager
from typing import Iterator

from airflow_trickle.model import HIDDEN_PREFIX
from airflow_trickle.names import commit_user_metadata, normalize_location, quote_name
from airflow_trickle.spark.engine import session_settings

_CONF_USER_METADATA = "spark.databricks.delta.commitInfo.userMetadata"
_CONF_TXN_APP = "spark.databricks.delta.write.txnAppId"
_CONF_TXN_VERSION = "spark.databricks.delta.write.txnVersion"


def table_exists(spark, name: str) -> bool:
    return spark.catalog.tableExists(quote_name(name))


def is_delta(spark, name: str) -> bool:
    """Whether ``name`` is a Delta table: by the catalog's metadata (its provider), without a
    Spark job; by DESCRIBE DETAIL only where the catalog names no provider."""
    try:
        provider = _described(spark, name, "Provider")
        if provider is not None:
            return provider.lower() == "delta"
        rows = spark.sql(f"DESCRIBE DETAIL {quote_name(name)}").select("format").collect()
    except Exception:  # noqa: BLE001 - not a table Delta can describe
        return False
    return bool(rows) and rows[0].format == "delta"


def table_location(spark, name: str) -> str:
    """Where the Delta table ``name`` is stored (a path or URI, ``file:`` removed)."""
    # The catalog's metadata names it without a Spark job; DESCRIBE DETAIL (a job that sums
    # file sizes, half a second on a small table) only where the catalog does not.
    location = _described(spark, name, "Location")
    if location is not None:
        return normalize_location(location)
    row = spark.sql(f"DESCRIBE DETAIL {quote_name(name)}").select("location").first()
    return normalize_location(row.location)


def _described(spark, name: str, field: str) -> str | None:
    """A field of ``DESCRIBE TABLE EXTENDED`` (the catalog's metadata: ``Location``,
    ``Provider``, ...), None where it has none."""
    for row in spark.sql(f"DESCRIBE TABLE EXTENDED {quote_name(name)}").collect():
        if (row.col_name or "").strip() == field and (row.data_type or "").strip():
            return row.data_type.strip()
    return None


def table_properties(spark, name: str) -> dict[str, str]:
    rows = spark.sql(f"SHOW TBLPROPERTIES {quote_name(name)}").collect()
    return {row.key: row.value for row in rows}


@contextmanager
def refresh_commit(spark, *, metadata: dict, txn_app_id: str | None, txn_version: int | None) -> Iterator[None]:
    """Make the next Delta commit of this session carry ``metadata`` and an idempotent txn id.

    A commit replayed with the same ``(txn_app_id, txn_version)`` is skipped by Delta, so a
    refresh retried after its commit landed cannot apply its changes twice.  ``txn_app_id=None``
    tags the commit with ``metadata`` only (a RESTORE takes no transaction id).
    """
    settings = {_CONF_USER_METADATA: commit_user_metadata(metadata)}
    if txn_app_id is not None:
        settings.update({_CONF_TXN_APP: txn_app_id, _CONF_TXN_VERSION: str(int(txn_version))})
    with session_settings(spark, settings):
        yield


def visible_columns(spark, name: str) -> list[tuple[str, str]]:
    """The columns of table ``name`` and their types, hidden ``__trickle_*`` columns left out."""
    schema = spark.table(quote_name(name)).schema
    return [(f.name, f.dataType.simpleString()) for f in schema.fields if not f.name.startswith(HIDDEN_PREFIX)]


def schema_fingerprint(columns: list[tuple[str, str]]) -> str:
    """A source's schema as a short hash: a refresh compares it with the one its definition saw."""
    import xxhash

    return xxhash.xxh64(json.dumps(columns).encode()).hexdigest()
