"""A warehouse on object storage: every verb against a real S3-compatible server, one writer per table.

The module starts s3proxy on 127.0.0.1 (``tests/helpers/s3proxy.py``) and an embedded Spark
whose warehouse is ``s3://trickle/warehouse`` (S3A on the Spark side, delta-rs and obstore on
ours, both given the same storage options).  The writer lease (``storage/lease.py``) is tested
alone, then through the engine: two processes with Sparks of their own race to refresh the
same tables while the sources change (``TRICKLE_S3_RACE_ROUNDS``, 3 here), and refreshes
killed at random moments are retried exactly.
"""
from __future__ import annotations

import contextlib
import json
import os
import random
import subprocess
import sys
import tempfile
import threading
import time
import uuid

import pytest

from airflow_trickle import Trickle
from airflow_trickle.location import Location, warehouse_tables
from airflow_trickle.storage.lease import LeaseLostError, WriterLease
from tests.conftest import TEST_SETTINGS
from tests.helpers.s3proxy import SECRET_KEY, S3Server
from tests.oracle import drive, multiset, workload

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
#: Short leases: a killed writer's tables are free again within seconds.
LEASE_SECONDS = 6.0


@pytest.fixture(scope="module")
def s3(tmp_path_factory):
    with S3Server(tmp_path_factory.mktemp("s3proxy")) as server:
        yield server


@pytest.fixture(scope="module")
def s3tr(s3, sparks):
    sparks.release_embedded()  # should the classic tests have run first in this process
    tr = Trickle(warehouse=s3.warehouse, spark_master="local[2]", storage_options=s3.storage_options,
                 lease_seconds=LEASE_SECONDS, **TEST_SETTINGS)
    tr.spark  # noqa: B018 - start the JVM once
    yield tr
    tr.close()


@pytest.fixture
def s3db(s3tr) -> str:
    name = f"s3_{uuid.uuid4().hex[:8]}"
    s3tr.sql(f"CREATE DATABASE {name}")
    return name


def _environment(s3, *, lease_seconds: float = LEASE_SECONDS) -> dict:
    return {**os.environ, "PYTHONPATH": REPO, "TRICKLE_STORAGE_OPTIONS": json.dumps(s3.storage_options),
            "TRICKLE_LEASE_SECONDS": str(lease_seconds)}


# -- the lease alone -------------------------------------------------------------------------------


def test_a_lease_is_exclusive_renewed_released_taken_over_when_lapsed_and_fences_its_old_holder(s3):
    catalog = Location(s3.warehouse, s3.storage_options).child("_lease_test")
    first = WriterLease(catalog, ["db.t"], 2.0).acquire()
    second = WriterLease(catalog, ["db.t"], 2.0)
    waiting = threading.Thread(target=second.acquire)
    waiting.start()
    time.sleep(1.5)
    assert waiting.is_alive()  # held: the second writer waits
    first.fence("db.t")        # renewed under its own ETag
    first.release()
    waiting.join(10)
    assert not waiting.is_alive() and second.waited < 3.0  # released: taken at once
    second._stop.set()  # the holder stops renewing, as a killed one would
    third = WriterLease(catalog, ["db.t"], 2.0).acquire()
    assert third.waited >= 2.0  # it waited out the lapsed lease
    with pytest.raises(LeaseLostError, match="taken by another writer"):
        second.fence("db.t")    # the old holder must not commit
    third.release()


