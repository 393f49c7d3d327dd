"""Kill trials: a refresh killed (SIGKILL) at a random moment, retried, checked against the oracle.

A scenario is a warehouse with three sources and six stream tables: a join (bag), an aggregate
over it (a stream table over a stream table), a top-K, a FULL-mode aggregate, and a monotone
cycle -- ``hop = edges ∪ (reach ⋈ edges)``, ``reach = hop``, the paths of a graph without
cycles, refreshed to its fixpoint.  Each trial

1. changes the sources at random (inserts, deletes, updates; NULLs and duplicate rows);
2. starts one operation in a child process -- refresh everything (AUTO), everything FULL, a
   REINITIALIZE, an atomic group, an ALTER of a defining query, or the cycle to its fixpoint
   -- and kills the child's whole process group at a random moment.  The child is a client
   of the warehouse's Spark service, or (``session="classic"``) runs its own embedded Spark,
   which dies with it;
3. retries in this process: refreshes every stream table in dependency order;
4. checks every stream table against its defining query on the sources now (multiset
   equality): no change lost, none applied twice; the cycle's ``reach`` also against the
   paths of ``edges`` counted here, in Python.

Over the Spark service a killed client's last Spark statement may still finish on the server
after the kill (a data commit landing while the retry runs): the transaction id of each refresh
commit and the frontier recorded in it are what keep that exact.  A classic child's statement
dies with it, possibly in the middle of writing a commit's files.

The suite runs a few trials (``tests/test_service.py``); ``scripts/kill_trials.py`` runs many
and prints ``N/N exact``.  ``python -m tests.kill_trials child ...`` is the child.
"""
from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
OPERATIONS = ("refresh", "full", "reinitialize", "group", "alter", "cycle")
#: How the child reaches Spark: through the warehouse's service, or a Spark of its own.
SESSIONS = ("connect", "classic")
#: Two filters for the ALTER trials: the same output columns, different rows.
_LINE_FILTERS = ("o.amount IS NULL OR o.amount > 2", "o.amount IS NOT NULL AND o.amount < 7")


@dataclass
class Scenario:
    warehouse: str
    remote: str
    db: str
    #: Stream tables in dependency order, with their defining queries.
    queries: dict[str, str] = field(default_factory=dict)

    @property
    def lines(self) -> str:
        return f"{self.db}.lines"

    @property
    def has_cycle(self) -> bool:
        return f"{self.db}.reach" in self.queries


def lines_query(db: str, where: str) -> str:
    return f"SELECT o.id, o.cid, o.amount, c.region FROM {db}.o o JOIN {db}.c c ON o.cid = c.id WHERE {where}"


ALL_TABLES = ("lines", "totals", "top", "peaks", "hop", "reach")
#: Nodes of the cycle's graph; an edge always goes from a smaller to a larger node.
_NODES = 6


def setup(tr, warehouse: str, remote: str, db: str, tables: tuple[str, ...] = ALL_TABLES) -> Scenario:
    """Sources and stream tables of a scenario (``tr`` works through the service at ``remote``);
    ``tables``: which of them (``lines`` and ``totals`` are what the operations but ``cycle``
    need; ``hop`` and ``reach`` come together)."""
    tr.sql(f"CREATE DATABASE IF NOT EXISTS {db}")
    tr.sql(f"CREATE TABLE {db}.o (id INT, cid INT, amount INT) USING delta")
    tr.sql(f"CREATE TABLE {db}.c (id INT, region STRING) USING delta")
    tr.sql(f"INSERT INTO {db}.o VALUES (1, 1, 10), (2, 1, 3), (3, 2, NULL), (4, 2, 5), (4, 2, 5), (5, 3, 8)")
    tr.sql(f"INSERT INTO {db}.c VALUES (1, 'n'), (2, 's'), (3, NULL), (1, 'n')")
    scenario = Scenario(warehouse=warehouse, remote=remote, db=db)
    definitions = [
        ("lines", lines_query(db, _LINE_FILTERS[0]), "DIFFERENTIAL"),
        ("totals", f"SELECT region, COUNT(*) AS n, SUM(amount) AS s FROM {db}.lines GROUP BY region", "DIFFERENTIAL"),
        ("top", f"SELECT id, cid, amount FROM {db}.o ORDER BY amount DESC, id, cid LIMIT 3", "DIFFERENTIAL"),
        ("peaks", f"SELECT cid, MAX(amount) AS peak FROM {db}.o GROUP BY cid", "FULL"),
    ]
    for name, query, mode in definitions:
        if name not in tables:
            continue
        tr.create_stream_table(f"{db}.{name}", query, schedule=None, refresh_mode=mode)
        scenario.queries[f"{db}.{name}"] = query
    if "reach" in tables:
        _setup_cycle(tr, scenario)
    return scenario


