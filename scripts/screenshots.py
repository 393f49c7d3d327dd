"""Regenerate the screenshots of docs/airflow.md: the example in Airflow's UI, in headless Chromium.

    .venv/bin/pip install selenium                      # once; not a test dependency
    sudo apt-get install chromium chromium-driver       # Debian's headless browser and its driver
    .venv/bin/python scripts/screenshots.py [--warehouse DIR] [--out docs/images]

1. runs the example (``dags_example/run_example.py``) into a fresh warehouse, unless
   ``--warehouse`` names one it already ran in: three DAG runs and a refused one, recorded in
   the Airflow metadata DB under ``<warehouse>/_airflow``;
2. serves that Airflow's UI (``airflow api-server``, the simple auth manager with every user an
   admin: a throw-away local instance) with the Stream tables plugin pointed at the warehouse;
3. takes, in a 1400x900 window: the DAG's grid, the task graph, the manual run with its note
   and one of its tasks with its note, the trigger form with its table pick-list open, the
   asset lineage, and the Stream tables page with one row unfolded.
"""
from __future__ import annotations

import argparse
import os
import shutil
import sqlite3
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from urllib.parse import quote

from airflow_trickle.spark.service import free_port

ROOT = Path(__file__).resolve().parent.parent
DAG_ID = "trickle_shop"


def run_example(warehouse: str) -> None:
    print(f"running the example into {warehouse} (a few minutes)", flush=True)
    subprocess.run([sys.executable, str(ROOT / "dags_example" / "run_example.py"), "--warehouse", warehouse],
                   check=True, stdout=subprocess.DEVNULL)