def test_a_store_that_stalls_does_not_hand_a_renewed_lease_to_a_waiter(s3, monkeypatch):
    """The store stalls longer than the lease (a store or host under load): the holder's renewal
    and the waiter's read both wait, and the read is answered first, with the version the waiter
    saw before the stall. The lease was not proven unrenewed for its length -- the read was asked
    a moment after the first answer -- so the waiter must not take it (it did, in a loaded CI run:
    the holder's next renewal was refused, its refresh failed)."""
    import obstore

    catalog = Location(s3.warehouse, s3.storage_options).child("_lease_stall_test")
    holder = WriterLease(catalog, ["db.t"], 2.0).acquire()
    real_get, real_put = obstore.get, obstore.put
    stall = {"on": False, "reads": 0}
    read_answered = threading.Event()

    def stalled_get(store, path, *args, **kwargs):
        answer = real_get(store, path, *args, **kwargs)  # what the store serves when the stall starts
        stall["reads"] += 1
        if stall["reads"] == 2:  # the waiter's second look: the stall begins as it asks
            stall["on"] = True
            time.sleep(3.0)      # longer than the lease
            stall["on"] = False
            read_answered.set()
        return answer

    def stalled_put(store, path, *args, **kwargs):
        if stall["on"]:
            read_answered.wait(10)  # the renewal is answered after the read
        return real_put(store, path, *args, **kwargs)

    monkeypatch.setattr(obstore, "get", stalled_get)
    monkeypatch.setattr(obstore, "put", stalled_put)
    waiter = WriterLease(catalog, ["db.t"], 2.0)
    waiting = threading.Thread(target=waiter.acquire)
    waiting.start()
    assert read_answered.wait(15)
    time.sleep(1.0)
    assert waiting.is_alive(), "the waiter took a lease its holder kept renewing"
    holder.fence("db.t")  # still the holder's
    holder.release()
    waiting.join(10)
    assert not waiting.is_alive()
    waiter.release()


def test_a_write_whose_answer_is_lost_and_whose_retry_is_refused_is_still_the_holders(s3, monkeypatch):
    """A conditional PUT lands, its answer is lost (a connection reset under load), the client or
    a proxy retries it, and the store refuses the retry (412: the first try changed the ETag).
    The lease object then holds the writer's own write: its renewal, and its create, must not
    read that as a takeover. (The append race below failed in two loaded CI runs with "taken by
    another writer" and no takeover logged; a lost answer retried -- by the client, or by the
    race's crossing proxy, which sends a request again once when its upstream drops the
    connection -- is how a holder that renewed on time reads its own write as somebody else's.)"""
    import obstore
    from obstore.exceptions import AlreadyExistsError, PreconditionError

    catalog = Location(s3.warehouse, s3.storage_options).child("_lease_retry_test")
    real_put = obstore.put
    lose = {"next": None}

    def put(store, path, *args, **kwargs):
        answer = real_put(store, path, *args, **kwargs)
        refused, lose["next"] = lose["next"], None
        if refused is not None:
            raise refused("the retry of a PUT that landed")
        return answer

    monkeypatch.setattr(obstore, "put", put)
    lose["next"] = AlreadyExistsError  # the create lands; its retry finds the object there
    holder = WriterLease(catalog, ["db.t"], 5.0).acquire()
    assert holder._held["db.t"].etag
    lose["next"] = PreconditionError   # a renewal lands; its retry no longer matches the ETag
    holder.fence("db.t")
    holder.fence("db.t")               # renewed again on the ETag of the write that landed
    other = WriterLease(catalog, ["db.t"], 5.0)
    other.holder, other._held = "someone else", {}
    holder.release()
    assert other.acquire()._held["db.t"] and other.waited < 2.0  # released: taken at once
    other.release()


# -- every verb on the S3 warehouse ----------------------------------------------------------------


