"""Dags-folder file of the example: one factory call turns the project into an Airflow DAG."""
from pathlib import Path

from airflow_trickle.dag_factory import stream_table_dag

dag = stream_table_dag(Path(__file__).parent / "shop" / "trickle.yaml")
