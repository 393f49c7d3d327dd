"""``TrickleHook``: the catalog of a warehouse, read and written without Spark.

Tasks, sensors and triggers use it for the cheap questions -- is anything new beyond a stream
table's frontier, did it refresh, how stale is it -- which the Delta logs and the catalog
answer in milliseconds through delta-rs.  Work that needs Spark runs over the Spark service
or as a Spark job.
"""
from __future__ import annotations

import uuid
from functools import cached_property

from airflow.sdk import BaseHook

from airflow_trickle.config import TrickleConfig
from airflow_trickle.errors import StreamTableNotFoundError, TrickleError


class TrickleHook(BaseHook):
    """The catalog of one warehouse: from ``warehouse=``, or from a ``trickle`` connection.

    A ``trickle`` connection holds the warehouse path or URI in *host* (or ``extra.warehouse``)
    and any :class:`~airflow_trickle.config.TrickleConfig` field in *extra* -- for an object
    store, ``storage_options`` (``docs/object-storage.md``).  Its form in the UI is declared in
    the provider info (``airflow_trickle.get_provider_info``).
    """

    conn_name_attr = "trickle_conn_id"
    default_conn_name = "trickle_default"
    conn_type = "trickle"
    hook_name = "airflow_trickle warehouse"

    def __init__(self, warehouse: str | None = None, *, trickle_conn_id: str | None = None,
                 settings: dict | None = None, **kwargs):
        super().__init__(**kwargs)
        self.trickle_conn_id = trickle_conn_id
        self._warehouse = warehouse
        self._settings = dict(settings or {})

    @cached_property
    def config(self) -> TrickleConfig:
        settings = dict(self._settings)
        warehouse = self._warehouse
        if self.trickle_conn_id:
            conn = self.get_connection(self.trickle_conn_id)
            extra = conn.extra_dejson or {}
            warehouse = warehouse or extra.pop("warehouse", None) or conn.host
            settings = {**extra, **settings}
        if not warehouse:
            raise TrickleError("TrickleHook needs a warehouse: pass warehouse= or a trickle connection whose host "
                               "is the warehouse path or URI")
        known = TrickleConfig.__dataclass_fields__
        return TrickleConfig.from_env(warehouse=warehouse, **{k: v for k, v in settings.items() if k in known})

    @cached_property
    def catalog(self):
        from airflow_trickle.catalog import CatalogStore
        from airflow_trickle.spark.session import CATALOG_DIR

        return CatalogStore(self.config.location.child(CATALOG_DIR), write_attempts=self.config.catalog_write_attempts)

    def get_conn(self):
        return self.catalog

    # -- questions answered from the Delta logs -----------------------------------------------

    def stream_table(self, name: str):
        st = self.catalog.get(name)
        if st is None:
            raise StreamTableNotFoundError("no such stream table in the catalog", stream_table=name)
        return st

    def pending_sources(self, name: str, source: str | None = None) -> dict[str, tuple[int, int]]:
        """Sources of ``name`` with versions beyond its frontier: ``{source: (frontier, latest)}``."""
        from airflow_trickle.storage.deltalog import latest_version

        st = self.stream_table(name)
        pending = {}
        for dep in self.catalog.dependencies(name):
            if source is not None and dep.source_name != source:
                continue
            latest = latest_version(self.catalog.at(dep.source_location))
            seen = st.frontier.get(dep.source_name, -1)
            if latest > seen:
                pending[dep.source_name] = (seen, latest)
        if source is not None and source not in {d.source_name for d in self.catalog.dependencies(name)}:
            raise TrickleError(f"'{source}' is not a source of this stream table", stream_table=name)
        return pending

    def table_version(self, name: str) -> int:
        from airflow_trickle.storage.deltalog import latest_version

        return latest_version(self.catalog.at(self.stream_table(name).location))

    def refresh_cheaply(self, name: str, *, initiated_by: str):
        """Finish a refresh that needs no Spark (NO_DATA, or SKIP when suspended); else ``None``."""
        from airflow_trickle.refresh.engine import refresh_without_spark

        return refresh_without_spark(self.catalog, name, initiated_by=initiated_by)

    def record_freshness_miss(self, miss, *, initiated_by: str, run_id: str | None = None) -> bool:
        """Append a FRESHNESS_MISS row to the refresh history, unless ``run_id`` already has one.

        Returns whether a row was written: a table misses at most once per DAG run, whether
        its refresh task or the run's Deadline Alert noticed first.
        """
        from airflow_trickle.catalog import RefreshRecord
        from airflow_trickle.catalog.model import utcnow
        from airflow_trickle.model import Action, Outcome

        if run_id and any(r.action == Action.FRESHNESS_MISS and _run_of(r.initiated_by) == run_id
                          for r in self.catalog.history(miss.name, limit=50)):
            return False
        now = utcnow()
        st = self.catalog.get(miss.name)
        self.catalog.append_history(RefreshRecord(
            refresh_id=uuid.uuid4().hex, st_name=miss.name, seq=st.refresh_seq if st else 0,
            action=Action.FRESHNESS_MISS, status=Outcome.ALERT, start_time=now, end_time=now, reason=miss.message,
            initiated_by=initiated_by, data_timestamp=miss.data_timestamp))
        return True


def _run_of(initiated_by: str | None) -> str | None:
    """The run id in ``AIRFLOW <dag>/<run>/<task>#<try>`` or ``DEADLINE <dag>/<run>`` (Airflow
    run ids hold no ``/``); ``None`` for a refresh not started by Airflow.

    >>> _run_of("AIRFLOW shop/manual__1/shop.t#2"), _run_of("DEADLINE shop/run_1"), _run_of("MANUAL")
    ('manual__1', 'run_1', None)
    """
    parts = (initiated_by or "").split(" ", 1)[-1].split("/")
    return parts[1] if len(parts) > 1 else None
