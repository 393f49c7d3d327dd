"""A few scattered rows of a large bag table deleted: delta-rs's copy-on-write against a deletion vector.

    python benchmarks/deletion_vectors.py [--rows 10000000] [--change 0.001] [--repeat 3] [--warehouse DIR]

A spike for issue 38's chain and diamond at 10M rows.  A DIFFERENTIAL hop of a chain of bag
tables commits ~12k resolved changes among 9M stored rows; half of them delete stored copies
scattered over every data file, so delta-rs (which writes no deletion vectors) rewrites every
file: ~1.7 s a hop, against ~2 s for the plain recompute of the hop.  This script measures, on
two copies of one such stream table's storage, side by side in one run:

* **copy-on-write**: the change applied as the refresh applies it today -- delta-rs's MERGE by
  the rows' identity (``refresh/local_merge._merge``, the same call);
* **deletion vectors**: the same change committed by this script: the deleted rows' positions
  found in their files, a deletion vector per touched file (unioned with the one it had) in one
  ``deletion_vector_<uuid>.bin``, the inserted rows and the change feed's rows written as two
  Parquet files, and one log commit put only if absent (``obstore``, as the writer lease does);

and a plain ``INSERT OVERWRITE`` of the hop's query, the baseline a user would pick.  Each round
checks that Spark reads the two copies as the same multiset with the expected row count, that
delta-rs reads the deletion-vector copy (DataFusion's ``QueryBuilder``) with that count, and that
its change feed (``load_cdf``) holds the round's deletes and inserts.

Not the product: the table's deletion vectors are tracked by replaying its JSON log (no
checkpoint support), the re-added files keep only ``numRecords`` in their statistics, and nothing
here is fenced or retried.  What building it needs is listed in ``benchmarks/README.md``.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import struct
import time
import uuid
import zlib

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from cascade import with_source

QUERY = "SELECT id, g, amount FROM bench.src WHERE amount >= 10"
ROW_ID, DUP = "__trickle_row_id", "__trickle_dup"

# --- deletion vectors (Delta protocol, "Deletion Vector Format") -------------------------------
DV_MAGIC = 1681511377
Z85 = "0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ.-:+=^!/*?&<>()[]{}@%$#"


def z85_encode(data: bytes) -> str:
    """Z85 of ``data`` (a multiple of 4 bytes), as Delta encodes a deletion vector file's UUID.

    >>> z85_decode(z85_encode(bytes(range(16)))) == bytes(range(16))
    True
    """
    out = []
    for i in range(0, len(data), 4):
        value, chars = int.from_bytes(data[i:i + 4], "big"), []
        for _ in range(5):
            value, digit = divmod(value, 85)
            chars.append(Z85[digit])
        out.append("".join(reversed(chars)))
    return "".join(out)


def z85_decode(text: str) -> bytes:
    out = bytearray()
    for i in range(0, len(text), 5):
        value = 0
        for char in text[i:i + 5]:
            value = value * 85 + Z85.index(char)
        out += value.to_bytes(4, "big")
    return bytes(out)


def roaring_portable(positions: np.ndarray) -> bytes:
    """The 32-bit roaring bitmap of ``positions`` (sorted, unique) in the portable format, with
    array and bitmap containers (no run containers: cookie 12346).

    >>> roaring_positions(roaring_portable(np.array([1, 5, 70000, *range(200000, 205000)]))).tolist()[:4]
    [1, 5, 70000, 200000]
    """
    positions = positions.astype(np.uint32)
    highs, starts = np.unique(positions >> 16, return_index=True)
    groups = np.split(positions & 0xFFFF, starts[1:])
    header = struct.pack("<II", 12346, len(groups))
    header += b"".join(struct.pack("<HH", high, len(group) - 1) for high, group in zip(highs, groups))
    bodies = []
    for group in groups:
        if len(group) <= 4096:
            bodies.append(group.astype("<u2").tobytes())
        else:
            bits = np.zeros(65536, dtype=bool)
            bits[group] = True
            bodies.append(np.packbits(bits, bitorder="little").tobytes())
    offset, offsets = len(header) + 4 * len(groups), []
    for body in bodies:
        offsets.append(offset)
        offset += len(body)
    return header + struct.pack(f"<{len(groups)}I", *offsets) + b"".join(bodies)


def roaring_positions(data: bytes) -> np.ndarray:
    """The positions of a portable 32-bit roaring bitmap (array, bitmap and run containers)."""
    cookie = struct.unpack_from("<I", data, 0)[0]
    if cookie & 0xFFFF == 12347:
        count, at = (cookie >> 16) + 1, 4
        runs = np.unpackbits(np.frombuffer(data, np.uint8, (count + 7) // 8, at), bitorder="little")
        at += (count + 7) // 8
    else:
        count, at, runs = struct.unpack_from("<I", data, 4)[0], 8, np.zeros(0, np.uint8)
    headers = np.frombuffer(data, "<u2", 2 * count, at).reshape(count, 2)
    at += 4 * count
    if cookie & 0xFFFF != 12347 or count >= 4:
        at += 4 * count  # the offset header; containers follow in order
    out = []
    for i, (high, cardinality) in enumerate(headers.astype(np.uint32)):
        if i < len(runs) and runs[i]:
            n = struct.unpack_from("<H", data, at)[0]
            pairs = np.frombuffer(data, "<u2", 2 * n, at + 2).reshape(n, 2).astype(np.uint32)
            low = np.concatenate([np.arange(s, s + length + 1) for s, length in pairs])
            at += 2 + 4 * n
        elif cardinality + 1 <= 4096:
            low = np.frombuffer(data, "<u2", cardinality + 1, at).astype(np.uint32)
            at += 2 * (cardinality + 1)
        else:
            bits = np.unpackbits(np.frombuffer(data, np.uint8, 8192, at), bitorder="little")
            low = np.flatnonzero(bits).astype(np.uint32)
            at += 8192
        out.append((high << 16) | low)
    return np.concatenate(out) if out else np.zeros(0, np.uint32)


def dv_payload(positions: np.ndarray) -> bytes:
    """A deletion vector: the magic number, then a 64-bit roaring bitmap array of one 32-bit
    bitmap (key 0: files of fewer than 2^32 rows)."""
    return struct.pack("<iqi", DV_MAGIC, 1, 0) + roaring_portable(positions)


def dv_read(table: str, descriptor: dict) -> np.ndarray:
    """The positions a deletion vector stored beside ``table`` (storage type ``u``) deletes."""
    assert descriptor["storageType"] == "u", descriptor
    where = descriptor["pathOrInlineDv"]
    name = f"deletion_vector_{uuid.UUID(bytes=z85_decode(where[-20:]))}.bin"
    with open(os.path.join(table, where[:-20], name), "rb") as file:
        file.seek(descriptor["offset"])
        size = struct.unpack(">i", file.read(4))[0]
        payload = file.read(size)
    magic, bitmaps = struct.unpack_from("<iq", payload, 0)
    assert magic == DV_MAGIC and bitmaps <= 1, (magic, bitmaps)
    return roaring_positions(payload[16:]) if bitmaps else np.zeros(0, np.uint32)


# --- the log, replayed ----------------------------------------------------------------------------
def live_files(table: str) -> tuple[int, dict]:
    """(version, {path: add action}) of ``table`` from its JSON commits (no checkpoint read)."""
    log_dir, files, version = os.path.join(table, "_delta_log"), {}, -1
    for name in sorted(n for n in os.listdir(log_dir) if n.endswith(".json")):
        version = int(name[:-5])
        with open(os.path.join(log_dir, name)) as commit:
            for line in commit:
                action = json.loads(line)
                if "add" in action:
                    files[action["add"]["path"]] = action["add"]
                elif "remove" in action:
                    files.pop(action["remove"]["path"], None)
    return version, files


def dv_commit(table: str, deletes: pa.Table, inserts: pa.Table, metadata: dict) -> dict:
    """Delete the rows of ``table`` whose identity ``deletes`` names (one each) by deletion
    vectors and append ``inserts``, in one commit; returns milliseconds per phase."""
    import obstore
    from obstore.store import LocalStore

    phases, started = {}, time.perf_counter()

    def phase(name: str) -> None:
        nonlocal started
        now = time.perf_counter()
        phases[name] = round((now - started) * 1000)
        started = now

    version, files = live_files(table)
    phase("log")
    wanted = {(r, d) for r, d in zip(deletes.column(ROW_ID).to_pylist(), deletes.column(DUP).to_pylist())}
    wanted_ids = pa.array([r for r, _ in wanted], pa.int64())
    found = {}
    for path, add in files.items():
        ids = pq.read_table(os.path.join(table, path), columns=[ROW_ID, DUP])
        candidates = pc.indices_nonzero(pc.is_in(ids.column(ROW_ID), value_set=wanted_ids)).to_numpy()
        old = dv_read(table, add["deletionVector"]) if add.get("deletionVector") else np.zeros(0, np.uint32)
        candidates = np.setdiff1d(candidates, old)
        pairs = zip(ids.column(ROW_ID).take(candidates).to_pylist(), ids.column(DUP).take(candidates).to_pylist())
        new = np.array([p for p, pair in zip(candidates, pairs) if pair in wanted], dtype=np.uint32)
        if len(new):
            found[path] = (add, np.union1d(old, new), len(new))
    if sum(n for _, _, n in found.values()) != len(wanted):
        raise RuntimeError("a row to delete was not found among the live rows")
    phase("find rows")
    dv_id = uuid.uuid4()
    blob, descriptors = bytearray(b"\x01"), {}
    for path, (_, positions, _) in found.items():
        payload = dv_payload(positions)
        descriptors[path] = {"storageType": "u", "pathOrInlineDv": z85_encode(dv_id.bytes), "offset": len(blob),
                             "sizeInBytes": len(payload), "cardinality": int(len(positions))}
        blob += struct.pack(">i", len(payload)) + payload + struct.pack(">I", zlib.crc32(payload))
    with open(os.path.join(table, f"deletion_vector_{dv_id}.bin"), "wb") as out:
        out.write(bytes(blob))
    phase("deletion vectors")
    data_name = f"part-00000-{uuid.uuid4()}-c000.snappy.parquet"
    pq.write_table(inserts, os.path.join(table, data_name))
    change = pa.concat_tables([deletes.select(inserts.column_names).append_column(
                                   "_change_type", pa.array(["delete"] * deletes.num_rows)),
                               inserts.append_column("_change_type", pa.array(["insert"] * inserts.num_rows))])
    os.makedirs(os.path.join(table, "_change_data"), exist_ok=True)
    change_name = f"_change_data/cdc-{uuid.uuid4()}-c000.snappy.parquet"
    pq.write_table(change, os.path.join(table, change_name))
    phase("data files")
    now = int(time.time() * 1000)
    actions = [{"commitInfo": {"timestamp": now, "operation": "DELETE AND INSERT", "readVersion": version,
                               "engineInfo": "benchmarks/deletion_vectors.py",
                               "userMetadata": json.dumps(metadata)}}]
    for path, (add, positions, _) in found.items():
        actions.append({"remove": {"path": path, "dataChange": True, "deletionTimestamp": now,
                                   "extendedFileMetadata": True, "partitionValues": {}, "size": add["size"],
                                   "deletionVector": add.get("deletionVector")}})
        records = json.loads(add["stats"])["numRecords"]
        actions.append({"add": {"path": path, "partitionValues": {}, "size": add["size"],
                                "modificationTime": add["modificationTime"], "dataChange": True,
                                "stats": json.dumps({"numRecords": records}), "deletionVector": descriptors[path]}})
    stats = {"numRecords": inserts.num_rows}
    actions.append({"add": {"path": data_name, "partitionValues": {}, "dataChange": True, "modificationTime": now,
                            "size": os.path.getsize(os.path.join(table, data_name)), "stats": json.dumps(stats)}})
    actions.append({"cdc": {"path": change_name, "partitionValues": {}, "dataChange": False,
                            "size": os.path.getsize(os.path.join(table, change_name))}})
    body = "".join(json.dumps(action) + "\n" for action in actions).encode()
    obstore.put(LocalStore(table), f"_delta_log/{version + 1:020d}.json", body, mode="create")
    phase("log commit")
    return phases


# --- the run ---------------------------------------------------------------------------------------
def resolved_changes(table_path: str, rows: int, fraction: float, round_no: int, rng) -> tuple[pa.Table, pa.Table]:
    """Two thirds of ``fraction`` of the stored rows to delete (random, so scattered over every
    file) and as many new rows to insert: what ``cascade.py``'s change of ``fraction`` of the
    source (a third updated, a third deleted, a third inserted) resolves to at the chain's
    first hop, ~6k deletes and ~6k inserts among 9M rows at its 0.1% of 10M."""
    from deltalake import DeltaTable

    stored = DeltaTable(table_path).to_pyarrow_dataset().to_table()
    count = max(1, round(stored.num_rows * fraction * 2 / 3))
    deletes = stored.take(pa.array(rng.choice(stored.num_rows, count, replace=False)))
    ids = np.arange(rows * (round_no + 50), rows * (round_no + 50) + count)
    inserts = pa.table({"id": pa.array(ids, pa.int64()), "g": pa.array(ids % 1000, pa.int32()),
                        "amount": pa.array(10 + ids % 87, pa.int32()),
                        ROW_ID: pa.array(rng.integers(-2**63, 2**63 - 1, count), pa.int64()),
                        DUP: pa.array(-1 - ids, pa.int64())}).select(stored.column_names).cast(stored.schema)
    return deletes, inserts


def copy_on_write(table_path: str, deletes: pa.Table, inserts: pa.Table, round_no: int) -> None:
    """The change applied as ``refresh/local_merge.py`` applies it today (delta-rs's MERGE)."""
    from deltalake import DeltaTable

    from airflow_trickle.refresh.local_merge import _merge
    from airflow_trickle.refresh.resolution import ACTION, MATCHED_DUP, MATCHED_ID

    def resolved(rows: pa.Table, action: str, matched: bool) -> pa.Table:
        rows = rows.append_column(ACTION, pa.array([action] * rows.num_rows))
        rows = rows.append_column(MATCHED_ID, rows.column(ROW_ID) if matched else pa.nulls(rows.num_rows, pa.int64()))
        return rows.append_column(MATCHED_DUP, rows.column(DUP) if matched else pa.nulls(rows.num_rows, pa.int64()))

    changes = pa.concat_tables([resolved(deletes, "D", True), resolved(inserts, "I", False)])
    quoted = {f'"{name}"': f's."{name}"' for name in inserts.column_names}
    identity = f't."{ROW_ID}" = s."{MATCHED_ID}" AND t."{DUP}" = s."{MATCHED_DUP}"'
    _merge(DeltaTable(table_path), changes, identity, quoted, {"round": round_no}, "deletion_vectors.py", round_no)


def check(tr, cow: str, dv: str, expected_rows: int, deletes: int, inserts: int) -> None:
    """Spark reads both copies as one multiset of ``expected_rows``; delta-rs reads the
    deletion-vector copy and its newest change feed."""
    from deltalake import DeltaTable, QueryBuilder

    counts = tr.sql(f"SELECT (SELECT COUNT(*) FROM delta.`{cow}`) AS cow, (SELECT COUNT(*) FROM delta.`{dv}`) AS dv, "
                    f"(SELECT COUNT(*) FROM (SELECT * FROM delta.`{cow}` EXCEPT ALL SELECT * FROM delta.`{dv}`)) AS only_cow, "
                    f"(SELECT COUNT(*) FROM (SELECT * FROM delta.`{dv}` EXCEPT ALL SELECT * FROM delta.`{cow}`)) AS only_dv"
                    ).collect()[0]
    assert (counts.cow, counts.dv, counts.only_cow, counts.only_dv) == (expected_rows, expected_rows, 0, 0), counts
    table = DeltaTable(dv)
    read = pa.table(QueryBuilder().register("t", table).execute("SELECT COUNT(*) AS n FROM t").read_all())
    assert read.column("n")[0].as_py() == expected_rows, read
    feed = pa.table(table.load_cdf(starting_version=table.version(), ending_version=table.version()).read_all())
    kinds = feed.group_by("_change_type").aggregate([("_change_type", "count")]).to_pylist()
    assert {k["_change_type"]: k["_change_type_count"] for k in kinds} == {"delete": deletes, "insert": inserts}, kinds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rows", type=int, default=10_000_000)
    parser.add_argument("--change", type=float, default=0.001)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--warehouse", default=None)
    parser.add_argument("--driver-memory", default="8g")
    args = parser.parse_args()

    tr = with_source(args.warehouse, args.rows, args.driver_memory, prefix="trickle-dv-")
    tr.create_stream_table("bench.c1", QUERY, schedule=None, refresh_mode="DIFFERENTIAL")
    tr.sql(f"CREATE TABLE bench.p_c1 USING delta AS {QUERY}")
    storage = tr.sql("DESCRIBE DETAIL bench.c1").collect()[0].location.removeprefix("file:")
    cow, dv = (os.path.join(os.path.dirname(storage), f"spike_{name}") for name in ("cow", "dv"))
    for copy in (cow, dv):
        shutil.copytree(storage, copy)
    tr.sql(f"ALTER TABLE delta.`{dv}` SET TBLPROPERTIES ('delta.feature.deletionVectors' = 'supported')")
    expected = tr.sql(f"SELECT COUNT(*) AS n FROM delta.`{cow}`").collect()[0].n
    print(f"{expected:,} stored rows in {len(live_files(cow)[1])} file(s); {args.change:.2%} changed a round")

    rng = np.random.default_rng(38)
    samples = {"copy-on-write": [], "deletion vectors": [], "plain": []}
    for round_no in range(args.repeat + 1):
        deletes, inserts = resolved_changes(cow, args.rows, args.change, round_no, rng)
        times, phases = {}, {}
        order = ["copy-on-write", "deletion vectors"] if round_no % 2 == 0 else ["deletion vectors", "copy-on-write"]
        for way in order:
            started = time.perf_counter()
            if way == "copy-on-write":
                copy_on_write(cow, deletes, inserts, round_no)
            else:
                phases = dv_commit(dv, deletes, inserts, {"round": round_no})
            times[way] = time.perf_counter() - started
        started = time.perf_counter()
        tr.sql(f"INSERT OVERWRITE bench.p_c1 {QUERY}")
        times["plain"] = time.perf_counter() - started
        expected += inserts.num_rows - deletes.num_rows
        check(tr, cow, dv, expected, deletes.num_rows, inserts.num_rows)
        print(f"round {round_no}: {deletes.num_rows:,} deleted + {inserts.num_rows:,} inserted; "
              + ", ".join(f"{way} {seconds:.2f} s" for way, seconds in times.items())
              + f"; deletion vectors' phases (ms) {phases}; both copies equal", flush=True)
        if round_no:
            for way, seconds in times.items():
                samples[way].append(seconds)
    medians = {way: statistics.median(values) for way, values in samples.items()}
    print(f"\nmedians of rounds 1-{args.repeat}: " + ", ".join(f"{way} {s:.2f} s" for way, s in medians.items()))
    print(f"copy-on-write / deletion vectors: {medians['copy-on-write'] / medians['deletion vectors']:.1f}x; "
          f"plain / deletion vectors: {medians['plain'] / medians['deletion vectors']:.1f}x")


if __name__ == "__main__":
    main()
