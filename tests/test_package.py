"""The package as Airflow sees it: a provider found through its entry point."""
from importlib.metadata import entry_points


def test_provider_entry_point_names_this_distribution():
    (entry,) = [e for e in entry_points(group="apache_airflow_provider") if e.value.startswith("airflow_trickle")]
    info = entry.load()()
    assert info["package-name"] == "airflow-trickle"  # must equal the distribution name
    assert info["versions"] and info["name"] == "airflow_trickle"


def test_importing_the_package_and_reading_the_catalog_need_no_spark(tmp_path):
    """Airflow imports the provider and may read the catalog at parse time: no pyspark, no JVM."""
    import subprocess
    import sys

    code = (
        "import sys, airflow_trickle\n"
        "from airflow_trickle.catalog import CatalogStore\n"
        f"store = CatalogStore({str(tmp_path)!r})\n"
        "assert store.list() == []\n"
        "airflow_trickle.get_provider_info()\n"
        "print('pyspark' in sys.modules)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False"


def test_provider_info_lists_the_airflow_pieces_and_they_import():
    import importlib

    import airflow_trickle

    info = airflow_trickle.get_provider_info()
    for kind in ("operators", "sensors", "triggers", "hooks"):
        (entry,) = info[kind]
        for module in entry["python-modules"]:
            importlib.import_module(module)
    (connection,) = info["connection-types"]
    module, _, cls = connection["hook-class-name"].rpartition(".")
    hook = getattr(importlib.import_module(module), cls)
    assert connection["connection-type"] == hook.conn_type == "trickle"
