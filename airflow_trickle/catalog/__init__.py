"""The catalog: Delta tables under ``<warehouse>/_trickle/`` describing every stream table."""
from airflow_trickle.catalog.model import Dependency, RefreshRecord, StreamTable
from airflow_trickle.catalog.store import CatalogStore

__all__ = ["CatalogStore", "Dependency", "RefreshRecord", "StreamTable"]