def test_lifecycle_on_object_storage_writes_the_bucket_and_never_the_secret(s3tr, s3, s3db):
    db = s3db
    s3tr.sql(f"CREATE TABLE {db}.o (id INT, cid INT, amount INT) USING delta")
    s3tr.sql(f"CREATE TABLE {db}.c (id INT, region STRING) USING delta")
    s3tr.sql(f"INSERT INTO {db}.o VALUES (1, 1, 10), (2, 1, NULL), (3, 2, 5), (3, 2, 5)")
    s3tr.sql(f"INSERT INTO {db}.c VALUES (1, 'n'), (2, NULL)")
    query = (f"SELECT c.region, COUNT(*) AS n, SUM(o.amount) AS s FROM {db}.o o JOIN {db}.c c "
             f"ON o.cid = c.id GROUP BY c.region")
    name = f"{db}.totals"
    st = s3tr.create_stream_table(name, query, schedule=None)
    assert st.location.startswith("s3://trickle/warehouse/")
    assert multiset(s3tr.read(name)) == multiset(s3tr.sql(query))
    s3tr.sql(f"INSERT INTO {db}.o VALUES (4, 2, 7), (5, NULL, 1)")
    s3tr.sql(f"DELETE FROM {db}.o WHERE id = 1")
    s3tr.sql(f"UPDATE {db}.c SET region = 's' WHERE id = 2")
    assert s3tr.refresh_stream_table(name).action == "DIFFERENTIAL"
    assert multiset(s3tr.read(name)) == multiset(s3tr.sql(query))
    altered = query.replace("COUNT(*) AS n", "COUNT(o.amount) AS n")
    s3tr.alter_stream_table(name, query=altered)
    assert multiset(s3tr.read(name)) == multiset(s3tr.sql(altered))
    prefix = f"warehouse/{db}.db/totals/"
    assert any(key.startswith(prefix + "_delta_log/") for key in s3.objects(prefix))
    # the lease object of the table is in the bucket, released
    lease = json.loads((s3.directory / "objects" / "trickle" / "warehouse" / "_trickle" / "_leases"
                        / f"{name}.json").read_text())
    assert lease["released"] is True
    # no credential in the catalog, the history or the storage table's properties
    for key in s3.objects("warehouse/"):
        data = (s3.directory / "objects" / "trickle" / key).read_bytes()
        assert SECRET_KEY.encode() not in data, key
    assert SECRET_KEY not in repr(s3tr.config) and SECRET_KEY not in repr(s3tr.location)
    assert f"{db}.totals" in warehouse_tables(s3tr.location)
    s3tr.drop_stream_table(name)
    assert s3.objects(prefix) == []
    assert s3tr.catalog.get(name) is None


def test_a_differential_oracle_workload_on_object_storage(s3tr, s3db):
    """A join + aggregate, a bag, an outer join and a top-K, three random batches (tests/oracle.py)."""
    tables = ["o", "c"]
    load = workload(s3tr, s3db, tables, {
        "agg_join": "SELECT c.region, SUM(o.amount) AS s, COUNT(*) AS n FROM {db}.o o JOIN {db}.c c "
                    "ON o.cid = c.id GROUP BY c.region",
        "bag": "SELECT o.id, o.amount, c.region FROM {db}.o o JOIN {db}.c c ON o.cid = c.id",
        "left": "SELECT o.id, c.region FROM {db}.o o LEFT JOIN {db}.c c ON o.cid = c.id",
        "top": "SELECT id, amount FROM {db}.o ORDER BY amount DESC NULLS LAST, id LIMIT 3",
    })
    drive(load, tables)


def test_a_cascade_refreshed_as_an_atomic_group_on_object_storage(s3tr, s3db):
    db = s3db
    s3tr.sql(f"CREATE TABLE {db}.src (id INT, grp INT, amount INT) USING delta")
    s3tr.sql(f"INSERT INTO {db}.src VALUES (1, 1, 10), (2, 2, 20), (3, NULL, 5), (3, NULL, 5)")
    queries = {f"{db}.big": f"SELECT id, grp, amount FROM {db}.src WHERE amount >= 5",
               f"{db}.per_grp": f"SELECT grp, COUNT(*) AS n, SUM(amount) AS s FROM {db}.big GROUP BY grp"}
    for name, query in queries.items():
        s3tr.create_stream_table(name, query, schedule=None)
    rng = random.Random(7)
    for _ in range(2):
        s3tr.sql(f"INSERT INTO {db}.src VALUES ({rng.randint(4, 9)}, {rng.randint(1, 3)}, {rng.randint(0, 30)}), "
                 f"({rng.randint(4, 9)}, NULL, NULL)")
        s3tr.sql(f"UPDATE {db}.src SET amount = {rng.randint(0, 30)} WHERE id = {rng.randint(1, 9)}")
        result = s3tr.refresh_group(list(queries))
        assert {r.status for r in result.results} == {"COMPLETED"}
        for name, query in queries.items():
            assert multiset(s3tr.read(name)) == multiset(s3tr.sql(query)), name


