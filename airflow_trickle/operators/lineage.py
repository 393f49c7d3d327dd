"""OpenLineage from the refresh tasks: which tables a stream table is computed from, and how.

The OpenLineage provider (``airflow-trickle[openlineage]``) asks an operator for its lineage
when the task ends (``get_openlineage_facets_on_complete``), in a process it forks, where
delta-rs cannot run: so the refresh task reads what it needs from the catalog itself, in
``execute`` (:func:`collect`, plain data: :class:`TableLineage`), and the provider's call only
turns that into OpenLineage's classes (:func:`operator_lineage`).  Without the provider, or
without an OpenLineage transport configured, nothing is read or imported.

* inputs: each source, with its Delta version at the stream table's frontier;
* output: the stream table, with its new Delta version, its schema and its column lineage;
* the job's SQL facet: the defining query; the run facet ``airflow_trickle``: per table, the
  refresh's action, reason, rows inserted and deleted, and phases.

Datasets are named as OpenLineage's naming spec says for the storage: a local path is
namespace ``file``, name the absolute path; ``s3://bucket/key`` (``s3a://`` too) is namespace
``s3://bucket``, name ``key``; ``gs://`` and ``abfss://`` alike.

Column lineage comes from sqlglot's ``lineage`` over the qualified defining query: each output
column with the source columns its value is computed from.  It cannot be exact where a value
depends on rows rather than columns: ``COUNT(*)`` has no source column, and columns used only
in WHERE, JOIN ... ON, GROUP BY or a window's PARTITION BY shape which rows count but are not
listed (OpenLineage calls them indirect).
"""
from __future__ import annotations

import logging
from dataclasses import dataclass, field
from urllib.parse import urlparse

log = logging.getLogger(__name__)


def dataset_id(location: str) -> tuple[str, str]:
    """``(namespace, name)`` of the Delta table at ``location`` (OpenLineage's naming spec).

    >>> dataset_id("/data/wh/shop/orders")
    ('file', '/data/wh/shop/orders')
    >>> dataset_id("s3a://lake/wh/shop/orders/")
    ('s3://lake', 'wh/shop/orders')
    >>> dataset_id("abfss://data@acct.dfs.core.windows.net/wh/t")
    ('abfss://data@acct.dfs.core.windows.net', 'wh/t')
    """
    parsed = urlparse(location)
    if parsed.scheme in ("", "file"):
        return "file", (parsed.path if parsed.scheme else location).rstrip("/") or "/"
    scheme = "s3" if parsed.scheme in ("s3", "s3a", "s3n") else parsed.scheme
    return f"{scheme}://{parsed.netloc}", parsed.path.strip("/")


def column_lineage(query: str, output_columns: list[str]) -> dict[str, list[tuple[str, str]]]:
    """Each output column of the (qualified) ``query`` with the ``(source table, column)`` pairs
    its value is computed from; a column computed from none (a literal, ``COUNT(*)``) maps to [].

    >>> column_lineage("SELECT c.region AS region, COUNT(*) AS n, SUM(o.amount) AS total FROM s.o AS o "
    ...                "JOIN s.c AS c ON o.cid = c.id GROUP BY c.region", ["region", "n", "total"])
    {'region': [('s.c', 'region')], 'n': [], 'total': [('s.o', 'amount')]}
    """
    from sqlglot import exp
    from sqlglot.lineage import lineage

    from airflow_trickle.sql.parse import DIALECT

    found: dict[str, list[tuple[str, str]]] = {}
    for column in output_columns:
        try:
            root = lineage(column, query, None, dialect=DIALECT)
        except Exception:  # noqa: BLE001 - lineage is a description: a shape sqlglot cannot trace lists none
            log.debug("no column lineage for %s", column, exc_info=True)
            found[column] = []
            continue
        pairs = []
        for node in root.walk():
            if node.downstream or not isinstance(node.source, exp.Table):
                continue
            table = node.source
            source = f"{table.db}.{table.name}" if table.db else table.name
            pair = (source.lower(), node.name.split(".")[-1].strip('"`'))
            if pair not in pairs:
                pairs.append(pair)
        found[column] = pairs
    return found


@dataclass(frozen=True)
class Dataset:
    """A table as OpenLineage sees it: where it is, at which version, with which columns."""

    table: str
    namespace: str
    name: str
    version: int | None = None
    fields: tuple[tuple[str, str], ...] = ()


@dataclass(frozen=True)
class TableLineage:
    """What one refresh read and wrote (plain data; :func:`to_openlineage` converts it)."""

    inputs: tuple[Dataset, ...]
    output: Dataset
    query: str
    #: output column -> the input columns it is computed from, as ``(table, column)``
    columns: dict = field(default_factory=dict)
    #: what the refresh did: action, reason, rows inserted and deleted, phases
    refresh: dict = field(default_factory=dict)


