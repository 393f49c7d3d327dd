"""OpenLineage of a refresh task (``airflow_trickle.operators.lineage``), without a JVM: a catalog
of plain rows, the lineage read from it, and OpenLineage's classes made from that."""
from __future__ import annotations

from types import SimpleNamespace

from airflow_trickle.catalog import Dependency, StreamTable
from airflow_trickle.model import StorageLayout
from airflow_trickle.operators.lineage import Dataset, collect, operator_lineage, table_lineage

QUERY = ("SELECT c.region AS region, COUNT(*) AS orders, SUM(o.amount) AS revenue FROM shop.orders AS o "
         "JOIN shop.customers AS c ON o.customer_id = c.id GROUP BY c.region")


class Catalog:
    """The three reads lineage makes of the catalog."""

    def __init__(self, tables, dependencies, history=()):
        self.tables, self.deps, self.records = {t.name: t for t in tables}, dependencies, list(history)

    def get(self, name):
        return self.tables.get(name)

    def dependencies(self, name=None):
        return [d for d in self.deps if name is None or d.st_name == name]

    def history(self, name=None, limit=20):
        return [r for r in self.records if r.st_name == name][:limit]


def _catalog():
    return Catalog(*_catalog_parts())


def _catalog_parts():
    revenue = StreamTable("shop.region_revenue", "id1", QUERY, QUERY, "5m", "DIFFERENTIAL", "DIFFERENTIAL",
                          frontier={"shop.orders": 7, "shop.customers": 3}, location="/lake/wh/shop.db/region_revenue",
                          output_columns=["region", "orders", "revenue"],
                          storage=StorageLayout(columns=[("region", "string"), ("orders", "bigint"),
                                                         ("revenue", "decimal(20,2)")]))
    report = StreamTable("shop.region_report", "id2", "SELECT r.region AS region, r.revenue AS revenue FROM "
                         "shop.region_revenue AS r", "q", "5m", "DIFFERENTIAL", "DIFFERENTIAL",
                         frontier={"shop.region_revenue": 4}, location="/lake/wh/shop.db/region_report",
                         output_columns=["region", "revenue"],
                         storage=StorageLayout(columns=[("region", "string"), ("revenue", "decimal(20,2)")]))
    deps = [Dependency("shop.region_revenue", "shop.orders", "TABLE", "/lake/wh/shop.db/orders"),
            Dependency("shop.region_revenue", "shop.customers", "TABLE", "/lake/wh/shop.db/customers"),
            Dependency("shop.region_report", "shop.region_revenue", "STREAM_TABLE",
                       "/lake/wh/shop.db/region_revenue")]
    history = [SimpleNamespace(st_name="shop.region_revenue", action="DIFFERENTIAL",
                               phases={"plan": 20, "commit": 310, "spark_jobs": 4})]
    return [revenue, report], deps, history


def test_lineage_names_sources_at_the_frontier_and_the_output_at_its_new_version():
    lineage = table_lineage(_catalog(), "shop.region_revenue",
                            {"action": "DIFFERENTIAL", "status": "COMPLETED", "rows_inserted": 2, "rows_deleted": 1,
                             "table_version": 5})
    assert lineage.inputs == (Dataset("shop.orders", "file", "/lake/wh/shop.db/orders", 7),
                              Dataset("shop.customers", "file", "/lake/wh/shop.db/customers", 3))
    assert (lineage.output.namespace, lineage.output.name, lineage.output.version) == (
        "file", "/lake/wh/shop.db/region_revenue", 5)
    assert lineage.columns == {"region": [("shop.customers", "region")], "orders": [],
                               "revenue": [("shop.orders", "amount")]}
    assert lineage.refresh == {"action": "DIFFERENTIAL", "status": "COMPLETED", "rows_inserted": 2,
                               "rows_deleted": 1, "phases": {"plan": 20, "commit": 310, "spark_jobs": 4}}


def test_openlineage_classes_carry_versions_schema_column_lineage_sql_and_the_refresh():
    catalog = _catalog()
    lineages = [table_lineage(catalog, "shop.region_revenue", {"action": "DIFFERENTIAL", "table_version": 5}),
                table_lineage(catalog, "shop.region_report", {"action": "FULL", "table_version": 2})]
    ol = operator_lineage(lineages)  # an atomic group's task: two outputs, one event
    assert [(d.namespace, d.name, d.facets["version"].datasetVersion) for d in ol.inputs] == [
        ("file", "/lake/wh/shop.db/orders", "7"), ("file", "/lake/wh/shop.db/customers", "3"),
        ("file", "/lake/wh/shop.db/region_revenue", "4")]
    # the upstream stream table is an input with its schema (from the catalog), at its frontier version
    assert [f.name for f in ol.inputs[2].facets["schema"].fields] == ["region", "orders", "revenue"]
    revenue, report = ol.outputs
    assert revenue.facets["version"].datasetVersion == "5" and report.facets["version"].datasetVersion == "2"
    assert [(f.name, f.type) for f in revenue.facets["schema"].fields][2] == ("revenue", "decimal(20,2)")
    sources = revenue.facets["columnLineage"].fields["revenue"].inputFields
    assert [(s.namespace, s.name, s.field) for s in sources] == [("file", "/lake/wh/shop.db/orders", "amount")]
    assert revenue.facets["columnLineage"].fields["orders"].inputFields == []  # COUNT(*): no source column
    over = report.facets["columnLineage"].fields["revenue"].inputFields
    assert [(s.name, s.field) for s in over] == [("/lake/wh/shop.db/region_revenue", "revenue")]
    assert ol.run_facets["airflow_trickle"].refreshes == {
        "shop.region_revenue": {"action": "DIFFERENTIAL", "phases": {"plan": 20, "commit": 310, "spark_jobs": 4}},
        "shop.region_report": {"action": "FULL"}}
    assert ol.job_facets == {}  # two queries: no single SQL facet
    alone = operator_lineage(lineages[:1])
    assert alone.job_facets["sql"].query == QUERY


def test_nothing_is_read_without_a_transport(monkeypatch):
    from airflow.providers.openlineage import conf

    clear = getattr(conf.is_disabled, "cache_clear", lambda: None)
    clear()
    monkeypatch.delenv("AIRFLOW__OPENLINEAGE__TRANSPORT", raising=False)
    monkeypatch.delenv("OPENLINEAGE_URL", raising=False)
    read = []

    class Watched(Catalog):
        def get(self, name):
            read.append(name)
            return super().get(name)

    try:
        assert collect(Watched(*_catalog_parts()), {"shop.region_revenue": {"action": "FULL"}}) == []
        assert read == []  # without a transport, the catalog is not read
    finally:
        clear()
    assert operator_lineage([]) is None
    # with a transport, the same call reads the catalog
    monkeypatch.setenv("AIRFLOW__OPENLINEAGE__TRANSPORT", '{"type": "console"}')
    clear()
    try:
        found = collect(Watched(*_catalog_parts()), {"shop.region_revenue": {"action": "FULL"}})
    finally:
        clear()
    assert read == ["shop.region_revenue"] and len(found) == 1
