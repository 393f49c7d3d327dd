"""Airflow hooks of airflow_trickle."""
