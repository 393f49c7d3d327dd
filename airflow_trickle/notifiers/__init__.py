"""Freshness notifications: what runs when a stream table or a DAG run misses its target."""
