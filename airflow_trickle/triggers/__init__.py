"""Airflow triggers of airflow_trickle (run by the triggerer)."""
