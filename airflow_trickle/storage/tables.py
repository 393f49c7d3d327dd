"""Storage tables: the Delta tables that hold a stream table's rows.

Every storage table has the user's output columns plus hidden columns:

* ``__trickle_row_id`` BIGINT: the row's identity, a NULL-safe xxhash64 computed in the JVM:
  of the whole row for a *bag* (a result that may hold duplicate rows), of the group key for a
  *keyed* result (GROUP BY, DISTINCT);
* ``__trickle_dup`` BIGINT: the copy number among the copies of a duplicated row (always 1
  when keyed).  Numbers are unique per row content but need not be dense: an append numbers
  its copies ``refresh number * 2^31 + i`` so that it never reads the stored ones, and a
  removal takes the highest numbers.  (Tables created before this was BIGINT keep an INT
  column and dense numbers: ``StorageLayout.dup_type`` says which.)

``(__trickle_row_id, __trickle_dup)`` is unique, so MERGE can match exactly one physical row,
and a refresh can add or remove single copies of a duplicated row.  Change Data Feed is on, so
downstream stream tables read a stream table's changes like any source's.
"""
from __future__ import annotations

import re

from airflow_trickle.model import DUP, ROW_ID, StorageLayout
from airflow_trickle.errors import AlreadyExistsError, CatalogError, DefinitionError
from airflow_trickle.names import quote_identifier, quote_name, quote_string, split_name
from airflow_trickle.spark.delta import table_location

TABLE_PROPERTIES = {
    "delta.enableChangeDataFeed": "true",
    # Copy-on-write: a refresh's MERGE rewrites the few small files it touches in one job.  With
    # deletion vectors the same MERGE ran eight more Spark jobs to write them, 1.5-2 s more per
    # refresh on a 10k-row table (benchmarks/README.md, "refresh floor").
    "delta.enableDeletionVectors": "false",
}


#: Characters Delta accepts in a column name only with column mapping (Spark names an unaliased
#: expression by its text: ``sum(l_quantity)``, ``(amount * 2)``).
_NEEDS_MAPPING = re.compile(r"[ ,;{}()=]")


def column_mapping_properties(columns: list[str]) -> dict[str, str]:
    """Table properties that let the storage table hold ``columns``: Delta column mapping by name
    when a name has a character Delta refuses otherwise (readers see the names as they are)."""
    if not any(_NEEDS_MAPPING.search(column) for column in columns):
        return {}
    return {"delta.columnMapping.mode": "name", "delta.minReaderVersion": "2", "delta.minWriterVersion": "5"}


#: Delta collects file statistics for the first 32 columns (``delta.dataSkippingNumIndexedCols``),
#: and clusters only by columns it has statistics of, of these types.
_STATS_COLUMNS = 32
_CLUSTERABLE = re.compile(r"(tinyint|smallint|int|bigint|float|double|decimal(\(.*\))?|string|date|timestamp|"
                          r"timestamp_ntz)$")


def clustering_columns(wanted: tuple[str, ...], columns: list[tuple[str, str]], *, stream_table: str) -> list[str]:
    """The output columns ``wanted`` names (option ``cluster_by``), in the table's spelling,
    checked against what Delta can cluster by: a column it keeps statistics of (one of the
    first 32), of an orderable, non-nested type.

    >>> clustering_columns(("Day", "customer_id"), [("customer_id", "int"), ("day", "date")], stream_table="s.t")
    ['day', 'customer_id']
    >>> clustering_columns(("tags",), [("tags", "array<string>")], stream_table="s.t")
    Traceback (most recent call last):
    ...
    airflow_trickle.errors.DefinitionError: stream table 's.t': cannot cluster by 'tags': Delta clusters only by columns of a number, string, date or timestamp type, not array<string>
    """
    positions = {name.lower(): (i, name, kind) for i, (name, kind) in enumerate(columns)}
    found = []
    for want in wanted:
        if want.lower() not in positions:
            raise DefinitionError(f"cannot cluster by {want!r}: no such output column",
                                  stream_table=stream_table, hint=f"the columns are {', '.join(c for c, _ in columns)}")
        position, name, kind = positions[want.lower()]
        if not _CLUSTERABLE.match(kind.lower()):
            raise DefinitionError(f"cannot cluster by {want!r}: Delta clusters only by columns of a number, string, "
                                  f"date or timestamp type, not {kind}", stream_table=stream_table)
        if position >= _STATS_COLUMNS:
            raise DefinitionError(f"cannot cluster by {want!r}: Delta keeps file statistics of the first "
                                  f"{_STATS_COLUMNS} columns only, and it is column {position + 1}",
                                  stream_table=stream_table, hint="move the column forward in the query's SELECT")
        found.append(name)
    return found


def _columns_sql(cluster_by: list[str]) -> str:
    return "(" + ", ".join(quote_identifier(c) for c in cluster_by) + ")"


def _cluster_sql(cluster_by: list[str] | None) -> str:
    return f" CLUSTER BY {_columns_sql(cluster_by)}" if cluster_by else ""


