"""airflow_trickle: stream tables for the lakehouse (Airflow orchestrates, Spark computes, Delta stores).

Importing the package is cheap: Spark and Airflow load only when used.
"""
from __future__ import annotations

__version__ = "0.1.0"


def __getattr__(name):
    if name == "Trickle":
        from airflow_trickle.spark import require_engine

        require_engine("the Python API (airflow_trickle.Trickle)")
        from airflow_trickle.api import Trickle

        return Trickle
    if name == "TrickleConfig":
        from airflow_trickle.config import TrickleConfig

        return TrickleConfig
    raise AttributeError(name)


def get_provider_info() -> dict:
    """Airflow provider metadata (entry point ``apache_airflow_provider``)."""
    return {
        "package-name": "airflow-trickle",
        "name": "airflow_trickle",
        "description": "Stream tables for the lakehouse: incremental SQL tables on Spark + Delta Lake.",
        "versions": [__version__],
        "integrations": [{
            "integration-name": "airflow_trickle",
            "external-doc-url": "https://github.com/airflow-trickle/airflow-trickle",
            "tags": ["software"],
        }],
        "operators": [{"integration-name": "airflow_trickle",
                       "python-modules": ["airflow_trickle.operators.refresh", "airflow_trickle.operators.maintenance",
                                          "airflow_trickle.operators.selection"]}],
        "sensors": [{"integration-name": "airflow_trickle",
                     "python-modules": ["airflow_trickle.sensors.source_data"]}],
        "triggers": [{"integration-name": "airflow_trickle",
                      "python-modules": ["airflow_trickle.triggers.source_data",
                                         "airflow_trickle.triggers.source_commit"]}],
        "hooks": [{"integration-name": "airflow_trickle",
                   "python-modules": ["airflow_trickle.hooks.trickle", "airflow_trickle.hooks.refresh_engine"]}],
        "connection-types": [{
            "hook-class-name": "airflow_trickle.hooks.trickle.TrickleHook",
            "connection-type": "trickle",
            "hook-name": "airflow_trickle warehouse",
            # the connection form, declared here so that Airflow needs no hook import to draw it
            "ui-field-behaviour": {
                "hidden-fields": ["schema", "login", "password", "port"],
                "relabeling": {"host": "Warehouse (path or URI)"},
                "placeholders": {"host": "/data/warehouse or s3://bucket/warehouse",
                                 "extra": '{"storage_options": {"aws_region": "eu-west-1"}, '
                                          '"max_consecutive_errors": 3}'},
            },
        }],
        "notifications": ["airflow_trickle.notifiers.freshness.FreshnessMissLogNotifier"],
        "asset-uris": [{"schemes": ["trickle"], "handler": None}],
        "plugins": [{"name": "airflow_trickle",
                     "plugin-class": "airflow_trickle.plugins.stream_tables.StreamTablesPlugin"}],
        "config": {
            "airflow_trickle": {
                "description": "The Stream tables page of Airflow's UI (airflow_trickle.plugins.stream_tables).",
                "options": {
                    "warehouses": {
                        "description": "The warehouses (paths or URIs, comma separated) whose stream tables "
                                       "the Stream tables page shows; empty: $TRICKLE_WAREHOUSE.",
                        "version_added": "0.1.0", "type": "string", "example": "/data/warehouse,s3://lake/wh",
                        "default": "",
                    },
                },
            },
        },
    }
