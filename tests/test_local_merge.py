"""The delta-rs commit of small changes (``refresh/local_merge.py``), without a JVM: the MERGE
turned into the query that resolves it, the refusals, and which tables delta-rs may write.
The path itself runs under every DIFFERENTIAL test on Spark (``test_differential.py`` checks
its commits and a kill before them)."""
from __future__ import annotations

import pyarrow as pa
import pytest
from deltalake import write_deltalake

from airflow_trickle.model import WEIGHT
from airflow_trickle.refresh.writable import why_not_writable, writable_columns
from airflow_trickle.refresh.resolution import resolution, resolved_changes_sql

MERGE = ("MERGE INTO `s`.`st` AS t USING (SELECT id, dn, `__trickle_row_id` FROM d) AS s "
         "ON t.`__trickle_row_id` = s.`__trickle_row_id` AND t.`__trickle_dup` = 1 "
         "WHEN MATCHED AND t.n + s.dn = 0 THEN DELETE "
         "WHEN MATCHED THEN UPDATE SET t.n = t.n + s.dn "
         "WHEN NOT MATCHED AND s.dn > 0 THEN INSERT (id, n, `__trickle_row_id`, `__trickle_dup`) "
         "VALUES (s.id, s.dn, s.`__trickle_row_id`, 1)")
COLUMNS = [("id", "int"), ("n", "bigint"), ("__trickle_row_id", "bigint"), ("__trickle_dup", "int")]


def test_a_merge_becomes_the_query_of_its_resolved_rows():
    """Each column: the first matching clause's value (an update keeps unassigned columns, an
    insert gives NULL to unlisted ones), cast to the stored type; the action; the stored row's
    identity; the target read at the version delta-rs will commit on."""
    def case(matched_delete, matched_update, inserted):
        return (f"CASE WHEN t.__trickle_merge_present THEN CASE WHEN t.n + s.dn = 0 THEN {matched_delete} "
                f"WHEN TRUE THEN {matched_update} END ELSE CASE WHEN s.dn > 0 THEN {inserted} END END")

    assert resolved_changes_sql(MERGE, COLUMNS, version=3) == (
        f"SELECT * FROM (SELECT CAST({case('NULL', '`t`.`id`', 's.id')} AS INT) AS `id`, "
        f"CAST({case('NULL', 't.n + s.dn', 's.dn')} AS BIGINT) AS `n`, "
        f"CAST({case('NULL', '`t`.`__trickle_row_id`', 's.`__trickle_row_id`')} AS BIGINT) AS `__trickle_row_id`, "
        f"CAST({case('NULL', '`t`.`__trickle_dup`', '1')} AS INT) AS `__trickle_dup`, "
        f"{case(repr('D'), repr('U'), repr('I'))} AS __trickle_merge_action, "
        "`t`.`__trickle_row_id` AS __trickle_merge_id, `t`.`__trickle_dup` AS __trickle_merge_dup "
        "FROM (SELECT id, dn, `__trickle_row_id` FROM d) AS s "
        "LEFT JOIN (SELECT *, TRUE AS __trickle_merge_present FROM `s`.`st` VERSION AS OF 3) AS t "
        "ON t.`__trickle_row_id` = s.`__trickle_row_id` AND t.`__trickle_dup` = 1) AS __resolved "
        "WHERE NOT __trickle_merge_action IS NULL")


def test_a_merge_taken_apart_names_the_change_rows_the_stored_identity_is_matched_by():
    """The change rows' query, the column ``ON`` equates with the stored row identity (by which
    delta-rs reads the matched rows), and whether the change rows read the stored table (then
    Spark reads it anyway, and reads the matched rows too)."""
    parts = resolution(MERGE, COLUMNS)
    assert parts.source_sql == "SELECT id, dn, `__trickle_row_id` FROM d"
    assert (parts.source_alias, parts.target_alias, parts.key, parts.reads_target) == ("s", "t", "__trickle_row_id",
                                                                                        False)
    keyed = MERGE.replace("ON t.`__trickle_row_id` = s.`__trickle_row_id`", "ON s.__key = t.`__trickle_row_id`")
    assert resolution(keyed, COLUMNS).key == "__key"
    reading = MERGE.replace("FROM d)", "FROM d JOIN `s`.`st` AS old ON d.id = old.id)")
    assert resolution(reading, COLUMNS).reads_target
    unkeyed = MERGE.replace("t.`__trickle_row_id` = s.`__trickle_row_id` AND ", "")
    assert resolution(unkeyed, COLUMNS).key is None


@pytest.mark.parametrize("clause", ["WHEN MATCHED THEN UPDATE SET *", "WHEN NOT MATCHED THEN INSERT *",
                                    "WHEN NOT MATCHED BY SOURCE THEN DELETE"])
