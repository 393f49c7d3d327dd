"""The *Stream tables* page of the Airflow UI: one row per stream table, from the catalog alone.

An Airflow 3 plugin: a FastAPI app mounted by the API server at ``/trickle`` (the page at
``/trickle/``, its data at ``/trickle/api/stream_tables`` and
``/trickle/api/stream_tables/{name}/tree``) and a navigation entry that frames the page. Every
endpoint requires the same authentication and authorization as Airflow's own API -- a user who
may read DAGs (plugin apps are not protected by default; an anonymous request gets 401). The
browser sends the UI's session cookie, so the framed page needs no login of its own.

Which warehouses: ``[airflow_trickle] warehouses`` in the Airflow configuration (comma
separated; ``AIRFLOW__AIRFLOW_TRICKLE__WAREHOUSES``), else ``$TRICKLE_WAREHOUSE``. Nothing here
starts Spark: the numbers come from :mod:`airflow_trickle.ops.overview`, as ``trickle status``'s do.
"""
from __future__ import annotations

import os
from pathlib import Path

from airflow.api_fastapi.core_api.security import requires_access_dag
from airflow.plugins_manager import AirflowPlugin
from fastapi import Depends, FastAPI, HTTPException
from fastapi.responses import HTMLResponse

PAGE = Path(__file__).with_name("stream_tables.html")


def configured_warehouses() -> list[str]:
    """The warehouses the page shows, from Airflow's configuration or the environment."""
    from airflow.configuration import conf

    listed = conf.get("airflow_trickle", "warehouses", fallback="") or os.environ.get("TRICKLE_WAREHOUSE", "")
    return [w.strip() for w in listed.split(",") if w.strip()]


def _catalog(warehouse: str):
    from airflow_trickle.hooks.trickle import TrickleHook

    return TrickleHook(warehouse).catalog


app = FastAPI(title="airflow_trickle: stream tables", dependencies=[Depends(requires_access_dag("GET"))])


@app.get("/", response_class=HTMLResponse)
def page() -> str:
    return PAGE.read_text()


@app.get("/api/stream_tables")
def stream_tables() -> dict:
    """Every configured warehouse and its stream tables (see :func:`airflow_trickle.ops.overview.overview`)."""
    from airflow_trickle.catalog.model import utcnow
    from airflow_trickle.ops.overview import overview

    now = utcnow()
    warehouses = []
    for warehouse in configured_warehouses():
        try:
            tables, error = overview(_catalog(warehouse), now), None
        except Exception as err:  # noqa: BLE001 - one unreadable warehouse must not hide the others
            tables, error = [], f"{type(err).__name__}: {err}"
        warehouses.append({"warehouse": warehouse, "stream_tables": tables, "error": error})
    return {"now": now.isoformat(), "warehouses": warehouses}


@app.get("/api/stream_tables/{name}/tree")
def operator_tree(name: str, warehouse: str) -> dict:
    """The operator tree of one stream table (``explain``'s first part, without Spark)."""
    from airflow_trickle.ops.overview import operator_tree as tree

    if warehouse not in configured_warehouses():
        raise HTTPException(status_code=404, detail=f"warehouse {warehouse!r} is not configured")
    return {"name": name, "tree": tree(_catalog(warehouse), name)}


class StreamTablesPlugin(AirflowPlugin):
    name = "airflow_trickle"
    fastapi_apps = [{"app": app, "url_prefix": "/trickle", "name": "airflow_trickle stream tables"}]
    external_views = [{"name": "Stream tables", "href": "/trickle/", "destination": "nav",
                       "url_route": "stream-tables", "category": "browse"}]