def alter_clustering_sql(name: str, cluster_by: list[str]) -> str:
    """The statement that sets a storage table's clustering columns (none: turns it off).  It
    changes only the table's metadata; ``trickle maintain`` (OPTIMIZE) reclusters the rows.

    >>> alter_clustering_sql("s.t", ["day"]), alter_clustering_sql("s.t", [])
    ('ALTER TABLE `s`.`t` CLUSTER BY (`day`)', 'ALTER TABLE `s`.`t` CLUSTER BY NONE')
    """
    return f"ALTER TABLE {quote_name(name)} CLUSTER BY {_columns_sql(cluster_by) if cluster_by else 'NONE'}"


def _properties_sql(columns: list[str], extra: dict[str, str] | None) -> str:
    """The table properties of a storage table holding ``columns``, ``extra`` added."""
    properties = {**TABLE_PROPERTIES, **column_mapping_properties(columns), **(extra or {})}
    return ", ".join(f"{quote_string(k)} = {quote_string(v)}" for k, v in properties.items())


def create_storage_table(spark, name: str, columns: list[tuple[str, str]], storage: StorageLayout,
                         properties: dict[str, str] | None = None, cluster_by: list[str] | None = None) -> None:
    """Create the Delta table behind a stream table (empty; :func:`replace_storage_sql` replaces it).

    ``properties``: more table properties (the stream table's definition, ``repair.py``);
    ``cluster_by``: its clustering columns (:func:`clustering_columns`), for Delta's liquid
    clustering.
    """
    column_ddl = ", ".join(f"`{col}` {kind}" for col, kind in columns)
    hidden_ddl = ", ".join(f"`{col}` {kind} NOT NULL" if col in (ROW_ID, DUP) else f"`{col}` {kind}"
                           for col, kind in storage.hidden_columns())
    body = (f"({column_ddl}, {hidden_ddl}) USING delta{_cluster_sql(cluster_by)} "
            f"TBLPROPERTIES ({_properties_sql([col for col, _ in columns], properties)})")
    from airflow_trickle.spark.session import name_table_at, uses_in_memory_catalog

    if not uses_in_memory_catalog(spark):  # a metastore: a managed table, named where it is made
        spark.sql(f"CREATE TABLE {quote_name(name)} {body}")
        return
    # On the in-memory catalog every session that syncs the warehouse (``sync_warehouse_tables``)
    # registers the Delta tables it finds in storage.  A managed CREATE commits the table's first
    # version and only then registers the name: a sync in between (another task's session on the
    # same Spark service) registers it first, and the CREATE fails with TABLE_OR_VIEW_ALREADY_EXISTS
    # (seen in CI; 34 of 40 creates failed against a sync in a loop).  So: make the Delta table at
    # the place a managed one would get, then register the name the way a sync does -- whichever
    # registers first, both point at the same table.
    if spark.catalog.tableExists(name):  # checked by the definition's analysis; made sure of here
        raise AlreadyExistsError("a table of this name already exists", stream_table=name)
    location = _default_location(spark, name)
    spark.sql(f"CREATE TABLE delta.{quote_identifier(location)} {body}")
    name_table_at(spark, quote_name(name), location)


def _default_location(spark, name: str) -> str:
    """Where a managed table ``name`` would be stored: ``<database location>/<table>``."""
    database, table = split_name(name)
    rows = spark.sql(f"DESCRIBE DATABASE EXTENDED `{database}`").collect()
    where = next((r[1] for r in rows if str(r[0]).strip().lower() == "location"), None)
    if not where:
        raise CatalogError(f"the location of its database is not known: {rows}", stream_table=name)
    return f"{where.rstrip('/')}/{table.lower()}"


def replace_storage_sql(name: str, rows_sql: str, columns: list[str], storage: StorageLayout,
                        properties: dict[str, str] | None = None, cluster_by: list[str] | None = None) -> str:
    """One statement that replaces the storage table with ``rows_sql``'s rows, in ONE commit.

    For a REINITIALIZE whose columns changed (an ALTER of the query, a source's schema): readers
    see the old table, then the new one -- never an empty table between a replace and a refill.
    ``rows_sql`` yields the visible ``columns`` and the hidden ones by name (the source of a
    FULL refresh's MERGE); the table keeps its location, history and properties.  A CTAS
    cannot declare NOT NULL, so the identity columns of a replaced table are nullable (they
    are never NULL: a hash and a row number).
    """
    visible = ", ".join(f"r.`{c}`" for c in columns)
    hidden = ", ".join(f"CAST(r.`{c}` AS {kind}) AS `{c}`" for c, kind in storage.hidden_columns())
    return (f"CREATE OR REPLACE TABLE {quote_name(name)} USING delta{_cluster_sql(cluster_by)} "
            f"TBLPROPERTIES ({_properties_sql(columns, properties)}) "
            f"AS SELECT {visible}, {hidden} FROM ({rows_sql}) AS r")


def drop_storage_table(spark, name: str, catalog) -> None:
    """Drop the table and remove its files (the embedded catalog registers tables as external):
    through the directory or the object store, with the warehouse's storage options (the
    ``catalog``'s), from this process -- over Spark Connect as well, with no JVM here."""
    from pyspark.errors import AnalysisException  # the engine's: only where a table is dropped

    location = None
    try:
        location = table_location(spark, name)
    except AnalysisException:  # already gone
        pass
    spark.sql(f"DROP TABLE IF EXISTS {quote_name(name)}")
    if location:
        catalog.at(location).remove_tree()