def test_clauses_it_does_not_resolve_leave_the_merge_to_spark(clause):
    merge = f"MERGE INTO st AS t USING d AS s ON t.`__trickle_row_id` = s.k {clause}"
    assert resolved_changes_sql(merge, COLUMNS, version=1) is None
    assert resolved_changes_sql("SELECT 1", COLUMNS, version=1) is None


def _table(path, columns: dict, **config):
    write_deltalake(str(path), pa.table(columns), configuration=config or None)
    from deltalake import DeltaTable

    return DeltaTable(str(path))


def test_which_tables_delta_rs_writes(tmp_path):
    identity = {"__trickle_row_id": pa.array([1], pa.int64()), "__trickle_dup": pa.array([1], pa.int32())}
    plain = _table(tmp_path / "plain", {"k": pa.array(["a"]), "v": pa.array([1.5]), **identity},
                   **{"delta.enableChangeDataFeed": "true"})
    assert writable_columns(plain) == [("k", "string"), ("v", "double"), ("__trickle_row_id", "bigint"),
                                       ("__trickle_dup", "int")]
    assert why_not_writable(plain) is None
    nested = _table(tmp_path / "nested", {"k": pa.array([[1, 2]]), **identity})
    assert writable_columns(nested) is None  # an array column: left to Spark
    assert why_not_writable(nested) == "column k is not of a primitive type"
    unkeyed = _table(tmp_path / "unkeyed", {"k": pa.array([1])})
    assert writable_columns(unkeyed) is None and why_not_writable(unkeyed) == "no row identity columns"


def _bag_pairing_by_hand(delta: pa.Table, stored: pa.Table) -> tuple[list, list]:
    """``dvm/bag.bag_merge_sql``'s pairing, written out per content: (copies inserted as (delta
    row, number), copies deleted as (row id, number))."""
    copies: dict[int, list[int]] = {}
    for rid, dup in zip(stored["__trickle_row_id"].to_pylist(), stored["__trickle_dup"].to_pylist()):
        copies.setdefault(rid, []).append(dup)
    inserted, deleted = [], []
    for i, (rid, weight) in enumerate(zip(delta["__trickle_row_id"].to_pylist(), delta[WEIGHT].to_pylist())):
        have = copies.get(rid, [])
        if weight > 0:
            inserted += [(i, max(have, default=0) + n) for n in range(1, weight + 1)]
        else:
            deleted += [(rid, dup) for dup in sorted(have, reverse=True)[:-weight]]
    return sorted(inserted), sorted(deleted)


@pytest.mark.parametrize("seed", range(40))
def test_a_bag_delta_is_paired_with_its_stored_copies_as_the_bag_merge_pairs_them(seed):
    """``refresh/local_bag.resolved_bag_changes`` (vectorized) against the pairing written out
    per content: random stored copies (numbers negative and positive, several per content),
    contents gaining copies, losing some, all or more than are stored, and contents not stored."""
    import random

    from airflow_trickle.refresh.local_bag import resolved_bag_changes
    from airflow_trickle.refresh.resolution import ACTION, MATCHED_DUP, MATCHED_ID

    rng = random.Random(seed)
    stored_pairs = {(rid, dup) for rid in rng.sample(range(-20, 20), rng.randint(0, 12))
                    for dup in rng.sample(range(-50, 50), rng.randint(1, 5))}
    stored = pa.table({"__trickle_row_id": [r for r, _ in stored_pairs], "__trickle_dup": [d for _, d in stored_pairs]},
                      schema=pa.schema([("__trickle_row_id", pa.int64()), ("__trickle_dup", pa.int64())]))
    rids = rng.sample(range(-25, 25), rng.randint(0, 15))
    delta = pa.table({"v": [rid * 10 for rid in rids], WEIGHT: [rng.choice([-6, -3, -2, -1, 1, 2, 4]) for _ in rids],
                      "__trickle_row_id": rids},
                     schema=pa.schema([("v", pa.int32()), (WEIGHT, pa.int64()), ("__trickle_row_id", pa.int64())]))
    schema = pa.schema([("v", pa.int64()), ("__trickle_row_id", pa.int64()), ("__trickle_dup", pa.int32())])
    rows = resolved_bag_changes(delta, stored, schema)
    assert rows.schema.field("__trickle_dup").type == pa.int32() and rows.schema.field("v").type == pa.int64()
    inserted = sorted((rids.index(r["__trickle_row_id"]), r["__trickle_dup"]) for r in rows.to_pylist() if r[ACTION] == "I")
    deleted = sorted((r[MATCHED_ID], r[MATCHED_DUP]) for r in rows.to_pylist() if r[ACTION] == "D")
    assert (inserted, deleted) == _bag_pairing_by_hand(delta, stored)
    assert all(r["v"] == r["__trickle_row_id"] * 10 for r in rows.to_pylist() if r[ACTION] == "I")
