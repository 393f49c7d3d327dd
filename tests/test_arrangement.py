"""Arrangements (``storage/arrangement.py``) against the oracle: a probe at any version it can give
equals the table at that version filtered to the keys asked for, as a multiset -- through random
inserts, updates and deletes (committed by delta-rs, change feed on), duplicates and NULL keys,
reopened from its folder as another process would; what it cannot give is refused.  No JVM."""
from __future__ import annotations

import random
from collections import Counter

import pyarrow as pa
import pytest

from deltalake import DeltaTable, write_deltalake

from airflow_trickle.storage.arrangement import Arrangement, Stale, Unarrangeable

SCHEMA = pa.schema([("k", pa.int64()), ("v", pa.string()), ("n", pa.int64())])


def rows(rng: random.Random, count: int) -> pa.Table:
    keys = [None if rng.random() < 0.1 else rng.randrange(20) for _ in range(count)]
    values = [rng.choice(["a", "b", None]) for _ in range(count)]
    return pa.table({"k": keys, "v": values, "n": [rng.randrange(3) for _ in range(count)]}, schema=SCHEMA)


def bag(table: pa.Table, columns=("k", "v")) -> Counter:
    return Counter(zip(*(table[c].to_pylist() for c in columns)))


def expected(uri: str, version: int, keys) -> Counter:
    wanted = set(keys)
    everything = bag(DeltaTable(uri, version=version).to_pyarrow_table(columns=["k", "v"]))
    return Counter({row: n for row, n in everything.items() if row[0] is not None and row[0] in wanted})


def change(table: DeltaTable, uri: str, rng: random.Random) -> None:
    """One random commit: an append (with duplicates and NULL keys), a delete or an update."""
    what = rng.choice(["append", "delete", "update", "duplicate"])
    if what == "append":
        write_deltalake(uri, rows(rng, rng.randrange(1, 8)), mode="append")
    elif what == "duplicate":  # copies of rows already there
        write_deltalake(uri, DeltaTable(uri).to_pyarrow_table().slice(0, 3), mode="append")
    elif what == "delete":
        table.delete(f"k = {rng.randrange(20)} OR n = {rng.randrange(3)}")
    else:
        table.update(updates={"k": f"k + {rng.randrange(1, 4)}", "v": "'u'"}, predicate=f"n = {rng.randrange(3)}")


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_probes_equal_the_table_at_each_version_through_random_changes(tmp_path, seed):
    rng = random.Random(seed)
    uri = str(tmp_path / "t")
    write_deltalake(uri, rows(rng, 40), configuration={"delta.enableChangeDataFeed": "true"})
    arranged = Arrangement.build(tmp_path / "arr", uri, "k", ["k", "v"])
    start = arranged.version
    for _ in range(6):
        change(DeltaTable(uri), uri, rng)
    newest = DeltaTable(uri).version()
    for step in range(start + 1, newest + 1, 2):  # caught up a version or two at a time
        arranged.catch_up(step)
    arranged.catch_up(newest)
    assert arranged.latest == newest and arranged.run_rows() > 0
    reopened = Arrangement.open(tmp_path / "arr")  # another process: the files, mapped
    for version in sorted({start, *(new for _, new, _ in arranged.runs)}):
        for _ in range(4):
            keys = [rng.randrange(-2, 26) for _ in range(rng.randrange(0, 12))]
            want = expected(uri, version, keys)
            assert bag(arranged.probe(keys, version)) == want, (version, keys)
            assert bag(reopened.probe(keys, version)) == want, (version, keys)
            only_v = Counter()  # a reader of one column: the bag of its projection
            for (_, v), n in want.items():
                only_v[(v,)] += n
            assert bag(arranged.probe(keys, version, ["v"]), ("v",)) == only_v, (version, keys)
    assert bag(arranged.probe(list(range(-1, 30)), newest)) == expected(uri, newest, range(-1, 30))


def test_what_it_cannot_give_is_refused(tmp_path):
    uri = str(tmp_path / "t")
    write_deltalake(uri, rows(random.Random(4), 10))  # no change feed
    write_deltalake(uri, rows(random.Random(5), 5), mode="append")
    arranged = Arrangement.build(tmp_path / "arr", uri, "k", ["k", "v"], version=1)
    with pytest.raises(Stale, match="version 0 asked"):
        arranged.probe([1], 0)  # before its base
    write_deltalake(uri, rows(random.Random(6), 5), mode="append")
    with pytest.raises(Stale, match="version 2 asked"):
        arranged.probe([1], 2)  # not caught up
    with pytest.raises(Stale):
        Arrangement.open(tmp_path / "nowhere")
    with pytest.raises(Unarrangeable, match="integers and dates only"):
        Arrangement.build(tmp_path / "by-string", uri, "v", ["k", "v"])
    assert bag(arranged.probe([1, 2, 3], 1)) == expected(uri, 1, [1, 2, 3])


