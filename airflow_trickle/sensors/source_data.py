"""``StreamTableSourceSensor``: wait until a stream table has source data beyond its frontier."""
from __future__ import annotations

from datetime import timedelta
from typing import Any

from airflow.sdk import BaseSensorOperator, PokeReturnValue
from airflow.sdk.exceptions import AirflowException


class StreamTableSourceSensor(BaseSensorOperator):
    """Succeeds once a source of ``stream_table`` (any, or only ``source``) has a newer Delta
    version than the one the stream table last refreshed from; XCom holds
    ``{source: [frontier version, latest version]}``.

    ``deferrable=True`` hands the wait to :class:`StreamTableSourceTrigger` on the triggerer, so
    no worker slot is held while nothing changes.
    """

    template_fields = ("stream_table", "source")
    ui_color = "#fdf1d9"

    def __init__(self, *, stream_table: str, warehouse: str | None = None, trickle_conn_id: str | None = None,
                 source: str | None = None, deferrable: bool = False, settings: dict | None = None, **kwargs):
        super().__init__(**kwargs)
        if not warehouse and not trickle_conn_id:
            raise ValueError("StreamTableSourceSensor needs warehouse= or trickle_conn_id=")
        self.stream_table = stream_table
        self.warehouse = warehouse
        self.trickle_conn_id = trickle_conn_id
        self.source = source
        self.deferrable = deferrable
        self.settings = settings or {}

    def _hook(self):
        from airflow_trickle.hooks.trickle import TrickleHook

        return TrickleHook(self.warehouse, trickle_conn_id=self.trickle_conn_id, settings=self.settings)

    def execute(self, context) -> Any:
        if not self.deferrable:
            return super().execute(context)
        pending = self.poke(context)
        if pending.is_done:
            return pending.xcom_value
        from airflow_trickle.triggers.source_data import StreamTableSourceTrigger

        self.defer(trigger=StreamTableSourceTrigger(
            stream_table=self.stream_table, warehouse=self._hook().config.warehouse, source=self.source,
            poll_interval=self.poke_interval, settings=self.settings),
            method_name="execute_complete", timeout=timedelta(seconds=self.timeout) if self.timeout else None)

    def poke(self, context) -> PokeReturnValue:
        from airflow_trickle.names import qualify_name

        pending = self._hook().pending_sources(qualify_name(self.stream_table),
                                               qualify_name(self.source) if self.source else None)
        if pending:
            self.log.info("new source data for %s: %s", self.stream_table, pending)
        return PokeReturnValue(is_done=bool(pending), xcom_value={k: list(v) for k, v in pending.items()})

    def execute_complete(self, context, event: dict) -> dict:
        if event.get("status") != "success":
            raise AirflowException(f"waiting for source data of {self.stream_table} failed: {event.get('message')}")
        return event["pending"]
