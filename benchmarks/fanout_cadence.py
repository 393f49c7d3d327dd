"""How often a stream table whose delta touches every row measures its fan-out again, and what
that costs against refreshing it FULL every time.

    python benchmarks/fanout_cadence.py [--rows 1000000] [--rounds 80] [--warehouse DIR]

The diamond of ``cascade.py`` (``b``: a filter of the source, ``c``: its aggregate by ``g``,
``d``: ``b`` joined back to ``c``, an atomic group): each round changes 0.1% of the source,
which reaches all 1,000 groups of ``c``, so ``d`` changes in every row.  The cost model sends
``d`` FULL once a refresh has measured its fan-out; every so many FULL refreshes a DIFFERENTIAL
measures it again.  Prints each round's action and time for ``d``, the rounds that measured,
and the measuring refreshes' extra time as a share of the FULL refreshes' -- beside the share
a re-measurement every 51 refreshes (the newest 50 commits a refresh reads, the cadence before
the fan-out was carried forward in FULL commits) would cost at the same times.
"""
from __future__ import annotations

import argparse
import statistics

from cascade import DIAMOND, change, with_source


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--rounds", type=int, default=80)
    parser.add_argument("--warehouse", default=None)
    parser.add_argument("--driver-memory", default="4g")
    args = parser.parse_args()

    tr = with_source(args.warehouse, args.rows, args.driver_memory, prefix="trickle-fanout-")
    for name, query in DIAMOND:
        options = {"diamond_consistency": "atomic"} if name == "d" else None
        tr.create_stream_table(f"bench.{name}", query.format(p=""), schedule=None, options=options)
    taken: list[tuple[str, float]] = []
    for round_no in range(args.rounds):
        change(tr, args.rows, 0.001, round_no)
        d = tr.refresh_group([f"bench.{name}" for name, _ in DIAMOND]).results[-1]
        taken.append((d.action.value, d.duration_ms / 1000))
        print(f"round {round_no:3}: d {d.action.value:<12} {d.duration_ms / 1000:6.1f} s", flush=True)
    measuring = [i for i, (action, _) in enumerate(taken) if action == "DIFFERENTIAL"]
    fulls = [s for action, s in taken if action == "FULL"]
    if not fulls or not measuring:
        print("no FULL or no DIFFERENTIAL refresh of d: nothing to compare")
        return
    full, diff = statistics.median(fulls), statistics.median(s for a, s in taken if a == "DIFFERENTIAL")
    later = measuring[1:]  # round 0 measures for the first time, whatever the cadence
    print(f"\n{args.rows:,} rows, {args.rounds} rounds: d measured its fan-out in rounds {measuring}; "
          f"FULL median {full:.1f} s, DIFFERENTIAL median {diff:.1f} s")
    from airflow_trickle.storage.deltalog import recorded_refreshes

    carried = recorded_refreshes(tr.catalog.at(tr.get("bench.d").location), limit=1)[0].get("fanout")
    print(f"the newest commit of d carries {carried}")
    if carried:  # the cadence the cost model keeps now, whether or not this run reached it
        cadence = carried["remeasure_after"] + 1
        print(f"measured again every {cadence} refreshes: +{(diff - full) / (cadence - 1) / full:.0%} over "
              f"refreshing FULL each time; every 51 (before): +{(diff - full) / 50 / full:.0%}")
    if later:
        print("cadence reached in this run: " + ", ".join(str(b - a) for a, b in zip(measuring, later)))


if __name__ == "__main__":
    main()
