"""The algebraic applier: GROUP BY with COUNT, SUM, AVG over exact numbers, MIN, MAX; no HAVING.

The hidden state of each affected group (row count, non-NULL counts, sums, extremes) is read
from the storage table and advanced by the delta:

    count' = count + Σw        n_i' = n_i + Σ w·[x_i not null]        s_i' = s_i + Σ w·x_i
    min' = least(min, inserted min)   (max likewise), rescanned from the new input only when a
                                      deletion reaches the stored extreme

With COUNT/SUM/AVG only, the MERGE itself advances the state (``t.s + s.Δs``): the storage
table is read only by the MERGE's own join.  Cost follows the delta.
"""
from __future__ import annotations

from sqlglot import exp

from airflow_trickle.dvm.base import ALGEBRAIC, W, Versions, group_hash
from airflow_trickle.dvm.block import Block
from airflow_trickle.dvm.sqltext import column_list as _list
from airflow_trickle.model import COUNT, DUP, ROW_ID, StateRole, parse_state_column, state_column
from airflow_trickle.names import quote_name
from airflow_trickle.sql.parse import DIALECT


def _aggregate_state(block: Block) -> list[tuple[str, str, str]] | None:
    """State columns ``(name, aggregate SQL, role)`` for algebraic maintenance, or None
    (role ``count`` for the row count, else a :class:`StateRole`)."""
    if block.template.args.get("having") is not None:
        return None
    state = [(COUNT, "COUNT(*)", "count")]
    for i, agg in enumerate(block.aggregates):
        name = agg.sql_name().lower() if not isinstance(agg, exp.Anonymous) else agg.name.lower()
        if name not in ALGEBRAIC or agg.find(exp.Distinct) or isinstance(agg.parent, exp.Filter):
            return None
        arg = agg.this
        if name == "count" and (arg is None or isinstance(arg, exp.Star)):
            continue
        if arg is None or len(agg.expressions) > 0:
            return None
        if name in ("min", "max"):
            state.append((state_column(StateRole.M, i), f"{name.upper()}({arg.sql(DIALECT)})", StateRole.M))
            continue
        state.append((state_column(StateRole.N, i), f"COUNT({arg.sql(DIALECT)})", StateRole.N))
        if name in ("sum", "avg"):
            state.append((state_column(StateRole.S, i), f"SUM({arg.sql(DIALECT)})", StateRole.S))
    return state


def _delta_inputs(block: Block) -> tuple[list[str], dict[int, exp.Expression], list[exp.Expression]]:
    """The aggregate block's input delta projected to ``__trickle_g<j>`` (group expressions) and
    ``__trickle_x<i>`` (aggregate arguments): their names, the arguments, the projections."""
    group_names = [f"__trickle_g{j}" for j in range(len(block.group))]
    agg_args = {i: agg.this for i, agg in enumerate(block.aggregates)
                if agg.this is not None and not isinstance(agg.this, exp.Star)}
    inputs = [g.copy().as_(n) for g, n in zip(block.group, group_names)]
    inputs += [arg.copy().as_(f"__trickle_x{i}") for i, arg in agg_args.items()]
    return group_names, agg_args, inputs


def _linear_change(name: str) -> tuple[str, str]:
    """``(column, SQL)`` of a linear state column's per-group change over the input delta:
    Δcount = Σw, Δn_i = Σ w·[x_i not null], Δs_i = Σ w·x_i."""
    if name == COUNT:
        return "__dc", f"SUM({W})"
    role, i = parse_state_column(name)
    if role == StateRole.N:
        return f"__dn{i}", f"SUM({W} * CASE WHEN __trickle_x{i} IS NULL THEN 0 ELSE 1 END)"
    return f"__ds{i}", f"SUM({W} * __trickle_x{i})"


def _linear_merge(st, block: Block, versions: Versions, types: dict[str, str]) -> str:
    """COUNT / SUM / AVG only: the MERGE itself advances the stored state, ``t.s + s.Δs``.

    Every state column is linear in the change weights, so the per-group change is summed
    straight from the raw change rows (no consolidation) and the target is read only by the
    MERGE's own join: the source never scans the storage table.
    """
    state = st.storage.state
    group_names, _, inputs = _delta_inputs(block)
    sums = [_linear_change(name) for name, _ in state]
    change = {name: column for (name, _), (column, _) in zip(state, sums)}
    group_cols = ", ".join(group_names)
    unchanged = " AND ".join(f"COALESCE({total}, 0) = 0" for _, total in sums)
    per_group = (f"SELECT {group_cols + ', ' if group_cols else ''}"
                 f"{', '.join(f'{total} AS {name}' for name, total in sums)}, "
                 f"{group_hash(group_names)} AS `{ROW_ID}` "
                 f"FROM ({block.input_delta_sql(versions, inputs)}) AS __d"
                 + (f" GROUP BY {group_cols}" if group_cols else "") + f" HAVING NOT ({unchanged})")
    kinds = dict(state)

    def advanced(name: str) -> str:
        return f"CAST(COALESCE(t.`{name}`, 0) + COALESCE(s.{change[name]}, 0) AS {kinds[name]})"

    def started(name: str) -> str:
        return f"CAST(COALESCE(s.{change[name]}, 0) AS {kinds[name]})"

    def row(ref) -> list[tuple[str, str]]:
        values = _aggregate_values(block, kinds, ref)
        return (_visible_cells(st, block, group_names, values, types, qualifier="s")
                + [(name, ref(name)) for name, _ in state])

    return _keyed_merge(st.name, per_group, scalar=not block.group, gone=f"{advanced(COUNT)} = 0",
                        fresh="s.__dc > 0", updates=row(advanced),
                        inserts=row(started) + [(ROW_ID, f"s.`{ROW_ID}`"), (DUP, "CAST(1 AS INT)")])


