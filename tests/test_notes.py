"""Task and run notes through Airflow's REST API (``airflow_trickle.operators.notes``), without Airflow: a
fake HTTP client answers as a busy or a refusing API server would."""
from __future__ import annotations

from types import SimpleNamespace

import pytest

from airflow_trickle.operators import notes
from airflow_trickle.operators.notes import NoteWriter, write_task_note


class Answer:
    def __init__(self, status: int, body: dict | None = None):
        self.status_code, self.body = status, body or {}

    def json(self) -> dict:
        return self.body

    def raise_for_status(self) -> None:
        if self.status_code >= 400:
            raise RuntimeError(f"HTTP {self.status_code}")


class Client:
    """Answers each request with the next of ``answers`` (an exception is raised), and keeps the
    requests it was sent."""

    def __init__(self, *answers):
        self.answers, self.sent = list(answers), []

    def _answer(self, method, url, **kwargs):
        self.sent.append((method, url.removeprefix("http://airflow"), kwargs.get("json")))
        answer = self.answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return answer

    def post(self, url, **kwargs):
        return self._answer("POST", url, **kwargs)

    def patch(self, url, **kwargs):
        return self._answer("PATCH", url, **kwargs)


CONTEXT = {"ti": SimpleNamespace(dag_id="trickle_p", run_id="manual__1", task_id="db.a")}
TOKEN = Answer(200, {"access_token": "t"})
NOTE_PATH = "/api/v2/dags/trickle_p/dagRuns/manual__1/taskInstances/db.a"


@pytest.fixture(autouse=True)
def no_pauses(monkeypatch):
    slept = []
    monkeypatch.setattr(notes.time, "sleep", slept.append)
    return slept


def test_a_transient_failure_is_tried_again_and_the_note_written(no_pauses):
    # a timed-out login, then a locked metadata database (500) on the note itself
    client = Client(TimeoutError("read timed out"), TOKEN, Answer(500), Answer(200))
    writer = NoteWriter("http://airflow", "noter", "pw", client=client)
    assert write_task_note("c", CONTEXT, "skipped: not selected in this manual run", writer=writer)
    assert [(m, p) for m, p, _ in client.sent] == [
        ("POST", "/auth/token"), ("POST", "/auth/token"), ("PATCH", NOTE_PATH), ("PATCH", NOTE_PATH)]
    assert client.sent[-1][2] == {"note": "skipped: not selected in this manual run"}
    assert no_pauses == [notes.RETRY_PAUSES[0], notes.RETRY_PAUSES[0]]


def test_a_refusal_is_not_tried_again_and_a_lasting_failure_gives_up(no_pauses, caplog):
    refused = Client(Answer(401))
    assert not write_task_note("c", CONTEXT, "x", writer=NoteWriter("http://airflow", "noter", "wrong", client=refused))
    assert len(refused.sent) == 1 and no_pauses == []
    down = Client(*[Answer(503)] * (len(notes.RETRY_PAUSES) + 1))
    assert not write_task_note("c", CONTEXT, "x", writer=NoteWriter("http://airflow", "noter", "pw", client=down))
    assert len(down.sent) == len(notes.RETRY_PAUSES) + 1 and no_pauses == list(notes.RETRY_PAUSES)
    assert "could not write the note through connection 'c': HTTP 503" in caplog.text