def test_readers_of_one_table_by_one_key_share_one_arrangement(tmp_path):
    """Two readers asking for other columns of one table by one key share one folder: widened
    once to hold both readers' columns, then caught up for each; each reader's probe, cut to
    its columns, equals the table; versions its change feed cannot give rebuild it (keeping both
    readers' columns) rather than leaving the readers to scans."""
    from airflow_trickle.storage.arrangements import Arrangements

    rng = random.Random(7)
    uri = str(tmp_path / "t")
    write_deltalake(uri, rows(rng, 40), configuration={"delta.enableChangeDataFeed": "true"})
    table_id = DeltaTable(uri).metadata().id
    kept = Arrangements(tmp_path / "arrangements", max_bytes=1 << 30)
    first = kept.ready(uri, "k", ["k", "v"], {0}, table_id=table_id)
    second = kept.ready(uri, "k", ["k", "n"], {0}, table_id=table_id)
    assert first.folder == second.folder and second.columns == ["k", "v", "n"]
    assert [e.split(" (")[1].split(")")[0] for e in kept.events] == ["none kept", "widened by n"]
    change(DeltaTable(uri), uri, rng)
    again = kept.ready(uri, "k", ["k", "v"], {1}, table_id=table_id)
    assert kept.events[-1] == f"{uri}: caught up 0->1" and again.columns == ["k", "v", "n"]
    assert len(kept.usage()) == 1
    shown = kept.kept()[0]  # what ``trickle health`` shows: rows held, and bytes per row
    base_rows, run_rows = again.base.num_rows, sum(rows.num_rows for _, _, rows in again.runs)
    assert base_rows > 0 and run_rows > 0  # the base at version 0, the run of the change 0->1
    assert (shown["versions"], shown["rows"], shown["run_rows"]) == ("0..1", base_rows, run_rows)
    assert shown["held_rows"] == base_rows + run_rows
    assert shown["bytes_per_row"] == round(shown["bytes"] / (base_rows + run_rows), 1) > 0
    keys = list(range(20))
    assert bag(again.probe(keys, 1, ["k", "v"])) == expected(uri, 1, keys)
    everything = DeltaTable(uri, version=1).to_pyarrow_table(columns=["k", "n"])
    projected = again.probe(keys, 1, ["n"])  # without the key: still exact, as a bag
    assert projected.column_names == ["n"] and bag(projected, ("n",)) == Counter(
        (n,) for k, n in zip(everything["k"].to_pylist(), everything["n"].to_pylist()) if k is not None)
    DeltaTable(uri).alter.set_table_properties({"delta.enableChangeDataFeed": "false"})
    write_deltalake(uri, rows(rng, 3), mode="append")  # versions the feed cannot give
    newest = DeltaTable(uri).version()
    rebuilt = kept.ready(uri, "k", ["k", "v"], {newest}, table_id=table_id)
    assert "built at" in kept.events[-1] and "change feed" in kept.events[-1], kept.events[-1]
    assert rebuilt.version == newest and rebuilt.columns == ["k", "v", "n"]
    assert bag(rebuilt.probe(keys, newest, ["k", "v"])) == expected(uri, newest, keys)


def test_catching_up_keeps_each_version_asked_so_a_reader_at_an_older_frontier_finds_it(tmp_path):
    """A refresh asking for versions (old, new) past the arrangement's newest catches up one
    run per version asked: a stream table whose frontier is the middle one then finds it held,
    warm, instead of rebuilding the arrangement (6M rows of TPC-H lineitem: 3 s at SF 1)."""
    from airflow_trickle.storage.arrangements import Arrangements

    rng = random.Random(11)
    uri = str(tmp_path / "t")
    write_deltalake(uri, rows(rng, 200), configuration={"delta.enableChangeDataFeed": "true"})
    table_id = DeltaTable(uri).metadata().id
    kept = Arrangements(tmp_path / "arrangements", max_bytes=1 << 30)
    kept.ready(uri, "k", ["k", "v"], {0}, table_id=table_id)
    write_deltalake(uri, rows(rng, 3), mode="append")
    DeltaTable(uri).delete("k = 1")
    write_deltalake(uri, rows(rng, 2), mode="append")
    caught = kept.ready(uri, "k", ["k", "v"], {1, 3}, table_id=table_id)
    assert [(old, new) for old, new, _ in caught.runs] == [(0, 1), (1, 3)]
    again = kept.ready(uri, "k", ["k", "v"], {1}, table_id=table_id)  # a reader at the middle version
    assert kept.events[-1] == f"{uri}: warm" and again.version == 0
    keys = list(range(20))
    for version in (1, 3):
        assert bag(again.probe(keys, version, ["k", "v"])) == expected(uri, version, keys)
