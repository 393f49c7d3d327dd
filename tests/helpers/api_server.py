"""Airflow's API server in this process, with a throw-away metadata DB; what the Stream tables
page answers to an anonymous request, to a viewer, and the page itself, printed as JSON.  With
a dags folder, its DAGs are serialized into the DB first, and Airflow's data lineage of every
stream-table asset (what the asset page draws) is printed too.

    python -m tests.helpers.api_server WAREHOUSE [DAGS_FOLDER]

A separate process: Airflow reads its home and configuration once, at import.
"""
import json
import os
import subprocess
import sys
import tempfile


def main(warehouse: str, dags_folder: str | None = None) -> None:
    home = tempfile.mkdtemp(prefix="trickle-api-")
    os.environ.update(AIRFLOW_HOME=home, AIRFLOW__CORE__LOAD_EXAMPLES="False",
                      AIRFLOW__DATABASE__SQL_ALCHEMY_CONN=f"sqlite:///{home}/airflow.db",
                      AIRFLOW__API_AUTH__JWT_SECRET="a-test-secret-that-is-long-enough-for-hs512-" * 2,
                      AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS="viewer:viewer,noter:op",
                      AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_PASSWORDS_FILE=f"{home}/passwords.json",
                      AIRFLOW__AIRFLOW_TRICKLE__WAREHOUSES=warehouse, TRICKLE_WAREHOUSE=warehouse)
    with open(f"{home}/passwords.json", "w") as passwords:  # the note writer logs in as "noter"
        json.dump({"viewer": "viewer", "noter": "a-noter-password"}, passwords)
    if dags_folder:
        os.environ["AIRFLOW__CORE__DAGS_FOLDER"] = dags_folder
    subprocess.run([sys.executable, "-m", "airflow", "db", "migrate"], check=True, stdout=subprocess.DEVNULL,
                   stderr=subprocess.DEVNULL)
    if dags_folder:
        subprocess.run([sys.executable, "-m", "airflow", "dags", "reserialize"], check=True,
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    from airflow.api_fastapi.app import create_app, get_auth_manager
    from airflow.api_fastapi.auth.managers.simple.user import SimpleAuthManagerUser
    from fastapi.testclient import TestClient

    client = TestClient(create_app())
    token = get_auth_manager().generate_jwt(SimpleAuthManagerUser(username="viewer", role="viewer"))
    bearer = {"Authorization": f"Bearer {token}"}
    name = json.loads(client.get("/trickle/api/stream_tables", headers=bearer).text)["warehouses"][0]
    first = name["stream_tables"][0]["name"] if name["stream_tables"] else "none"
    out = {
        "anonymous_page": client.get("/trickle/").status_code,
        "anonymous_data": client.get("/trickle/api/stream_tables").status_code,
        "bad_token": client.get("/trickle/api/stream_tables", headers={"Authorization": "Bearer nope"}).status_code,
        "page": client.get("/trickle/", cookies={"_token": token}).text,
        "data": client.get("/trickle/api/stream_tables", headers=bearer).json(),
        "tree": client.get(f"/trickle/api/stream_tables/{first}/tree", params={"warehouse": warehouse},
                           headers=bearer).json(),
        "plugins": client.get("/api/v2/plugins", headers=bearer).json(),
    }
    if dags_folder:  # per stream-table asset, the graph of Airflow's data lineage, as labelled edges
        lineage = {}
        for asset in client.get("/api/v2/assets", params={"limit": 100}, headers=bearer).json()["assets"]:
            if "stream_table" not in (asset.get("extra") or {}):
                continue
            graph = client.get("/ui/dependencies", params={"node_id": f"asset:{asset['id']}",
                                                           "dependency_type": "data"}, headers=bearer).json()
            label = {node["id"]: node["label"] for node in graph["nodes"]}
            lineage[asset["name"]] = sorted([label[e["source_id"]], label[e["target_id"]]] for e in graph["edges"])
        out["lineage"] = lineage
        out["notes"] = _notes(client, bearer)
    print("RESULT " + json.dumps(out))


def _notes(client, bearer: dict) -> dict:
    """Trigger a run of the example's DAG and write a task note and a run note the way a refresh
    task does (``airflow_trickle.operators.notes``, logging in as "noter"); read them back; and try once
    with a wrong password (the writer must say False, not raise)."""
    from types import SimpleNamespace

    from airflow_trickle.operators.notes import NoteWriter, write_run_note, write_task_note

    dag_id = "trickle_shop"
    run = client.post(f"/api/v2/dags/{dag_id}/dagRuns", json={"logical_date": None}, headers=_admin())
    run_id = run.json().get("dag_run_id")
    ti = SimpleNamespace(dag_id=dag_id, run_id=run_id, task_id="shop.order_lines")
    writer = NoteWriter("http://testserver", "noter", "a-noter-password", client=client)
    wrote = [write_task_note("notes", {"ti": ti}, "DIFFERENTIAL +12 -3 rows in 1.4 s", writer=writer),
             write_run_note("notes", {"ti": ti}, "manual run: shop.order_lines (mode AUTO)", writer=writer)]
    wrong = NoteWriter("http://testserver", "noter", "not-the-password", client=client)
    refused = write_task_note("notes", {"ti": ti}, "never written", writer=wrong)
    task = client.get(f"/api/v2/dags/{dag_id}/dagRuns/{run_id}/taskInstances/{ti.task_id}", headers=bearer).json()
    run = client.get(f"/api/v2/dags/{dag_id}/dagRuns/{run_id}", headers=bearer).json()
    return {"trigger": run_id, "wrote": wrote, "refused": refused, "task_note": task.get("note"),
            "run_note": run.get("note")}


def _admin() -> dict:
    from airflow.api_fastapi.app import get_auth_manager
    from airflow.api_fastapi.auth.managers.simple.user import SimpleAuthManagerUser

    token = get_auth_manager().generate_jwt(SimpleAuthManagerUser(username="admin", role="admin"))
    return {"Authorization": f"Bearer {token}"}


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2] if len(sys.argv) > 2 else None)
