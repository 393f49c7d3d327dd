"""Everything that talks to Spark and Delta: the embedded session, table versions, commits.

The engine's packages (pyspark, delta-spark, pandas, numpy) come with the ``spark`` extra: a
scheduler, DAG processor, API server or triggerer parses DAGs and watches Delta logs without
them.  Whatever starts Spark asks :func:`require_engine` first.
"""
from __future__ import annotations

import importlib

from airflow_trickle.errors import TrickleError

#: What a component that refreshes stream tables installs.
ENGINE_INSTALL = "pip install 'airflow-trickle[spark]'"


def require_engine(what: str = "a refresh") -> None:
    """Raise a clear error when the engine's packages are not installed here (imported: what
    needs them imports them next anyway)."""
    missing = []
    for name in ("pyspark", "delta", "pandas", "numpy"):
        try:
            importlib.import_module(name)
        except ModuleNotFoundError:
            missing.append(name)
    if missing:
        raise TrickleError(f"{what} needs Spark, and this environment lacks {', '.join(missing)}",
                           hint=f"on the components that refresh (Airflow workers, the Spark service): "
                                f"{ENGINE_INSTALL}")