def table_lineage(catalog, name: str, outcome: dict | None = None) -> TableLineage | None:
    """The lineage of stream table ``name`` from the catalog (its frontier, its sources), and,
    after a refresh, what it did (``outcome``: the task's outcome of that table)."""
    from airflow_trickle.model import SourceType

    st = catalog.get(name)
    if st is None:
        return None
    outcome = outcome or {}
    inputs = []
    for dep in catalog.dependencies(name):
        namespace, dataset = dataset_id(dep.source_location or dep.source_name)
        if dep.source_type == SourceType.STREAM_TABLE:
            upstream = catalog.get(dep.source_name)
            fields = tuple((c, t) for c, t in (upstream.storage.columns if upstream else []))
        else:
            fields = _base_table_fields(catalog, dep.source_location)
        inputs.append(Dataset(dep.source_name, namespace, dataset, st.frontier.get(dep.source_name), fields))
    namespace, dataset = dataset_id(st.location or name)
    output = Dataset(name, namespace, dataset, outcome.get("table_version"),
                     tuple((c, t) for c, t in st.storage.columns))
    refresh = {key: outcome[key] for key in ("action", "status", "reason", "rows_inserted", "rows_deleted")
               if outcome.get(key) is not None}
    if outcome:  # the phases of the refresh just done: its history row
        newest = next((r for r in catalog.history(name, limit=5) if r.action == outcome.get("action")), None)
        if newest is not None and newest.phases:
            refresh["phases"] = dict(newest.phases)
    return TableLineage(inputs=tuple(inputs), output=output, query=st.original_query,
                        columns=column_lineage(st.defining_query, list(st.output_columns)), refresh=refresh)


def lineage_wanted() -> bool:
    """Whether OpenLineage will collect this task's lineage: the provider is installed and has
    a transport (without either, nothing is read or built)."""
    try:
        from airflow.providers.openlineage.conf import is_disabled
    except ImportError:
        return False
    return not is_disabled()


def collect(catalog, outcomes: dict[str, dict]) -> list[TableLineage]:
    """The lineage of the tables a task refreshed, read from the catalog in the task's own
    process (the provider extracts lineage in a forked process, where delta-rs cannot run)."""
    if not lineage_wanted():
        return []
    try:
        return [t for t in (table_lineage(catalog, name, outcome) for name, outcome in outcomes.items())
                if t is not None]
    except Exception:  # noqa: BLE001 - lineage is reported, never a reason for the task to fail
        log.warning("no OpenLineage for %s", ", ".join(outcomes), exc_info=True)
        return []


def _base_table_fields(catalog, location: str | None) -> tuple[tuple[str, str], ...]:
    """A base table's columns and types from its Delta log (none when it cannot be read)."""
    from airflow_trickle.model import HIDDEN_PREFIX
    from airflow_trickle.storage.deltalog import column_types

    if not location:
        return ()
    try:
        return tuple((c, t) for c, t in column_types(catalog.at(location)) if not c.startswith(HIDDEN_PREFIX))
    except Exception:  # noqa: BLE001 - a schema is a description: an unreadable log gives none
        log.debug("no schema for %s", location, exc_info=True)
        return ()


def operator_lineage(lineages: list[TableLineage]):
    """The ``OperatorLineage`` of ``lineages`` (None when there is none, or the provider is not
    installed: lineage never fails a task)."""
    if not lineages:
        return None
    try:
        return to_openlineage(lineages)
    except Exception:  # noqa: BLE001 - lineage is reported, never a reason for the task to fail
        log.warning("no OpenLineage event facets", exc_info=True)
        return None


def to_openlineage(lineages: list[TableLineage]):
    """OpenLineage's classes for ``lineages`` (needs the provider)."""
    from airflow.providers.openlineage.extractors import OperatorLineage
    from openlineage.client.event_v2 import InputDataset, OutputDataset
    from openlineage.client.facet_v2 import (column_lineage_dataset, dataset_version_dataset, schema_dataset,
                                             sql_job)

    def facets(dataset: Dataset) -> dict:
        found = {}
        if dataset.fields:
            found["schema"] = schema_dataset.SchemaDatasetFacet(
                fields=[schema_dataset.SchemaDatasetFacetFields(name=c, type=t) for c, t in dataset.fields])
        if dataset.version is not None:
            found["version"] = dataset_version_dataset.DatasetVersionDatasetFacet(datasetVersion=str(dataset.version))
        return found

    inputs, outputs, seen = [], [], set()
    for lineage in lineages:
        by_table = {d.table: d for d in lineage.inputs}
        for dataset in lineage.inputs:
            if (dataset.namespace, dataset.name) not in seen:
                seen.add((dataset.namespace, dataset.name))
                inputs.append(InputDataset(namespace=dataset.namespace, name=dataset.name, facets=facets(dataset)))
        out = facets(lineage.output)
        out["columnLineage"] = column_lineage_dataset.ColumnLineageDatasetFacet(fields={
            column: column_lineage_dataset.Fields(
                inputFields=[column_lineage_dataset.InputField(namespace=by_table[t].namespace,
                                                               name=by_table[t].name, field=c)
                             for t, c in sources if t in by_table],
                transformationType="", transformationDescription="")
            for column, sources in lineage.columns.items()})
        outputs.append(OutputDataset(namespace=lineage.output.namespace, name=lineage.output.name, facets=out))
    job = {"sql": sql_job.SQLJobFacet(query=lineages[0].query)} if len(lineages) == 1 else {}
    run = {"airflow_trickle": _refresh_facet({lin.output.table: lin.refresh for lin in lineages})}
    return OperatorLineage(inputs=inputs, outputs=outputs, run_facets=run, job_facets=job)


def _refresh_facet(refreshes: dict):
    """The run facet ``airflow_trickle``: what each refresh of the task did."""
    import attr
    from openlineage.client.facet_v2 import RunFacet

    @attr.define
    class TrickleRefreshRunFacet(RunFacet):
        """What the refresh task did to each stream table (action, reason, rows, phases)."""

        refreshes: dict = attr.field(factory=dict)

    return TrickleRefreshRunFacet(refreshes=refreshes)
