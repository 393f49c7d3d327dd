"""The storage setting without a server: one Location, its options everywhere, secrets kept out."""
from __future__ import annotations

import json

import pytest

from airflow_trickle.cli import build_parser
from airflow_trickle.config import TrickleConfig
from airflow_trickle.location import Location, public_options, secret_environment, spark_settings, warehouse_tables
from airflow_trickle.spark.session import runtime_conf, session_conf

OPTIONS = {"AWS_ENDPOINT_URL": "http://127.0.0.1:9000", "region": "eu-west-1", "allow_http": True,
           "aws_access_key_id": "AKIA", "aws_secret_access_key": "s3cr3t"}


def test_a_location_normalizes_its_uri_and_options_and_masks_credentials():
    location = Location("s3a://bucket/wh/", OPTIONS)
    assert location.uri == "s3a://bucket/wh" and location.is_s3 and location.local is None
    assert location.options == {"aws_endpoint": "http://127.0.0.1:9000", "aws_region": "eu-west-1",
                                "aws_allow_http": "true", "aws_access_key_id": "AKIA", "aws_secret_access_key": "s3cr3t"}
    assert location.at("s3://bucket/wh/db.db/t").options == location.options
    assert location.child("_trickle", "stream_tables").uri == "s3a://bucket/wh/_trickle/stream_tables"
    assert "s3cr3t" not in repr(location) and "AKIA" not in str(location)
    assert Location("file:/tmp/x").local == "/tmp/x" and Location("file:///tmp/x").uri == "/tmp/x"
    assert public_options(location.options).keys() == {"aws_endpoint", "aws_region", "aws_allow_http"}
    assert secret_environment(location.options) == {"AWS_ACCESS_KEY_ID": "AKIA", "AWS_SECRET_ACCESS_KEY": "s3cr3t"}


def test_the_spark_side_gets_the_same_settings_as_s3a():
    conf = spark_settings(Location("s3://bucket/wh", OPTIONS))
    assert conf["spark.hadoop.fs.s3.impl"] == "org.apache.hadoop.fs.s3a.S3AFileSystem"
    assert conf["spark.hadoop.fs.s3a.endpoint"] == "http://127.0.0.1:9000"
    assert conf["spark.hadoop.fs.s3a.path.style.access"] == "true"
    assert conf["spark.hadoop.fs.s3a.connection.ssl.enabled"] == "false"
    assert conf["spark.hadoop.fs.s3a.endpoint.region"] == "eu-west-1"
    assert conf["spark.hadoop.fs.s3a.secret.key"] == "s3cr3t"
    assert spark_settings(Location("/tmp/wh")) == {}


def test_sessions_started_by_a_command_line_get_no_credentials_and_connect_clients_no_storage_settings(monkeypatch):
    monkeypatch.setattr("airflow_trickle.spark.session.s3a_jars", lambda: ["/jars/hadoop-aws.jar"])
    config = TrickleConfig(warehouse="s3://bucket/wh", storage_options=OPTIONS)
    embedded = session_conf(config, config.warehouse)
    assert embedded["spark.hadoop.fs.s3a.secret.key"] == "s3cr3t" and "/jars/hadoop-aws.jar" in embedded["spark.jars"]
    submitted = session_conf(config, config.warehouse, secrets=False)
    assert not any("s3cr3t" in v or "AKIA" in v for v in submitted.values())
    assert "spark.hadoop.fs.s3a.endpoint" in submitted
    assert not any(k.startswith("spark.hadoop.") for k in runtime_conf(config))


def test_storage_options_come_from_the_environment_and_name_credentials_by_variable(monkeypatch):
    monkeypatch.setenv("TRICKLE_STORAGE_OPTIONS", json.dumps({"aws_region": "us-east-2",
                                                              "aws_secret_access_key": "${MY_SECRET}"}))
    monkeypatch.setenv("MY_SECRET", "from-env")
    config = TrickleConfig.from_env(warehouse="s3://b/w", lease_seconds=30)
    assert config.storage_options == {"aws_region": "us-east-2", "aws_secret_access_key": "from-env"}
    assert config.lease_seconds == 30 and "from-env" not in repr(config)
    monkeypatch.setenv("TRICKLE_STORAGE_OPTIONS", "[1]")
    with pytest.raises(ValueError, match="TRICKLE_STORAGE_OPTIONS must be a JSON object"):
        TrickleConfig.from_env()


def test_the_cli_takes_the_warehouse_and_storage_options_after_the_verb_too():
    args = build_parser().parse_args(["repair", "--warehouse", "s3://b/w", "--storage-option", "aws_region=x"])
    assert args.warehouse == "s3://b/w" and args.verb_storage_option == ["aws_region=x"]
    args = build_parser().parse_args(["--warehouse", "/tmp/wh", "--storage-option", "aws_region=y", "check"])
    assert args.warehouse == "/tmp/wh" and args.storage_option == ["aws_region=y"]


def test_a_local_warehouse_is_listed_like_a_bucket(tmp_path):
    (tmp_path / "shop.db" / "orders" / "_delta_log").mkdir(parents=True)
    (tmp_path / "shop.db" / "notes").mkdir()
    (tmp_path / "plain" / "_delta_log").mkdir(parents=True)
    (tmp_path / "_trickle" / "stream_tables" / "_delta_log").mkdir(parents=True)
    found = warehouse_tables(Location(str(tmp_path)))
    assert found == {"shop.orders": str(tmp_path / "shop.db" / "orders"), "shop.": "",
                     "default.plain": str(tmp_path / "plain")}
