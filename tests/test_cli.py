"""The command line's conventions, without a JVM: --version, exit codes (2: the command line is
wrong; 1: the work was refused or failed), and a mistyped warehouse or table refused from the
catalog before Spark starts or anything is created."""
from __future__ import annotations

import subprocess
import sys

import pytest

from airflow_trickle import __version__
from airflow_trickle.catalog import StreamTable
from airflow_trickle.catalog.store import CatalogStore
from airflow_trickle.cli import main
from airflow_trickle.errors import TrickleError


def trickle(*args, env=None):
    return subprocess.run([sys.executable, "-m", "airflow_trickle.cli", *args], capture_output=True, text=True,
                          env=env)


@pytest.fixture
def warehouse(tmp_path):
    """A warehouse whose catalog holds one stream table (written by delta-rs, no Spark)."""
    catalog = CatalogStore(str(tmp_path / "_trickle"))
    catalog.insert(StreamTable("shop.t", "id-1", "SELECT 1", "SELECT 1", "5m", "FULL", "FULL"), [])
    return str(tmp_path)


def no_jvm_code(argv: list[str]) -> str:
    """Python that runs ``trickle argv`` in-process, then prints whether pyspark was imported."""
    return ("import sys\nfrom airflow_trickle.cli import main\ncode = main(%r)\n"
            "print('pyspark' in sys.modules, code)" % (argv,))


def test_version_and_usage_errors():
    done = trickle("--version")
    assert done.returncode == 0 and done.stdout.strip() == f"trickle (airflow-trickle) {__version__}"
    done = trickle("--warehouse", "/tmp", "refresh")  # NAME missing: the command line is wrong
    assert done.returncode == 2 and done.stderr.startswith("usage: ")


def run(argv, capsys) -> tuple[int, str, str]:
    code = main(argv)
    out, err = capsys.readouterr()
    return code, out, err


def test_a_mistyped_warehouse_is_refused_and_nothing_is_created_there(tmp_path, capsys):
    typo = tmp_path / "warehuose"
    for verb in (["status"], ["history"], ["explain", "shop.t"], ["refresh", "shop.t"], ["health"]):
        code, _, err = run(["--warehouse", str(typo), *verb], capsys)
        assert code == 1, (verb, err)
        assert err.startswith(f"trickle: error: warehouse {typo} has no stream tables") and len(err.splitlines()) == 1
    assert not typo.exists()


@pytest.mark.parametrize("verb", [["explain", "shop.nope"], ["history", "shop.nope"], ["status", "shop.nope"],
                                  ["refresh", "shop.nope"], ["alter", "shop.nope", "--schedule", "1m"],
                                  ["drop", "shop.nope"]])
def test_an_unknown_stream_table_is_refused(warehouse, verb, capsys):
    assert run(["--warehouse", warehouse, *verb], capsys)[::2] == (
        1, "trickle: error: stream table 'shop.nope': no such stream table "
           "(`trickle status` lists the stream tables of the warehouse)\n")


def test_the_refusal_and_a_drop_if_exists_start_no_jvm(warehouse):
    for argv, code in ((["explain", "shop.nope"], 1), (["drop", "shop.nope", "--if-exists"], 0)):
        done = subprocess.run([sys.executable, "-c", no_jvm_code(["--warehouse", warehouse, *argv])],
                              capture_output=True, text=True, check=True)
        assert done.stdout.split()[-2:] == ["False", str(code)], done


def test_bad_storage_options_and_a_missing_query_file_are_one_line_errors(warehouse, tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("TRICKLE_STORAGE_OPTIONS", "{aws_region: eu")
    code, _, err = run(["--warehouse", warehouse, "status"], capsys)
    assert code == 1 and err.startswith("trickle: error: $TRICKLE_STORAGE_OPTIONS is not JSON")
    monkeypatch.setenv("TRICKLE_STORAGE_OPTIONS", "[1]")
    assert "must be a JSON object" in run(["--warehouse", warehouse, "status"], capsys)[2]
    monkeypatch.delenv("TRICKLE_STORAGE_OPTIONS")
    missing = tmp_path / "missing.sql"
    assert run(["--warehouse", warehouse, "create", "shop.u", "--query-file", str(missing)], capsys)[::2] == (
        1, f"trickle: error: stream table 'shop.u': cannot read --query-file '{missing}': No such file or directory\n")


def test_trickle_refuses_unknown_settings_and_settings_beside_a_config_and_closes_as_a_context(tmp_path):
    from airflow_trickle import Trickle, TrickleConfig

    with pytest.raises(TrickleError, match="unknown setting 'lease_secs'"):
        Trickle(str(tmp_path), lease_secs=10)
    with pytest.raises(TrickleError, match=r"config= or as keywords, not both \(lease_seconds given"):
        Trickle(str(tmp_path), config=TrickleConfig(warehouse=str(tmp_path)), lease_seconds=10)
    assert Trickle(str(tmp_path), lease_seconds=10).config.lease_seconds == 10
    with Trickle(str(tmp_path)) as tr:  # no Spark was started, so closing stops nothing
        assert tr.warehouse == str(tmp_path)
    assert tr._spark is None


def test_options_may_follow_the_verb():
    from airflow_trickle.cli import build_parser

    args = build_parser().parse_args(["serve", "--master", "local[1]", "--warehouse", "/w", "--port", "0"])
    assert (args.master, args.warehouse, args.port) == ("local[1]", "/w", 0)
    args = build_parser().parse_args(["--master", "local[2]", "status", "--remote", "sc://127.0.0.1:1"])
    assert (args.master, args.remote) == ("local[2]", "sc://127.0.0.1:1")


def test_history_shows_each_refresh_plan_and_its_fallbacks(warehouse, capsys):
    from airflow_trickle.catalog.model import RefreshRecord

    plan = {"action": "DIFFERENTIAL", "placement": "auto",
            "commit": {"committer": "delta-rs", "reason": "~3 stored rows touched", "rows": 3, "bytes": 900},
            "parts": [{"part": "shop.o change", "path": "probed", "reason": "a large input", "rows": 3, "bytes": None},
                      {"part": "shop.c change", "path": "scanned", "reason": "placement: spark", "rows": 1,
                       "bytes": None}],
            "fallbacks": [{"part": "shop.o change", "planned": "probed", "taken": "scanned",
                           "cause": "Stale: a scan is cheaper"}],
            "taken": []}
    CatalogStore(f"{warehouse}/_trickle").append_history(RefreshRecord("r1", "shop.t", 1, "DIFFERENTIAL", "COMPLETED",
                                                                       phases={"commit": 5}, plan=plan))
    assert main(["--warehouse", warehouse, "history", "shop.t"]) == 0
    assert "commit delta-rs · 1 probed, 1 scanned · 1 fallback (shop.o change)" in capsys.readouterr().out
    assert main(["--warehouse", warehouse, "history", "shop.t", "--json"]) == 0
    assert '"cause": "Stale: a scan is cheaper"' in capsys.readouterr().out
