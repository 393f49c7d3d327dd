"""airflow_trickle: stream tables for the lakehouse (Airflow orchestrates, Spark computes, Delta stores).

Importing the package is cheap: Spark and Airflow load only when used.
"""
from __future__ import annotations

__version__ = "0.1.0"


def __getattr__(name):
    if name == "Trickle":
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
                      "python-modules": ["airflow_trickle.triggers.source_data"]}],
        "hooks": [{"integration-name": "airflow_trickle",
                   "python-modules": ["airflow_trickle.hooks.trickle", "airflow_trickle.hooks.refresh_engine"]}],
        "connection-types": [{"hook-class-name": "airflow_trickle.hooks.trickle.TrickleHook",
                              "connection-type": "trickle"}],
        "notifications": ["airflow_trickle.notifiers.freshness"],
    }
