"""Each storage table carries its stream table's definition: the table property
``trickle.definition`` (JSON), written when the table is created and whenever the definition
changes.  ``ops/repair.py`` rebuilds a lost catalog from it and checks the two against each other.
"""
from __future__ import annotations

import json
from dataclasses import asdict
from datetime import datetime

from airflow_trickle.catalog import Dependency, StreamTable
from airflow_trickle.catalog.model import utcnow
from airflow_trickle.errors import DefinitionError
from airflow_trickle.model import StorageLayout
from airflow_trickle.names import quote_name, quote_string
from airflow_trickle.storage.errors import UNREADABLE

#: The storage table property that holds the definition.
DEFINITION_KEY = "trickle.definition"

#: What the definition holds of a catalog row (the rest is refresh state, or derived).
_DEFINED = ("name", "st_id", "defining_query", "original_query", "schedule", "refresh_mode", "effective_mode",
            "mode_reason", "output_columns", "options")


def _defined(st: StreamTable, key: str):
    """A definition field of ``st`` as a definition record holds it (plain JSON values)."""
    return st.options.to_dict() if key == "options" else getattr(st, key)


def _recorded(record: dict, key: str):
    """A definition field as a stored record holds it, options in their checked form (a record
    an older version wrote may spell ``strict: "yes"`` where the catalog now holds ``True``)."""
    from airflow_trickle.options import TableOptions

    if key == "options":
        try:
            return TableOptions.parse(record.get(key), stream_table=record.get("name")).to_dict()
        except DefinitionError:  # unreadable options differ from any checked ones
            return record.get(key)
    return record.get(key)


def definition_record(st: StreamTable, dependencies: list[Dependency]) -> dict:
    """The part of ``st``'s catalog rows that cannot be recomputed from the data: a JSON-able dict."""
    record = {key: _defined(st, key) for key in _DEFINED}
    record["storage"] = st.storage.to_dict()
    record["created_at"] = st.created_at.isoformat() if st.created_at else None
    # the definition id is the catalog's own bookkeeping: a rebuilt catalog draws a new one
    record["dependencies"] = [{k: v for k, v in asdict(d).items() if k not in ("st_name", "definition_id")}
                              for d in dependencies]
    return record


def definition_properties(st: StreamTable, dependencies: list[Dependency]) -> dict[str, str]:
    """Table properties to write on ``st``'s storage table."""
    return {DEFINITION_KEY: json.dumps(definition_record(st, dependencies), sort_keys=True, default=str)}


def record_definition(env, name: str) -> None:
    """Write ``name``'s current definition from the catalog into its storage table's properties
    (one metadata-only Delta commit: no data file changes, readers see no change), unless the
    storage table holds it already (an ALTER that replaced the table wrote it in that commit)."""
    from airflow_trickle.storage.deltalog import table_configuration

    st = env.catalog.get(name)
    if st is None:
        return
    props = definition_properties(st, env.catalog.dependencies(name))
    try:
        stored = table_configuration(env.catalog.at(st.location)).get(DEFINITION_KEY)
    except UNREADABLE:  # unreadable here: write it through Spark anyway
        stored = None
    if stored is not None and _same_definition(stored, props[DEFINITION_KEY]):
        return
    assignments = ", ".join(f"{quote_string(k)} = {quote_string(v)}" for k, v in props.items())
    from airflow_trickle.storage.lease import fence, lease_of

    with lease_of(env, [name]):
        fence(env.catalog.location, name, env.config.lease_seconds)
        env.spark.sql(f"ALTER TABLE {quote_name(name)} SET TBLPROPERTIES ({assignments})")


def _same_definition(stored: str, wanted: str) -> bool:
    try:
        return json.loads(stored) == json.loads(wanted)
    except ValueError:
        return False


def rows_from_record(record: dict, location: str, newest: dict | None) -> tuple[StreamTable, list[Dependency]]:
    """The catalog rows of a stream table, from its definition and its newest refresh commit."""
    values = {key: record.get(key) for key in _DEFINED}
    st = StreamTable(**values, storage=StorageLayout.from_dict(record.get("storage")), location=location)
    created = record.get("created_at")
    st.created_at = datetime.fromisoformat(created) if created else utcnow()
    if newest is not None:
        st.frontier = {k: int(v) for k, v in (newest.get("frontier") or {}).items()}
        st.refresh_seq = int(newest["seq"])
        st.is_populated = True
        stamp = newest.get("data_timestamp")
        st.data_timestamp = datetime.fromisoformat(stamp) if stamp else None
        st.last_refresh_at = st.data_timestamp
    dependencies = [Dependency(st_name=st.name, **dep) for dep in record.get("dependencies") or []]
    return st, dependencies
