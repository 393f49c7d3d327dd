"""Projects: the stream tables one Airflow DAG keeps fresh, declared in YAML or in Python.

A project is validated entirely without Spark, a JVM or the catalog -- SQL parse, sources,
cycles, schedules, diamond settings -- because it is loaded while Airflow parses the dags
folder, where an error must surface at import time and a JVM would cost seconds per parse.

YAML form (``docs/airflow.md`` documents every key)::

    project: shop
    warehouse: ${TRICKLE_WAREHOUSE}
    sources: [shop.orders, shop.customers]
    defaults: {schedule: 5m, diamond_consistency: atomic}
    stream_tables:
      - name: shop.order_lines
        query: SELECT o.id, c.region FROM shop.orders o JOIN shop.customers c ON o.customer_id = c.id
        schedule: 1m
      - name: shop.region_counts
        query_file: sql/region_counts.sql

Python form: ``define_project("shop", warehouse=..., stream_tables=[{...}, ...])`` takes the
same keys as keyword arguments.
"""
from __future__ import annotations

from airflow_trickle.project.loading import define_project, load_project, project_from_dict
from airflow_trickle.project.model import (DEFAULT_FRESHNESS_FACTOR, DIAMOND_CONSISTENCY, DIAMOND_SCHEDULE_POLICIES,
                                           AirflowSettings, Project, RefreshUnit, SparkSettings, StreamTableSpec)

__all__ = ["AirflowSettings", "DEFAULT_FRESHNESS_FACTOR", "DIAMOND_CONSISTENCY", "DIAMOND_SCHEDULE_POLICIES",
           "Project", "RefreshUnit", "SparkSettings", "StreamTableSpec", "define_project", "load_project",
           "project_from_dict"]
