"""Airflow's API server in this process, with a throw-away metadata DB; what the Stream tables
page answers to an anonymous request, to a viewer, and the page itself, printed as JSON.

    python -m tests.helpers.api_server WAREHOUSE

A separate process: Airflow reads its home and configuration once, at import.
"""
import json
import os
import subprocess
import sys
import tempfile


def main(warehouse: str) -> None:
    home = tempfile.mkdtemp(prefix="trickle-api-")
    os.environ.update(AIRFLOW_HOME=home, AIRFLOW__CORE__LOAD_EXAMPLES="False",
                      AIRFLOW__DATABASE__SQL_ALCHEMY_CONN=f"sqlite:///{home}/airflow.db",
                      AIRFLOW__API_AUTH__JWT_SECRET="a-test-secret-that-is-long-enough-for-hs512-" * 2,
                      AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS="viewer:viewer",
                      AIRFLOW__AIRFLOW_TRICKLE__WAREHOUSES=warehouse)
    subprocess.run([sys.executable, "-m", "airflow", "db", "migrate"], check=True, stdout=subprocess.DEVNULL,
                   stderr=subprocess.DEVNULL)
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
    print("RESULT " + json.dumps(out))


if __name__ == "__main__":
    main(sys.argv[1])