def _visible_cells(st, block: Block, group_names: list[str], values: dict[int, str], types: dict[str, str],
                   qualifier: str | None = None) -> list[tuple[str, str]]:
    """``(column, SQL)`` of each visible column, computed from group and aggregate values."""
    cells = []
    for column, projection in zip(st.output_columns, block.template.expressions):
        expression = _over_state(projection.unalias(), block, group_names, values, qualifier=qualifier)
        kind = types.get(column)
        cells.append((column, f"CAST({expression} AS {kind})" if kind else expression))
    return cells


def _keyed_merge(target: str, source: str, *, scalar: bool, gone: str, fresh: str,
                 updates: list[tuple[str, str]], inserts: list[tuple[str, str]]) -> str:
    """The MERGE of a keyed (one row per group) table: a group whose row count reaches zero
    (``gone``) is deleted, a matched one updated, a new one inserted when ``fresh``.  A scalar
    aggregate's one row is never deleted and always inserted."""
    delete = "" if scalar else f"WHEN MATCHED AND {gone} THEN DELETE "
    insert_when = "" if scalar else f"AND {fresh} "
    return (f"MERGE INTO {quote_name(target)} AS t USING ({source}) AS s "
            f"ON t.`{ROW_ID}` = s.`{ROW_ID}` AND t.`{DUP}` = 1 "
            f"{delete}"
            f"WHEN MATCHED THEN UPDATE SET {', '.join(f't.`{c}` = {sql}' for c, sql in updates)} "
            f"WHEN NOT MATCHED {insert_when}THEN INSERT ({_list([c for c, _ in inserts])}) "
            f"VALUES ({', '.join(sql for _, sql in inserts)})")


