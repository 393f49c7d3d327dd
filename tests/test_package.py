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


def test_airflow_knows_every_piece_of_the_provider_and_logs_no_problem():
    """What Airflow's providers manager makes of the provider info, in a process of its own:
    the connection form without importing the hook, every trigger, the notifier class, the
    configuration section, the asset scheme and the plugin -- and no warning or error about us."""
    import json
    import subprocess
    import sys

    code = r'''
import json, logging, warnings
records = []
class Keep(logging.Handler):
    def emit(self, record):
        records.append(record.getMessage())
logging.getLogger().addHandler(Keep(level=logging.WARNING))
warnings.simplefilter("always")
with warnings.catch_warnings(record=True) as caught:
    from airflow.providers_manager import ProvidersManager
    pm = ProvidersManager()
    hook = pm.hooks["trickle"]
    found = {
        "hook": [hook.hook_class_name, hook.connection_type, hook.hook_name] if hook else None,
        "behaviour": pm.field_behaviours.get("trickle"),
        "triggers": sorted(t.trigger_class_name for t in pm.trigger if t.package_name == "airflow-trickle"),
        "notifications": sorted(n for n in pm.notification if n.startswith("airflow_trickle")),
        "config": pm.provider_configs and dict(pm.provider_configs).get("airflow-trickle", {}).get("airflow_trickle"),
        "plugins": [p.plugin_class for p in pm.plugins if p.provider_name == "airflow-trickle"],
    }
found["problems"] = [m for m in records + [str(w.message) for w in caught]
                     if "trickle" in m.lower() or "TrickleHook" in m]
print(json.dumps(found, default=str))
'''
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    found = json.loads(done.stdout.strip().splitlines()[-1])
    assert found["problems"] == [], found["problems"]
    assert found["hook"] == ["airflow_trickle.hooks.trickle.TrickleHook", "trickle", "airflow_trickle warehouse"]
    assert found["behaviour"]["hidden_fields"] == ["schema", "login", "password", "port"]
    assert found["behaviour"]["relabeling"] == {"host": "Warehouse (path or URI)"}
    assert found["triggers"] == ["airflow_trickle.triggers.source_commit", "airflow_trickle.triggers.source_data"]
    assert found["notifications"] == ["airflow_trickle.notifiers.freshness.FreshnessMissLogNotifier"]
    assert found["config"]["options"]["warehouses"]["default"] == ""
    assert found["plugins"] == ["airflow_trickle.plugins.stream_tables.StreamTablesPlugin"]


def test_the_version_is_single_sourced_and_the_package_says_it_is_typed():
    from importlib.metadata import metadata, version
    from pathlib import Path

    import airflow_trickle

    assert version("airflow-trickle") == airflow_trickle.__version__
    assert (Path(airflow_trickle.__file__).parent / "py.typed").exists()
    assert metadata("airflow-trickle")["Name"] == "airflow-trickle"
