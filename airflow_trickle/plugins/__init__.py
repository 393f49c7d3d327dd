"""Airflow plugins: the Stream tables page (:mod:`airflow_trickle.plugins.stream_tables`)."""