def _algebraic_merge(st, block: Block, versions: Versions, types: dict[str, str]) -> str:
    state = st.storage.state
    extreme = {name: parse_state_column(name)[1] for name, _ in state
               if (parse_state_column(name) or (None,))[0] == StateRole.M}
    if not extreme:
        return _linear_merge(st, block, versions, types)
    state_types = dict(state)
    group_names, agg_args, inputs = _delta_inputs(block)
    input_cols = ", ".join(group_names + [f"__trickle_x{i}" for i in agg_args])
    # Consolidated, so a row added by one join term and removed by another leaves no trace.
    delta = (f"SELECT {input_cols}, SUM({W}) AS {W} FROM ({block.input_delta_sql(versions, inputs)}) AS __raw "
             f"GROUP BY {input_cols} HAVING SUM({W}) <> 0")
    # Per group: Δcount = Σw, Δn_i = Σ w·[x_i not null], Δs_i = Σ w·x_i,
    # MIN/MAX: the extreme inserted value and the extreme deleted value.
    sums = []
    extremes = {}
    for name, _ in state:
        if name not in extreme:
            column, total = _linear_change(name)
            sums.append(f"{total} AS {column}")
        else:
            i = extreme[name]
            fn = block.aggregates[i].sql_name().upper()
            extremes[i] = fn
            sums.append(f"{fn}(CASE WHEN {W} > 0 THEN __trickle_x{i} END) AS __di{i}")
            sums.append(f"{fn}(CASE WHEN {W} < 0 THEN __trickle_x{i} END) AS __dd{i}")
    group_cols = ", ".join(group_names)
    per_group = (f"SELECT {group_cols + ', ' if group_cols else ''}{', '.join(sums)} FROM ({delta}) AS __d"
                 + (f" GROUP BY {group_cols}" if group_cols else ""))
    rid = group_hash(group_names)
    # new state = stored state + Δ (a group not stored yet starts from zero); MIN/MAX:
    # least/greatest(stored, inserted), unless a deletion reached the stored extreme (or the
    # stored extreme is unknown): then that group's value is rescanned from the new input.
    rescans = {i: _needs_rescan(i, fn) for i, fn in extremes.items()}
    advanced = []
    for name, kind in state:
        if name in extreme:
            i = extreme[name]
            pick = "least" if extremes[i] == "MIN" else "greatest"
            advanced.append(f"CAST(CASE WHEN {rescans[i]} THEN r.__r{i} ELSE {pick}(t.`{name}`, d.__di{i}) END "
                            f"AS {kind}) AS `{name}`")
            continue
        change = _linear_change(name)[0]
        advanced.append(f"CAST(COALESCE(t.`{name}`, 0) + COALESCE(d.{change}, 0) AS {kind}) AS `{name}`")
    stored = f"SELECT * FROM {quote_name(st.name)} WHERE `{DUP}` = 1"
    joined = (f"({per_group}) AS d LEFT JOIN ({stored}) AS t "
              f"ON t.`{ROW_ID}` = {group_hash(['d.' + g for g in group_names])}")
    if extremes:
        keys = (f"SELECT {group_hash(['d.' + g for g in group_names])} AS __trickle_row_id FROM {joined} "
                f"WHERE {' OR '.join(rescans.values())}")
        rescan = block.template.copy()
        rescan.set("expressions", [exp.maybe_parse(block.group_hash_sql(), dialect=DIALECT).as_("__rid")] + [
            exp.maybe_parse(f"{fn}({agg_args[i].sql(DIALECT)})", dialect=DIALECT).as_(f"__r{i}")
            for i, fn in extremes.items()])
        rescan_sql = block.render(block.restricted(versions, keys, rescan, scalar_too=True),
                                  [n.state(versions, "new") for _, n in block.items]).sql(DIALECT)
        joined += f" LEFT JOIN ({rescan_sql}) AS r ON r.__rid = {group_hash(['d.' + g for g in group_names])}"
    merged = f"SELECT d.*, {rid} AS __rid, {', '.join(advanced)} FROM {joined}"
    values = _aggregate_values(block, state_types, lambda name: f"`{name}`")
    visible = [f"{sql} AS `{column}`" for column, sql in _visible_cells(st, block, group_names, values, types)]
    source = (f"SELECT {', '.join(visible)}, __rid AS `{ROW_ID}`, CAST(1 AS INT) AS `{DUP}`, "
              f"{', '.join(f'`{n}`' for n, _ in state)} FROM ({merged}) AS __m")
    cells = [(c, f"s.`{c}`") for c in st.output_columns + [ROW_ID, DUP] + [n for n, _ in state]]
    return _keyed_merge(st.name, source, scalar=not block.group, gone=f"s.`{COUNT}` = 0",
                        fresh=f"s.`{COUNT}` > 0", updates=cells, inserts=cells)


def _needs_rescan(i: int, fn: str) -> str:
    """SQL: a deletion in this group reached (or may have reached) its stored MIN/MAX."""
    reached = "<=" if fn == "MIN" else ">="
    stored = state_column(StateRole.M, i)
    return f"(d.__dd{i} IS NOT NULL AND (t.`{stored}` IS NULL OR d.__dd{i} {reached} t.`{stored}`))"


def _aggregate_values(block: Block, state_types: dict[str, str], ref) -> dict[int, str]:
    """Each aggregate's value as SQL over its state columns; ``ref(name)`` reads a state column."""
    values = {}
    for i, agg in enumerate(block.aggregates):
        name = agg.sql_name().lower()
        n, s = state_column(StateRole.N, i), state_column(StateRole.S, i)
        count = ref(n) if n in state_types else None
        if name == "count":
            values[i] = ref(COUNT) if agg.this is None or isinstance(agg.this, exp.Star) else count
        elif name == "sum":
            values[i] = f"CASE WHEN {count} = 0 THEN NULL ELSE {ref(s)} END"
        elif name in ("min", "max"):
            values[i] = ref(state_column(StateRole.M, i))
        else:  # avg: Spark's AVG divides the sum by the count (as double, or decimal for decimals)
            kind, total = state_types[s], ref(s)
            if kind.startswith("decimal"):
                ratio = f"{total} / CAST({count} AS DECIMAL(20,0))"
            else:
                ratio = f"CAST({total} AS DOUBLE) / CAST({count} AS DOUBLE)"
            values[i] = f"CASE WHEN {count} = 0 THEN NULL ELSE {ratio} END"
    return values


def _over_state(projection: exp.Expression, block: Block, group_names: list[str], values: dict[int, str],
                qualifier: str | None = None) -> str:
    """A SELECT expression rewritten over group values and aggregate values."""
    index = {agg: i for i, agg in enumerate(block.aggregates)}
    groups = [(g, name) for g, name in zip(block.group, group_names)]

    def swap(node):
        if isinstance(node, exp.AggFunc):
            for agg, i in index.items():
                if node == agg:
                    return exp.maybe_parse(f"({values[i]})", dialect=DIALECT)
        for g, name in groups:
            if node == g:
                return exp.column(name, table=qualifier)
        return node

    return projection.copy().transform(swap).sql(DIALECT)
