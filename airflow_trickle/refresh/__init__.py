"""The refresh engine: choose an action, compute the change, apply it with one MERGE."""
from airflow_trickle.refresh.engine import RefreshResult, refresh_stream_table

__all__ = ["RefreshResult", "refresh_stream_table"]
