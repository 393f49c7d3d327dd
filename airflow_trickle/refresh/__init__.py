"""The refresh engine: choose an action (with the cost model), compute the change, apply it with
one MERGE or one append, and record its phases."""
from airflow_trickle.refresh.engine import RefreshResult, refresh_stream_table

__all__ = ["RefreshResult", "refresh_stream_table"]