def _setup_cycle(tr, scenario: Scenario) -> None:
    db = scenario.db
    tr.sql(f"CREATE TABLE {db}.edges (src INT, dst INT) USING delta")
    tr.sql(f"INSERT INTO {db}.edges VALUES (1, 2), (2, 3), (3, 4), (2, 4), (2, 4)")
    tr.create_stream_table(f"{db}.hop", f"SELECT src, dst FROM {db}.edges", schedule=None)
    tr.create_stream_table(f"{db}.reach", f"SELECT src, dst FROM {db}.hop", schedule=None)
    closing = (f"SELECT src, dst FROM {db}.edges UNION ALL "
               f"SELECT r.src, e.dst FROM {db}.reach r JOIN {db}.edges e ON r.dst = e.src")
    allowed = tr.config.allow_circular
    tr.config.allow_circular = True
    try:
        tr.alter_stream_table(f"{db}.hop", query=closing)  # closes the cycle hop -> reach -> hop
    finally:
        tr.config.allow_circular = allowed
    scenario.queries[f"{db}.hop"] = closing
    scenario.queries[f"{db}.reach"] = f"SELECT src, dst FROM {db}.hop"


def change_sources(tr, scenario: Scenario, rng: random.Random) -> None:
    """A random batch: inserts (NULLs, duplicates), deletes and updates on every source."""
    db = scenario.db
    def value(low, high):
        return "NULL" if rng.random() < 0.15 else str(rng.randint(low, high))

    rows = [f"({rng.randint(1, 12)}, {value(1, 4)}, {value(0, 12)})" for _ in range(rng.randint(1, 4))]
    tr.sql(f"INSERT INTO {db}.o VALUES {', '.join(rows + rows[:1])}")  # one duplicate row
    if rng.random() < 0.7:
        tr.sql(f"DELETE FROM {db}.o WHERE id = {rng.randint(1, 12)}")
    if rng.random() < 0.7:
        tr.sql(f"UPDATE {db}.o SET amount = {value(0, 12)}, cid = {value(1, 4)} WHERE id = {rng.randint(1, 12)}")
    if rng.random() < 0.3:
        region = rng.choice(["'n'", "'s'", "'e'", "NULL"])
        tr.sql(f"UPDATE {db}.c SET region = {region} WHERE id = {rng.randint(1, 4)}")
    if scenario.has_cycle:
        edges = [tuple(sorted(rng.sample(range(1, _NODES + 1), 2))) for _ in range(rng.randint(1, 2))]
        tr.sql(f"INSERT INTO {db}.edges VALUES {', '.join(f'({a}, {b})' for a, b in edges)}")
        if rng.random() < 0.6:  # keeps the graph small: a few paths per pair of nodes
            tr.sql(f"DELETE FROM {db}.edges WHERE src = {rng.randint(1, _NODES - 1)}")


def run_operation(tr, scenario: Scenario, operation: str) -> None:
    """What the child does (also run unkilled to measure how long it takes)."""
    names = list(scenario.queries)
    if operation == "refresh":
        for name in names:
            tr.refresh_stream_table(name)
    elif operation == "full":
        for name in names:
            tr.refresh_stream_table(name, mode="FULL")
    elif operation == "reinitialize":
        tr.refresh_stream_table(scenario.lines, mode="REINITIALIZE")
        tr.refresh_stream_table(f"{scenario.db}.totals")
    elif operation == "group":
        tr.refresh_group([scenario.lines, f"{scenario.db}.totals"])
    elif operation == "cycle":
        tr.refresh_stream_table(f"{scenario.db}.reach")  # the whole cycle, to its fixpoint
    elif operation == "alter":
        current = tr.get(scenario.lines).original_query
        other = _LINE_FILTERS[1] if current.endswith(_LINE_FILTERS[0]) else _LINE_FILTERS[0]
        tr.alter_stream_table(scenario.lines, query=lines_query(scenario.db, other))
        tr.refresh_stream_table(f"{scenario.db}.totals")
    else:
        raise ValueError(f"unknown operation {operation!r}; one of {OPERATIONS}")


def check(tr, scenario: Scenario) -> list[str]:
    """Retry (refresh everything in dependency order), then compare each table with its query."""
    from tests.oracle import multiset

    problems = []
    for name in scenario.queries:
        result = tr.refresh_stream_table(name)
        if result.status != "COMPLETED":
            problems.append(f"{name}: the retry did not complete: {result.status} {result.reason}")
    for name in scenario.queries:
        query = tr.get(name).original_query  # after an ALTER, the query the catalog holds
        stored, wanted = multiset(tr.read(name)), multiset(tr.sql(query))
        if stored != wanted:
            problems.append(f"{name} differs from its query\n stored: {stored}\n wanted: {wanted}")
    if scenario.has_cycle:
        edges = [(r[0], r[1]) for r in tr.sql(f"SELECT src, dst FROM {scenario.db}.edges").collect()]
        stored, wanted = multiset(tr.read(f"{scenario.db}.reach")), paths(edges)
        if stored != wanted:
            problems.append(f"{scenario.db}.reach is not the paths of its edges\n stored: {stored}\n wanted: {wanted}")
    return problems


