"""``StreamTableSourceTrigger``: waits on the triggerer until a source has data beyond a frontier.

It polls the Delta logs through delta-rs (in a worker thread, so the triggerer's event loop
never blocks); no Spark, no JVM.
"""
from __future__ import annotations

import asyncio
from typing import Any, AsyncIterator

from airflow.triggers.base import BaseTrigger, TriggerEvent


class StreamTableSourceTrigger(BaseTrigger):
    """Fires once ``stream_table``'s source (any, or ``source``) has a version beyond its frontier."""

    def __init__(self, *, stream_table: str, warehouse: str, source: str | None = None,
                 poll_interval: float = 30.0, settings: dict | None = None):
        super().__init__()
        self.stream_table = stream_table
        self.warehouse = warehouse
        self.source = source
        self.poll_interval = poll_interval
        self.settings = settings or {}

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return ("airflow_trickle.triggers.source_data.StreamTableSourceTrigger",
                {"stream_table": self.stream_table, "warehouse": self.warehouse, "source": self.source,
                 "poll_interval": self.poll_interval, "settings": self.settings})

    async def run(self) -> AsyncIterator[TriggerEvent]:
        from airflow_trickle.hooks.trickle import TrickleHook

        hook = TrickleHook(self.warehouse, settings=self.settings)
        while True:
            try:
                pending = await asyncio.to_thread(hook.pending_sources, self.stream_table, self.source)
            except Exception as err:  # noqa: BLE001 - reported to the task, which raises it
                yield TriggerEvent({"status": "error", "message": str(err)})
                return
            if pending:
                yield TriggerEvent({"status": "success", "pending": {k: list(v) for k, v in pending.items()}})
                return
            await asyncio.sleep(self.poll_interval)
