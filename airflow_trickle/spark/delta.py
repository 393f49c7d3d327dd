"""Delta table facts and commit plumbing: versions, history, commit metadata, idempotent commits."""
from __future__ import annotations

import json
from contextlib import contextmanager
from typing import Iterator

from airflow_trickle.names import quote_name

#: Key under which a refresh records itself in a Delta commit's ``userMetadata``.
COMMIT_KEY = "airflow_trickle"

_CONF_USER_METADATA = "spark.databricks.delta.commitInfo.userMetadata"
_CONF_TXN_APP = "spark.databricks.delta.write.txnAppId"
_CONF_TXN_VERSION = "spark.databricks.delta.write.txnVersion"


def table_exists(spark, name: str) -> bool:
    return spark.catalog.tableExists(quote_name(name))


def is_delta(spark, name: str) -> bool:
    try:
        rows = spark.sql(f"DESCRIBE DETAIL {quote_name(name)}").select("format").collect()
    except Exception:  # noqa: BLE001 - not a table Delta can describe
        return False
    return bool(rows) and rows[0].format == "delta"


def latest_version(spark, name: str) -> int:
    """The newest committed version of Delta table ``name``."""
    row = spark.sql(f"DESCRIBE HISTORY {quote_name(name)} LIMIT 1").select("version").first()
    return int(row.version)


def table_properties(spark, name: str) -> dict[str, str]:
    rows = spark.sql(f"SHOW TBLPROPERTIES {quote_name(name)}").collect()
    return {row.key: row.value for row in rows}


def recorded_refreshes(spark, name: str, limit: int = 50) -> list[dict]:
    """The refresh records carried by the newest commits of a storage table, newest first.

    Each is the JSON a refresh put in its data commit (``seq``, ``frontier``, ...) plus the
    commit's ``version``.  This is the ground truth of how far a stream table has consumed its
    sources: it is written in the same atomic commit as the data.
    """
    rows = (
        spark.sql(f"DESCRIBE HISTORY {quote_name(name)} LIMIT {int(limit)}")
        .select("version", "userMetadata")
        .collect()
    )
    records = []
    for row in rows:
        if not row.userMetadata:
            continue
        try:
            payload = json.loads(row.userMetadata)
        except ValueError:
            continue
        if isinstance(payload, dict) and COMMIT_KEY in payload:
            records.append({**payload[COMMIT_KEY], "version": int(row.version)})
    return records


@contextmanager
def refresh_commit(spark, *, metadata: dict, txn_app_id: str, txn_version: int) -> Iterator[None]:
    """Make the next Delta commit of this session carry ``metadata`` and an idempotent txn id.

    A commit replayed with the same ``(txn_app_id, txn_version)`` is skipped by Delta, so a
    refresh retried after its commit landed cannot apply its changes twice.
    """
    conf = spark.conf
    conf.set(_CONF_USER_METADATA, json.dumps({COMMIT_KEY: metadata}, sort_keys=True, default=str))
    conf.set(_CONF_TXN_APP, txn_app_id)
    conf.set(_CONF_TXN_VERSION, str(int(txn_version)))
    try:
        yield
    finally:
        for key in (_CONF_USER_METADATA, _CONF_TXN_APP, _CONF_TXN_VERSION):
            conf.unset(key)


def is_conflict(err: BaseException) -> bool:
    """True for Delta's optimistic-concurrency conflicts, which a retry resolves."""
    from delta.exceptions import (
        ConcurrentAppendException,
        ConcurrentDeleteDeleteException,
        ConcurrentDeleteReadException,
        ConcurrentTransactionException,
        ConcurrentWriteException,
        DeltaConcurrentModificationException,
        MetadataChangedException,
        ProtocolChangedException,
    )

    conflict_types = (
        ConcurrentAppendException, ConcurrentDeleteDeleteException, ConcurrentDeleteReadException,
        ConcurrentTransactionException, ConcurrentWriteException, DeltaConcurrentModificationException,
        MetadataChangedException, ProtocolChangedException,
    )
    if isinstance(err, conflict_types):
        return True
    text = str(err)
    return any(marker in text for marker in (
        "DELTA_CONCURRENT_", "ConcurrentAppendException", "ConcurrentDeleteReadException",
        "ConcurrentDeleteDeleteException", "ConcurrentTransactionException", "MetadataChangedException",
        "ProtocolChangedException", "DELTA_METADATA_CHANGED", "DELTA_PROTOCOL_CHANGED",
        "FileAlreadyExistsException",
    ))