def test_repair_rebuilds_a_lost_catalog_from_object_storage_and_maintain_lists_the_bucket(s3tr, s3, s3db):
    db = s3db
    s3tr.sql(f"CREATE TABLE {db}.src (id INT, v INT) USING delta")
    s3tr.sql(f"INSERT INTO {db}.src VALUES (1, 10), (2, 20)")
    name = f"{db}.kept"
    s3tr.create_stream_table(name, f"SELECT id, v * 2 AS w FROM {db}.src", schedule=None)
    s3tr.sql(f"INSERT INTO {db}.src VALUES (3, 30)")
    s3tr.refresh_stream_table(name)
    frontier = s3tr.get(name).frontier
    for table in ("stream_tables", "dependencies"):  # the catalog's index is lost
        s3tr.catalog.location.child(table).remove_tree()
    s3tr.catalog._ensured = False
    s3tr.catalog._handles.clear()
    assert s3tr.catalog.get(name) is None
    done = s3tr.repair()
    assert any(a["stream_table"] == name and "rebuilt" in a["action"] for a in done), done
    assert s3tr.get(name).frontier == frontier
    assert [f for f in s3tr.check() if f.stream_table == name and f.severity == "ERROR"] == []
    s3tr.sql(f"INSERT INTO {db}.src VALUES (4, 40)")
    assert s3tr.refresh_stream_table(name).action == "DIFFERENTIAL"
    assert multiset(s3tr.read(name)) == multiset(s3tr.sql(f"SELECT id, v * 2 AS w FROM {db}.src"))
    maintained = {m.table: m for m in s3tr.maintain([name], retention_hours=0)}
    assert maintained[name].files_on_disk_before is not None  # listed in the bucket
    assert maintained[name].active_files_after == 1
    health = {r.stream_table: r for source in s3tr.health(record_alerts=False) for r in source.readers}
    assert health[name].status != "BROKEN", health[name]


# -- writers killed, and two writers at once ------------------------------------------------------


def test_a_kill_trial_on_object_storage_is_exact_on_retry(s3tr, s3, s3db, monkeypatch):
    """One of ``tests/kill_trials.py``'s trials on the S3 warehouse -- an atomic group refreshed
    in a child with a Spark of its own, killed at a random moment (``scripts/kill_trials.py
    --s3`` runs many): the killed writer's lease lapses and the retry takes it over."""
    from tests import kill_trials

    for key, value in _environment(s3).items():
        if key.startswith("TRICKLE_"):
            monkeypatch.setenv(key, value)
    scenario = kill_trials.setup(s3tr, s3.warehouse, "-", s3db, tables=("lines", "totals"))
    rng = random.Random(5)
    trials = [kill_trials.trial(s3tr, scenario, operation, rng.uniform(2.0, 8.0), rng, session="classic")
              for operation in ("group",)]
    assert [t.problems for t in trials] == [[]]


def _race_tables(db: str) -> dict[str, str]:
    return {
        f"{db}.totals": f"SELECT grp, COUNT(*) AS n, SUM(amount) AS s FROM {db}.src GROUP BY grp",
        f"{db}.big": f"SELECT id, grp, amount FROM {db}.src WHERE amount >= 10",
        f"{db}.named": f"SELECT s.id, s.amount, g.label FROM {db}.src s JOIN {db}.grps g ON s.grp = g.grp",
        f"{db}.labelled": f"SELECT g.label, COUNT(s.id) AS n FROM {db}.grps g LEFT JOIN {db}.src s "
                          f"ON s.grp = g.grp GROUP BY g.label",
        f"{db}.top": f"SELECT id, amount FROM {db}.src ORDER BY amount DESC NULLS LAST, id LIMIT 3",
        f"{db}.peak": f"SELECT grp, MAX(amount) AS m FROM {db}.src GROUP BY grp",
    }