def serve_ui(warehouse: str, port: int) -> subprocess.Popen:
    home = os.path.join(warehouse, "_airflow")
    env = {**os.environ, "AIRFLOW_HOME": home, "AIRFLOW__CORE__DAGS_FOLDER": str(ROOT / "dags_example"),
           "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
           "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": f"sqlite:///{home}/airflow.db",
           "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_ALL_ADMINS": "True",
           "AIRFLOW__AIRFLOW_TRICKLE__WAREHOUSES": warehouse, "TRICKLE_WAREHOUSE": warehouse,
           "TRICKLE_DAG_DEADLINES": "off"}
    subprocess.run([sys.executable, "-m", "airflow", "db", "migrate"], check=True, env=env, stdout=subprocess.DEVNULL)
    subprocess.run([sys.executable, "-m", "airflow", "dags", "reserialize"], check=True, env=env,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    server = subprocess.Popen([sys.executable, "-m", "airflow", "api-server", "--port", str(port)], env=env,
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline:
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/api/v2/monitor/health", timeout=2)
            return server
        except OSError:
            time.sleep(1)
    server.terminate()
    raise SystemExit("the Airflow API server did not start within 3 minutes")


def manual_run_id(home: str) -> str:
    """The example's manual FULL run (the one whose tasks note FULL refreshes and skips)."""
    with sqlite3.connect(f"{home}/airflow.db") as db:
        found = db.execute("SELECT run_id FROM dag_run WHERE dag_id = ? AND CAST(conf AS TEXT) LIKE '%FULL%' "
                           "ORDER BY id DESC", (DAG_ID,)).fetchone()
    if found is None:
        raise SystemExit("the example's manual FULL run is not in its Airflow metadata DB")
    return quote(found[0], safe="")


def shoot(port: int, out: Path, home: str) -> list[Path]:
    from selenium import webdriver
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support import expected_conditions as ec
    from selenium.webdriver.support.ui import WebDriverWait

    options = webdriver.ChromeOptions()
    for flag in ("--headless=new", "--no-sandbox", "--disable-gpu", "--window-size=1400,900"):
        options.add_argument(flag)
    browser, chromedriver = shutil.which("chromium"), shutil.which("chromedriver")
    if browser:
        options.binary_location = browser
    # the system's driver: selenium's own manager would try to download one
    service = webdriver.ChromeService(executable_path=chromedriver) if chromedriver else None
    driver = webdriver.Chrome(options=options, service=service)
    wait = WebDriverWait(driver, 60)
    base = f"http://127.0.0.1:{port}"
    taken = []

    def asset_id(name: str) -> int:
        with sqlite3.connect(f"{home}/airflow.db") as db:
            return db.execute("SELECT id FROM asset WHERE name = ?", (name,)).fetchone()[0]

    def save(name: str, settle: float = 2.0) -> None:
        time.sleep(settle)
        path = out / f"{name}.png"
        driver.save_screenshot(str(path))
        taken.append(path)
        print(f"  {path.relative_to(ROOT) if path.is_relative_to(ROOT) else path}", flush=True)

    def click(xpath: str) -> None:
        wait.until(ec.element_to_be_clickable((By.XPATH, xpath))).click()

    try:
        driver.get(f"{base}/dags/{DAG_ID}")
        wait.until(ec.presence_of_element_located((By.XPATH, "//*[contains(text(), 'region_report')]")))
        for toggle in driver.find_elements(By.XPATH, "//*[normalize-space()='shop']/following-sibling::*[1]"
                                                     " | //button[.//*[normalize-space()='shop']]"):
            try:  # unfold the task group in the grid
                toggle.click()
                break
            except Exception:  # noqa: BLE001 - a cosmetic step: the shot is still useful folded
                continue
        save("airflow_grid")
        driver.find_element(By.TAG_NAME, "body").send_keys("g")  # the UI's shortcut: grid <-> graph
        time.sleep(2)
        for node in driver.find_elements(By.XPATH, "//*[contains(text(), 'Tasks') and contains(text(), '+')]"):
            try:  # unfold the task group in the graph
                node.click()
                break
            except Exception:  # noqa: BLE001 - as above
                continue
        save("airflow_graph", settle=4)
        # the manual run: its note (the plan task's selection) and each task's note (its outcome)
        manual = manual_run_id(home)
        driver.get(f"{base}/dags/{DAG_ID}/runs/{manual}")
        wait.until(ec.presence_of_element_located((By.XPATH, "//*[contains(text(), 'mode FULL')]")))
        save("airflow_run_notes")
        driver.get(f"{base}/dags/{DAG_ID}/runs/{manual}/tasks/shop.order_lines")
        wait.until(ec.presence_of_element_located((By.XPATH, "//*[contains(text(), 'FULL +')]")))
        save("airflow_task_note")
        driver.get(f"{base}/dags/{DAG_ID}")
        click("//button[normalize-space()='Trigger']")
        wait.until(ec.presence_of_element_located((By.XPATH, "//*[contains(text(), 'Stream tables')]")))
        save("airflow_trigger_form")
        click("//*[@id='element_tables']/ancestor::*[contains(@class, 'control') or @role='combobox'][1]"
              " | //*[@id='element_tables']")
        save("airflow_trigger_pick_list", settle=1)
        # Airflow's asset graph of the end of the chain, as task dependencies: its lineage
        # source -> refresh task -> stream table -> ... (the tasks' inlets and outlets)
        driver.get(f"{base}/assets/{asset_id('trickle/shop/shop.top_customers')}")
        click("//*[normalize-space()='Task Dependencies']")
        time.sleep(3)
        click("//button[contains(@class, 'react-flow__controls-fitview')]")  # the whole graph in view
        save("airflow_asset_lineage", settle=2)
        driver.get(f"{base}/plugin/stream-tables")
        frame = wait.until(ec.presence_of_element_located((By.TAG_NAME, "iframe")))
        driver.switch_to.frame(frame)
        wait.until(ec.presence_of_element_located((By.CSS_SELECTOR, "tr.row")))
        driver.find_elements(By.CSS_SELECTOR, "tr.row")[0].click()
        wait.until(ec.presence_of_element_located((By.CSS_SELECTOR, "tr.detail")))
        driver.switch_to.default_content()
        save("airflow_stream_tables_page")
    finally:
        driver.quit()
    return taken


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--warehouse", help="a warehouse the example already ran in (default: run it now)")
    parser.add_argument("--out", default=str(ROOT / "docs" / "images"))
    args = parser.parse_args()
    import importlib.util

    if importlib.util.find_spec("selenium") is None:
        raise SystemExit("needs selenium: .venv/bin/pip install selenium (and apt-get install chromium chromium-driver)")
    warehouse = os.path.abspath(args.warehouse or tempfile.mkdtemp(prefix="trickle-screens-"))
    if not args.warehouse:
        run_example(warehouse)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    port = free_port()
    server = serve_ui(warehouse, port)
    print(f"Airflow UI at http://127.0.0.1:{port}; screenshots:", flush=True)
    try:
        shoot(port, out, os.path.join(warehouse, "_airflow"))
    finally:
        os.killpg(server.pid, 15)
    return 0


if __name__ == "__main__":
    sys.exit(main())