def paths(edges: list[tuple[int, int]]) -> list[tuple]:
    """Every path of a graph without cycles as ``(first node, last node)``, repeated by its
    multiplicity (a duplicate edge doubles the paths through it), in ``multiset``'s order: the
    cycle's fixpoint."""
    from collections import Counter

    out = Counter()
    for src, dst in edges:
        out[(src, dst)] += 1
    frontier = Counter(out)
    while frontier:
        step = Counter()
        for (src, mid), n in frontier.items():
            for a, b in edges:
                if a == mid:
                    step[(src, b)] += n
        out.update(step)
        frontier = step
    return sorted(out.elements(), key=repr)


@dataclass
class Trial:
    operation: str
    session: str
    kill_after_s: float
    killed: bool  # False: the child had finished before the kill
    problems: list[str]

    @property
    def exact(self) -> bool:
        return not self.problems


#: What makes pyspark in a child start Spark Connect rather than the classic Spark it is asked for.
_CONNECT_MARKS = ("SPARK_CONNECT_MODE_ENABLED", "SPARK_REMOTE")


def trial(tr, scenario: Scenario, operation: str, kill_after_s: float, rng: random.Random, *,
          session: str = "connect") -> Trial:
    """Change the sources, start ``operation`` in a child (its Spark: ``session``), kill it
    ``kill_after_s`` seconds after it is ready, retry and check."""
    if session not in SESSIONS:
        raise ValueError(f"unknown session {session!r}; one of {SESSIONS}")
    change_sources(tr, scenario, rng)
    remote = scenario.remote if session == "connect" else "-"
    errors = tempfile.TemporaryFile(mode="w+")  # why a child that did not start did not
    child = subprocess.Popen(
        [sys.executable, "-m", "tests.kill_trials", "child", scenario.warehouse, remote, scenario.db,
         operation, *scenario.queries],
        cwd=REPO, env={**{k: v for k, v in os.environ.items() if k not in _CONNECT_MARKS}, "PYTHONPATH": REPO},
        stdout=subprocess.PIPE, stderr=errors,
        text=True, start_new_session=True)
    try:
        line = child.stdout.readline()
        if line.strip() != "READY":
            child.wait(timeout=60)
            errors.seek(0)
            raise RuntimeError(f"the child did not start ({child.returncode}): {line!r}; "
                               f"its stderr ends: {errors.read()[-3000:]}")
        time.sleep(kill_after_s)
        killed = child.poll() is None
        if killed:
            os.killpg(child.pid, signal.SIGKILL)
    finally:
        child.wait(timeout=60)
        child.stdout.close()
        errors.close()
    return Trial(operation, session, kill_after_s, killed, check(tr, scenario))


def measure(tr, scenario: Scenario, operation: str, rng: random.Random) -> float:
    """Seconds ``operation`` takes unkilled (after a change), checked like a trial."""
    change_sources(tr, scenario, rng)
    started = time.monotonic()
    run_operation(tr, scenario, operation)
    took = time.monotonic() - started
    problems = check(tr, scenario)
    if problems:
        raise AssertionError(f"{operation} is not exact even unkilled: {problems}")
    return took


def _child(argv: list[str]) -> int:
    warehouse, remote, db, operation, *names = argv
    from airflow_trickle import Trickle
    from tests.conftest import CHILD_SPARK

    # "-": a classic Spark of the child's own (started here, before READY, so the kill lands
    # in the operation and not in the JVM's start)
    tr = Trickle(warehouse, remote=None if remote == "-" else remote, shuffle_partitions=2,
                 differential_max_time_ratio=1e9,  # keep refreshing DIFFERENTIAL: the kills are for it
                 spark_conf=CHILD_SPARK)
    tr.sync()
    scenario = Scenario(warehouse=warehouse, remote=remote, db=db, queries={n: "" for n in names})
    print("READY", flush=True)
    run_operation(tr, scenario, operation)
    print("DONE", flush=True)
    return 0


if __name__ == "__main__":
    if sys.argv[1:2] != ["child"]:
        sys.exit("usage: python -m tests.kill_trials child WAREHOUSE REMOTE|- DB OPERATION NAME...")
    sys.exit(_child(sys.argv[2:]))