class RaceWorkers:
    """Two processes, each with a Spark of its own (``tests/helpers/race_worker.py``), whose S3
    requests pass a proxy that holds each Delta log PUT up to ``commit_delay`` seconds and
    crosses two writers' PUTs of the same entry (``tests/helpers/slow_commits.py``): writers that
    do not take turns meet inside the window where both find a version free, and the store keeps
    the commit of the one that records its refresh first.  ``lease``: whether they take the
    writer lease (``lease_seconds`` = 0 otherwise).  Both races below use one pair of them."""

    def __init__(self, s3, *, lease: bool = True, commit_delay: float = 1.5):
        from tests.helpers.slow_commits import SlowCommitsProcess

        self.s3, self.lease = s3, lease
        self.proxy = SlowCommitsProcess(s3.port, commit_delay)
        self.processes: list[subprocess.Popen] = []
        self.logs = [tempfile.NamedTemporaryFile("w+", prefix="race-worker-", suffix=".log") for _ in range(2)]

    def __enter__(self) -> "RaceWorkers":
        self.proxy.__enter__()
        env = _environment(self.s3, lease_seconds=LEASE_SECONDS if self.lease else 0)
        env["TRICKLE_STORAGE_OPTIONS"] = json.dumps({**self.s3.storage_options, "aws_endpoint": self.proxy.endpoint})
        try:
            self.processes = [subprocess.Popen([sys.executable, "-m", "tests.helpers.race_worker", self.s3.warehouse,
                                                str(rows)], cwd=REPO, env=env, stdin=subprocess.PIPE,
                                               stdout=subprocess.PIPE, stderr=log, text=True)
                              for rows, log in zip((0, 100_000), self.logs)]  # the first commits through Spark only
            for worker in self.processes:
                assert worker.stdout.readline().strip() == "READY", f"a race worker did not start: {self.log_tail()}"
        except BaseException:
            self.__exit__()
            raise
        return self

    def start(self, *commands: str) -> None:
        """Give each worker its command (one each, in order): they run at the same time."""
        for worker, command in zip(self.processes, commands):
            worker.stdin.write(command + "\n")
            worker.stdin.flush()

    def answers(self) -> dict[str, str]:
        """The errors the workers met in their commands (none: ``{}``), once both are done."""
        errors: dict[str, str] = {}
        for worker in self.processes:
            line = worker.stdout.readline()
            if not line:
                raise AssertionError(f"a race worker ended (exit code {worker.wait(60)}): {self.log_tail()}")
            errors.update(json.loads(line))
        return errors

    def __exit__(self, *exc) -> None:
        for worker in self.processes:
            if worker.poll() is None:
                with contextlib.suppress(OSError):
                    worker.stdin.write("quit\n")
                    worker.stdin.close()
        for worker in self.processes:
            try:
                worker.wait(60)
            except subprocess.TimeoutExpired:
                worker.kill()
        self.proxy.__exit__()
        for log in self.logs:
            log.close()

    def log_tail(self, chars: int = 3000) -> str:
        """The end of each worker's standard error (its Spark's log and any traceback)."""
        tails = []
        for log in self.logs:
            log.flush()
            log.seek(0)
            tails.append(log.read()[-chars:])
        return "\n---\n".join(tails)

    def met(self) -> str:
        stats = self.proxy.stats()
        return (f"{stats['delayed']} commits held, {stats['collisions']} of them met another writer's commit "
                "of the same version")


