"""Notes on task instances and runs: each refresh task's outcome in one line, and the ``plan``
task's selection on its run -- visible in Airflow's grid and run pages without opening a log.

Airflow 3.3's Task SDK has no call for notes, so they go through Airflow's public REST API, the
way a user sets them in the UI: as the user of an Airflow connection the project names
(``airflow.notes_connection``: host and port of the API server, login and password of a user
allowed to edit the DAG's runs). A project without one writes no notes. A request the API server
fails transiently (no answer in time, a 5xx such as a locked metadata database, 429) is tried
again, twice, after a pause; a note that still cannot be written is logged and never fails the
task.
"""
from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from urllib.parse import quote

log = logging.getLogger(__name__)

#: Airflow keeps a note of at most this many characters.
MAX_NOTE = 1000
#: Seconds to wait before each further try of a request that failed transiently.
RETRY_PAUSES = (2.0, 5.0)
#: Seconds a request may take: an API server on a busy machine answers slowly, not never.
TIMEOUT = 30


@dataclass
class NoteWriter:
    """Writes notes through the REST API of the Airflow at ``base_url`` as one user."""

    base_url: str
    username: str
    password: str
    #: Anything with ``requests``' ``post``/``patch`` (a ``requests.Session``; a test client).
    client: object = None

    def task_note(self, dag_id: str, run_id: str, task_id: str, text: str) -> None:
        self._patch(f"/api/v2/dags/{_q(dag_id)}/dagRuns/{_q(run_id)}/taskInstances/{_q(task_id)}", text)

    def run_note(self, dag_id: str, run_id: str, text: str) -> None:
        self._patch(f"/api/v2/dags/{_q(dag_id)}/dagRuns/{_q(run_id)}", text)

    def _patch(self, path: str, text: str) -> None:
        self._send("patch", path, params={"update_mask": "note"}, json={"note": _clip(text)},
                   headers=self._authorization())

    def _authorization(self) -> dict:
        response = self._send("post", "/auth/token", json={"username": self.username, "password": self.password})
        return {"Authorization": f"Bearer {response.json()['access_token']}"}

    def _send(self, method: str, path: str, **kwargs):
        """The response to one request, tried again after each of ``RETRY_PAUSES`` while it fails
        transiently; any other failure (a refused login, a run that does not exist) at once."""
        for pause in RETRY_PAUSES:
            try:
                response = self._request(method, path, **kwargs)
            except OSError as err:  # requests' connection errors and timeouts are OSErrors
                log.info("note request %s %s failed (%s); trying again in %s s", method.upper(), path, err, pause)
            else:
                if not _transient(response.status_code):
                    break
                log.info("note request %s %s answered %s; trying again in %s s",
                         method.upper(), path, response.status_code, pause)
            time.sleep(pause)
        else:  # the last try: what it answers or raises stands
            response = self._request(method, path, **kwargs)
        response.raise_for_status()
        return response

    def _request(self, method: str, path: str, **kwargs):
        return getattr(self._http(), method)(f"{self.base_url}{path}", timeout=TIMEOUT, **kwargs)

    def _http(self):
        if self.client is None:
            import requests

            self.client = requests.Session()
        return self.client


def writer_for(conn_id: str | None) -> NoteWriter | None:
    """The note writer of the Airflow connection ``conn_id`` (None: no notes)."""
    if not conn_id:
        return None
    from airflow.sdk import BaseHook

    conn = BaseHook.get_connection(conn_id)
    return NoteWriter(api_base_url(conn.host, conn.port, conn.schema), conn.login or "", conn.password or "")


def api_base_url(host: str | None, port: int | None = None, scheme: str | None = None) -> str:
    """The API server's base URL from a connection's fields (a host may carry a scheme and the
    path Airflow is served under).

    >>> api_base_url("localhost", 8080), api_base_url("https://example.com/airflow/", 8443)
    ('http://localhost:8080', 'https://example.com:8443/airflow')
    >>> api_base_url("example.com", None, "https"), api_base_url(None)
    ('https://example.com', 'http://localhost')
    """
    from urllib.parse import urlsplit, urlunsplit

    url = str(host or "localhost")
    parts = urlsplit(url if "://" in url else f"{scheme or 'http'}://{url}")
    netloc = parts.netloc if not port or parts.port else f"{parts.hostname}:{port}"
    return urlunsplit((parts.scheme, netloc, parts.path.rstrip("/"), "", ""))


def write_task_note(conn_id: str | None, context, text: str, *, writer: NoteWriter | None = None) -> bool:
    """Set the running task instance's note to ``text``; False (logged) when it could not."""
    return _write(conn_id, writer, lambda w, ti: w.task_note(ti.dag_id, ti.run_id, ti.task_id, text), context)


def write_run_note(conn_id: str | None, context, text: str, *, writer: NoteWriter | None = None) -> bool:
    """Set the run's note to ``text``; False (logged) when it could not."""
    return _write(conn_id, writer, lambda w, ti: w.run_note(ti.dag_id, ti.run_id, text), context)


def _write(conn_id, writer, action, context) -> bool:
    if writer is None and not conn_id:
        return False
    try:
        action(writer or writer_for(conn_id), context["ti"])
        return True
    except Exception as err:  # noqa: BLE001 - safe: a note is for people; the task's outcome stands
        log.warning("could not write the note through connection %r: %s", conn_id, err)
        return False


def _transient(status: int) -> bool:
    """Whether an HTTP status says "try again later" rather than "no".

    >>> [_transient(s) for s in (200, 401, 404, 429, 500, 503)]
    [False, False, False, True, True, True]
    """
    return status == 429 or status >= 500


def _clip(text: str) -> str:
    """``text`` cut to what Airflow keeps, marked when cut.

    >>> len(_clip("x" * 2000)), _clip("x" * 2000)[-1], _clip("short")
    (1000, '…', 'short')
    """
    return text if len(text) <= MAX_NOTE else text[:MAX_NOTE - 1] + "…"


def _q(part: str) -> str:
    return quote(part, safe="")
