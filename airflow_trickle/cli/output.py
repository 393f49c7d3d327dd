"""What the ``trickle`` command prints: tables for people, JSON for machines."""
from __future__ import annotations

import json
from dataclasses import asdict, is_dataclass
from datetime import datetime


def _rows_text(kept: dict) -> str:
    """``6,001,215 rows at 31.2 bytes each, `` for an arrangement that records its rows."""
    if kept.get("held_rows") is None:
        return ""
    return f"{kept['held_rows']:,} rows at {kept['bytes_per_row']:g} bytes each, "


def _arrangements_line(tr) -> str:
    """``health``'s last line: the join arrangements kept here, and their bound."""
    from airflow_trickle.refresh.lookup import arrangements_of

    kept = arrangements_of(tr.config)
    if kept is None:
        return "join arrangements: off (arrangement_max_bytes 0)"
    rows = kept.kept()
    used = sum(r["bytes"] for r in rows)
    return (f"join arrangements: {len(rows)} kept in {kept.root}, {used / 2**20:.1f} MiB of "
            f"{kept.max_bytes / 2**20:.0f} MiB" + "".join(f"\n  {r['table']} by {r['key']} ({r['columns']}): "
                                                         f"versions {r['versions']}, {_rows_text(r)}{r['bytes'] / 2**20:.1f} MiB, "
                                                         f"used {r['last_used']}" for r in rows))


def _history_row(record, *, text: bool) -> dict:
    """A history record; for people, with the phases on one line, the source rows the window
    changed, and the cost model's estimate of touched rows next to the rows the refresh did touch."""
    from airflow_trickle.refresh.phases import format_phases
    from airflow_trickle.ops.overview import plan_summary

    row = asdict(record)
    if text:
        phases = dict(record.phases or {})
        actual = phases.pop("rows_touched", None)
        changed = phases.pop("changed_rows", None)
        phases.pop("planner", None)
        crossed = phases.pop("beyond_boundary", None)
        if changed is not None:
            row["changed source rows"] = changed
        if record.rows_estimated is not None or actual is not None:
            row["touched est/actual"] = f"{_cell(record.rows_estimated) or '?'}/{_cell(actual) or '?'}"
        row["phases"] = format_phases(phases) + (" · a row left the top-K: recomputed from the query" if crossed else "")
        row["plan"] = plan_summary(record.plan) if record.plan else None
    return row


def _emit(args, rows: list[dict], columns: list[str] | None = None) -> None:
    if args.json:
        print(json.dumps(rows, indent=2, default=_jsonable))
        return
    print(format_table(rows, columns))


def _jsonable(value):
    if isinstance(value, datetime):
        return value.isoformat()
    if is_dataclass(value):
        return asdict(value)
    return str(value)


def format_table(rows: list[dict], columns: list[str] | None = None) -> str:
    """A plain text table, one row per dict, for people reading a terminal."""
    if not rows:
        return "(no rows)"
    columns = columns or list(rows[0].keys())
    cells = [[_cell(row.get(col)) for col in columns] for row in rows]
    widths = [max(len(col), *(len(r[i]) for r in cells)) for i, col in enumerate(columns)]
    line = "  ".join(col.ljust(w) for col, w in zip(columns, widths))
    rule = "  ".join("-" * w for w in widths)
    body = ["  ".join(c.ljust(w) for c, w in zip(r, widths)) for r in cells]
    return "\n".join([line, rule, *body])


def _cell(value) -> str:
    if value is None:
        return ""
    if isinstance(value, datetime):
        return value.strftime("%Y-%m-%d %H:%M:%S")
    if isinstance(value, (dict, list)):
        return json.dumps(value, default=str)
    text = str(value)
    return text if len(text) <= 100 else text[:97] + "..."