def race(tr, workers: RaceWorkers, db: str, rounds: int, *, tables: int | None = None,
         seconds: float = 12.0) -> list[str]:
    """The two ``workers`` write the same stream tables for ``seconds`` per round while this
    process keeps changing the sources: one refreshes the tables again and again (committing
    through Spark only), the other ALTERs each one's schedule and then refreshes it (through
    delta-rs when the change is small).  After each round every table must equal its query at
    the frontier its catalog row records, and after the last, once the sources are quiet, its
    query.  What differs, per round and table.  ``tables``: how many of the stream tables (all
    six by default)."""
    tr.sql(f"CREATE TABLE {db}.src (id INT, grp INT, amount INT) USING delta")
    tr.sql(f"CREATE TABLE {db}.grps (grp INT, label STRING) USING delta")
    tr.sql(f"INSERT INTO {db}.src VALUES (1, 1, 10), (2, 2, 20), (3, NULL, 5), (3, NULL, 5)")
    tr.sql(f"INSERT INTO {db}.grps VALUES (1, 'one'), (2, 'two'), (3, NULL)")
    queries = dict(list(_race_tables(db).items())[:tables])
    for name, query in queries.items():
        tr.create_stream_table(name, query, schedule="5m")
    names = ",".join(queries)
    workers.start(f"sync {names}", f"sync {names}")  # each refreshes each table once
    problems = [f"first refreshes: {n}: {e}" for n, e in workers.answers().items()]
    rng = random.Random(11)
    for round_no in range(rounds):
        workers.start(f"refresh {seconds} {names}", f"churn {seconds} {names}")
        # the sources change while the writers run: inserts (duplicates, NULLs), updates, deletes
        deadline, step = time.monotonic() + seconds, 0
        while time.monotonic() < deadline:
            base = 1000 * (round_no + 1) + 10 * step
            tr.sql(f"INSERT INTO {db}.src VALUES ({base}, {rng.randint(1, 3)}, {rng.randint(0, 30)}), "
                   f"({base + 1}, NULL, 12), ({base + 1}, NULL, 12)")
            if step % 2:
                tr.sql(f"UPDATE {db}.src SET amount = {rng.randint(0, 30)} WHERE id = {base - 10}")
            else:
                tr.sql(f"DELETE FROM {db}.src WHERE id = {base - 9}")
            step += 1
        problems += [f"round {round_no}: {n}: {e}" for n, e in workers.answers().items()]
        for name, query in queries.items():
            st = tr.get(name)
            if multiset(tr.read(name)) != multiset(tr.sql(_pinned(query, st.frontier))):
                problems.append(f"round {round_no}: {name} differs from its query at its frontier {st.frontier}")
    print(f"race: {rounds} rounds, {workers.met()}", flush=True)
    for name, query in queries.items():  # and the next refresh, with the sources quiet, ends exact
        tr.refresh_stream_table(name)
        if multiset(tr.read(name)) != multiset(tr.sql(query)):
            problems.append(f"after the race: {name} differs from its query")
    return problems


def append_race(s3, workers: RaceWorkers, count: int) -> tuple[int, int]:
    """The two ``workers`` append ``count`` rows each to one Delta table, one commit a row:
    ``(rows expected, rows found)``.  Without the lease, open-source Delta's S3 log store lets
    the two write the same log version and one commit replaces the other; with it they take
    turns."""
    import deltalake
    import pyarrow as pa

    table = f"{s3.warehouse}/appended_{uuid.uuid4().hex[:6]}"
    deltalake.write_deltalake(table, pa.table({"w": pa.array([0], pa.int32()), "i": pa.array([0], pa.int32())}),
                              storage_options=s3.storage_options, mode="overwrite")
    workers.start(*(f"append {table} {tag} {count}" for tag in (1, 2)))
    errors = workers.answers()
    assert errors == {}, errors
    print(f"appends: {workers.met()}", flush=True)
    found = deltalake.DeltaTable(table, storage_options=s3.storage_options).to_pyarrow_table().num_rows
    return 1 + 2 * count, found


def _pinned(query: str, frontier: dict[str, int]) -> str:
    """``query`` reading each source at the version ``frontier`` gives it."""
    for source, version in frontier.items():
        for word in ("FROM", "JOIN"):
            query = query.replace(f"{word} {source} ", f"{word} {source} VERSION AS OF {version} ")
    return query


@pytest.fixture(scope="module")
def racers(s3):
    """The race workers, with the lease, for the module's two races (their Sparks start once)."""
    with RaceWorkers(s3, lease=True) as workers:
        yield workers


def test_two_writers_racing_on_object_storage_lose_nothing(s3tr, racers, s3db):
    """Two of the race's tables (an aggregate and a filter) for three rounds of five seconds here
    (``TRICKLE_S3_RACE_ROUNDS=10`` runs ten; ``scripts/race_s3.py`` all six tables, and
    ``scripts/race_s3.py --no-lease`` the same race with the lease off, which loses changes).
    Every log PUT passes the crossing proxy: without the lease, writers that meet there lose a
    refresh's changes or apply them twice."""
    problems = race(s3tr, racers, s3db, int(os.environ.get("TRICKLE_S3_RACE_ROUNDS", "3")), tables=2, seconds=5)
    assert problems == []


def test_two_writers_appending_take_turns_under_the_lease(s3, racers):
    """The plainest race: the two workers append one row per commit to one table.  Under the
    lease every row lands; ``scripts/race_s3.py --appends 15 --no-lease`` runs it without, and
    commits are replaced."""
    expected, found = append_race(s3, racers, 5)
    assert found == expected
