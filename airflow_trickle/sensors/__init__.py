"""Airflow sensors of airflow_trickle."""
