"""Airflow operators of airflow_trickle."""
