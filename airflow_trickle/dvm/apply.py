"""Apply a delta to a storage table with one MERGE, and choose how a stream table is stored.

Three ways to apply, chosen by the top operator of the plan:

* **bag** (no aggregation at the top): the delta is consolidated per row content; a row whose
  count goes from n to n+k gets copies ``n+1..n+k`` inserted, from n to n−k loses copies
  ``n−k+1..n``.  Row identity is the content hash plus the copy number.
* **keyed / algebraic** (GROUP BY with COUNT, SUM, AVG over exact numbers, MIN, MAX; no
  HAVING): the hidden state of each affected group (row count, sums, non-NULL counts, extremes)
  is read from the storage table and advanced by the delta: new = old + Σ Δ, MIN/MAX =
  least/greatest(old, inserted), a group rescanned only when a deletion reaches its extreme.
  Cost follows the delta.
* **keyed / recompute** (any other aggregate, HAVING, floating-point sums): the affected groups
  K are recomputed from the sources at the new version and replace their stored rows.
"""
from __future__ import annotations

from sqlglot import exp

from airflow_trickle.dvm.plan import ALGEBRAIC, W, Block, Unsupported, Versions, group_hash, plan
from airflow_trickle.names import quote_name
from airflow_trickle.sql.parse import DIALECT
from airflow_trickle.sql.rewrite import row_hash_sql
from airflow_trickle.storage import DUP, ROW_ID, dup_type

COUNT = "__trickle_count"
_EXACT = ("tinyint", "smallint", "int", "bigint", "decimal")


# -- layout ------------------------------------------------------------------------------------

def _aggregate_state(block: Block) -> list[tuple[str, str, str]] | None:
    """State columns ``(name, aggregate SQL, role)`` for algebraic maintenance, or None."""
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
            state.append((f"__trickle_m{i}", f"{name.upper()}({arg.sql(DIALECT)})", name))
            continue
        state.append((f"__trickle_n{i}", f"COUNT({arg.sql(DIALECT)})", "n"))
        if name in ("sum", "avg"):
            state.append((f"__trickle_s{i}", f"SUM({arg.sql(DIALECT)})", "s"))
    return state


def storage_layout(spark, defining_query: str, columns: dict[str, list[str]], current: dict[str, int]) -> dict:
    """How a DIFFERENTIAL stream table is stored: identity, strategy and hidden state columns."""
    node = plan(defining_query, columns)
    if not (isinstance(node, Block) and node.is_aggregate):
        return {"identity": "bag", "strategy": "bag", "state": []}
    versions = Versions(old=current, new=current, columns=columns)
    state = _aggregate_state(node)
    if state is not None:
        probe = keyed_full_sql(node, versions, state_exprs=[(n, e) for n, e, _ in state])
        types = {f.name: f.dataType.simpleString() for f in spark.sql(probe).schema.fields}
        if all(types[n].startswith(_EXACT) for n, _, role in state if role == "s"):
            return {"identity": "keyed", "strategy": "algebraic",
                    "state": [(n, types[n]) for n, _, _ in state],
                    "state_exprs": [(n, e) for n, e, _ in state]}
    return {"identity": "keyed", "strategy": "recompute", "state": []}


def keyed_full_sql(block: Block, versions: Versions, state_exprs: list[tuple[str, str]] | None = None,
                   which: str = "new") -> str:
    """The aggregate block at ``which`` version with its identity (and state) columns."""
    select = _with_identity(block.template, block)
    for name, sql in state_exprs or []:
        select.append("expressions", exp.maybe_parse(sql, dialect=DIALECT).as_(name))
    return block.render(select, [n.state_sql(versions, which) for _, n in block.items])


def full_source_sql(st, versions: Versions, columns: dict[str, list[str]]) -> str:
    """Rows (with identity and state) of a keyed stream table at ``versions.new``, for FULL."""
    block = plan(st.defining_query, columns)
    return keyed_full_sql(block, versions, [tuple(x) for x in st.storage.get("state_exprs", [])])


# -- differential ------------------------------------------------------------------------------

def differential_merge_sql(st, versions: Versions, columns: dict[str, list[str]]) -> str:
    """The one MERGE that applies the change of ``versions`` to stream table ``st``."""
    node = plan(st.defining_query, columns)
    strategy = st.storage.get("strategy", "bag")
    visible = st.output_columns
    if strategy == "bag":
        return _bag_merge(st.name, visible, node.delta_sql(versions), dup_type(st.storage))
    if not (isinstance(node, Block) and node.is_aggregate):
        raise Unsupported("stored as keyed but the query has no aggregate at the top; REINITIALIZE it")
    types = dict(st.storage.get("columns") or [])
    if strategy == "algebraic":
        return _algebraic_merge(st, node, versions, types)
    return _recompute_merge(st, node, versions)


#: Copies appended by refresh number ``seq`` are numbered ``seq * SPARSE_STRIDE + i``: unique
#: without reading the stored copies, so an append never reads its target.
SPARSE_STRIDE = 2 ** 31


def _hashed_delta(columns: list[str], delta_sql: str) -> str:
    """The bag delta consolidated per row content (``W`` = net copies), with the content hash ``__rid``."""
    cols = ", ".join(f"`{c}`" for c in columns)
    consolidated = (f"SELECT {cols}, SUM({W}) AS {W} FROM ({delta_sql}) AS __d GROUP BY {cols} "
                    f"HAVING SUM({W}) <> 0")
    return f"SELECT __c.*, {row_hash_sql(columns, qualifier='__c')} AS __rid FROM ({consolidated}) AS __c"


def _stored_copies(target: str, hashed: str) -> str:
    """The stored copy numbers of the contents in ``hashed``, ranked from the highest."""
    return (f"SELECT `{ROW_ID}` AS __rid, `{DUP}` AS __dup, "
            f"row_number() OVER (PARTITION BY `{ROW_ID}` ORDER BY `{DUP}` DESC) AS __rank "
            f"FROM {quote_name(target)} WHERE `{ROW_ID}` IN (SELECT __rid FROM ({hashed}) AS __h0)")


def _inserted_copies(columns: list[str], hashed: str, stored: str, dup_type: str) -> str:
    """+k copies of a content: numbered after its highest stored copy number (unique)."""
    cols = ", ".join(f"`{c}`" for c in columns)
    top = f"SELECT __rid, MAX(__dup) AS __n FROM ({stored}) AS __s GROUP BY __rid"
    numbered = (f"SELECT __h.*, CAST(COALESCE(__k.__n, 0) AS BIGINT) AS __n FROM ({hashed}) AS __h "
                f"LEFT JOIN ({top}) AS __k ON __h.__rid = __k.__rid WHERE __h.{W} > 0")
    return (f"SELECT {cols}, __rid AS `{ROW_ID}`, CAST(__dup AS {dup_type}) AS `{DUP}` FROM ({numbered}) AS __x "
            f"LATERAL VIEW explode(sequence(__n + 1, __n + {W})) AS __dup")


def bag_append_sql(target: str, columns: list[str], delta_sql: str, *, seq: int, dup_type: str = "bigint") -> str:
    """An INSERT applying a delta that only adds rows: an append, no MERGE.

    A Delta append commits in a fraction of a MERGE's time (it neither rewrites files nor, here,
    reads the target: with BIGINT copy numbers the copies of refresh ``seq`` are numbered
    ``seq * 2^31 + i``, unique without looking at the stored ones).  It is exact when every
    weight is positive, which holds for a monotone query (filters, projections, inner joins,
    UNION ALL) over sources that only gained rows.  A table with INT copy numbers (created by an
    older version) numbers its copies after the stored ones instead.
    """
    all_cols = columns + [ROW_ID, DUP]
    hashed = _hashed_delta(columns, delta_sql)
    if dup_type == "bigint":
        cols = ", ".join(f"`{c}`" for c in columns)
        copies = (f"SELECT {cols}, __rid AS `{ROW_ID}`, CAST({seq} AS BIGINT) * {SPARSE_STRIDE} + __i AS `{DUP}` "
                  f"FROM ({hashed}) AS __x LATERAL VIEW explode(sequence(1, {W})) AS __i WHERE {W} > 0")
    else:
        copies = _inserted_copies(columns, hashed, _stored_copies(target, hashed), dup_type)
    return f"INSERT INTO {quote_name(target)} ({_list(all_cols)}) SELECT {_list(all_cols)} FROM ({copies})"


def _bag_merge(target: str, columns: list[str], delta_sql: str, dup_type: str = "bigint") -> str:
    cols = ", ".join(f"`{c}`" for c in columns)
    hashed = _hashed_delta(columns, delta_sql)
    stored = _stored_copies(target, hashed)
    # +k copies: numbered after the highest stored number; −k copies: the k highest stored
    # numbers are deleted (numbers need not be dense: appends number copies per refresh).
    removed = (f"SELECT {cols}, __y.__rid AS `{ROW_ID}`, CAST(__s.__dup AS {dup_type}) AS `{DUP}`, 'D' AS __op "
               f"FROM ({hashed}) AS __y JOIN ({stored}) AS __s ON __y.__rid = __s.__rid "
               f"WHERE __y.{W} < 0 AND __s.__rank <= -__y.{W}")
    ops = f"SELECT *, 'I' AS __op FROM ({_inserted_copies(columns, hashed, stored, dup_type)}) UNION ALL {removed}"
    all_cols = columns + [ROW_ID, DUP]
    return (f"MERGE INTO {quote_name(target)} AS t USING ({ops}) AS s "
            f"ON t.`{ROW_ID}` = s.`{ROW_ID}` AND t.`{DUP}` = s.`{DUP}` "
            f"WHEN MATCHED AND s.__op = 'D' THEN DELETE "
            f"WHEN NOT MATCHED AND s.__op = 'I' THEN INSERT ({_list(all_cols)}) VALUES ({_list(all_cols, 's.')})")


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
    if name.startswith("__trickle_n"):
        i = name[len("__trickle_n"):]
        return f"__dn{i}", f"SUM({W} * CASE WHEN __trickle_x{i} IS NULL THEN 0 ELSE 1 END)"
    i = name[len("__trickle_s"):]
    return f"__ds{i}", f"SUM({W} * __trickle_x{i})"


def _linear_merge(st, block: Block, versions: Versions, types: dict[str, str]) -> str:
    """COUNT / SUM / AVG only: the MERGE itself advances the stored state, ``t.s + s.Δs``.

    Every state column is linear in the change weights, so the per-group change is summed
    straight from the raw change rows (no consolidation) and the target is read only by the
    MERGE's own join: the source never scans the storage table.
    """
    state = [tuple(x) for x in st.storage["state"]]
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
    state = [tuple(x) for x in st.storage["state"]]
    if not any(name.startswith("__trickle_m") for name, _ in state):
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
        if not name.startswith("__trickle_m"):
            column, total = _linear_change(name)
            sums.append(f"{total} AS {column}")
        else:
            i = name[len("__trickle_m"):]
            fn = block.aggregates[int(i)].sql_name().upper()
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
        if name.startswith("__trickle_m"):
            i = name[len("__trickle_m"):]
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
            exp.maybe_parse(f"{fn}({agg_args[int(i)].sql(DIALECT)})", dialect=DIALECT).as_(f"__r{i}")
            for i, fn in extremes.items()])
        rescan_sql = block.render(block.restricted(keys, rescan, scalar_too=True),
                                  [n.state_sql(versions, "new") for _, n in block.items])
        joined += f" LEFT JOIN ({rescan_sql}) AS r ON r.__rid = {group_hash(['d.' + g for g in group_names])}"
    merged = f"SELECT d.*, {rid} AS __rid, {', '.join(advanced)} FROM {joined}"
    values = _aggregate_values(block, state_types, lambda name: f"`{name}`")
    visible = [f"{sql} AS `{column}`" for column, sql in _visible_cells(st, block, group_names, values, types)]
    source = (f"SELECT {', '.join(visible)}, __rid AS `{ROW_ID}`, CAST(1 AS INT) AS `{DUP}`, "
              f"{', '.join(f'`{n}`' for n, _ in state)} FROM ({merged}) AS __m")
    cells = [(c, f"s.`{c}`") for c in st.output_columns + [ROW_ID, DUP] + [n for n, _ in state]]
    return _keyed_merge(st.name, source, scalar=not block.group, gone=f"s.`{COUNT}` = 0",
                        fresh=f"s.`{COUNT}` > 0", updates=cells, inserts=cells)


def _needs_rescan(i: str, fn: str) -> str:
    """SQL: a deletion in this group reached (or may have reached) its stored MIN/MAX."""
    reached = "<=" if fn == "MIN" else ">="
    return f"(d.__dd{i} IS NOT NULL AND (t.`__trickle_m{i}` IS NULL OR d.__dd{i} {reached} t.`__trickle_m{i}`))"


def _aggregate_values(block: Block, state_types: dict[str, str], ref) -> dict[int, str]:
    """Each aggregate's value as SQL over its state columns; ``ref(name)`` reads a state column."""
    values = {}
    for i, agg in enumerate(block.aggregates):
        name = agg.sql_name().lower()
        count = ref(f"__trickle_n{i}") if f"__trickle_n{i}" in state_types else None
        if name == "count":
            values[i] = ref(COUNT) if agg.this is None or isinstance(agg.this, exp.Star) else count
        elif name == "sum":
            values[i] = f"CASE WHEN {count} = 0 THEN NULL ELSE {ref(f'__trickle_s{i}')} END"
        elif name in ("min", "max"):
            values[i] = ref(f"__trickle_m{i}")
        else:  # avg: Spark's AVG divides the sum by the count (as double, or decimal for decimals)
            kind, total = state_types[f"__trickle_s{i}"], ref(f"__trickle_s{i}")
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


def _recompute_merge(st, block: Block, versions: Versions) -> str:
    keys = block.affected_groups_sql(versions)
    fresh = block.render(_with_identity(block.restricted(keys), block), [n.state_sql(versions, "new") for _, n in block.items])
    if not block.group:  # a scalar aggregate: its one row is recomputed
        keys = "SELECT xxhash64(0) AS __trickle_row_id"
    source = (f"SELECT __k.__trickle_row_id AS __key, __n.* FROM ({keys}) AS __k "
              f"LEFT JOIN ({fresh}) AS __n ON __k.__trickle_row_id = __n.`{ROW_ID}`")
    cols = st.output_columns + [ROW_ID, DUP]
    differs = " OR ".join(f"NOT (t.`{c}` <=> s.`{c}`)" for c in st.output_columns)
    return (f"MERGE INTO {quote_name(st.name)} AS t USING ({source}) AS s "
            f"ON t.`{ROW_ID}` = s.__key AND t.`{DUP}` = 1 "
            f"WHEN MATCHED AND s.`{ROW_ID}` IS NULL THEN DELETE "
            f"WHEN MATCHED AND ({differs}) THEN UPDATE SET {', '.join(f't.`{c}` = s.`{c}`' for c in cols)} "
            f"WHEN NOT MATCHED AND s.`{ROW_ID}` IS NOT NULL THEN INSERT ({_list(cols)}) VALUES ({_list(cols, 's.')})")


def _with_identity(select: exp.Select, block: Block) -> exp.Select:
    select = select.copy()
    select.append("expressions", exp.maybe_parse(block.group_hash_sql(), dialect=DIALECT).as_(ROW_ID))
    select.append("expressions", exp.maybe_parse("CAST(1 AS INT)", dialect=DIALECT).as_(DUP))
    return select


def _list(columns: list[str], prefix: str = "") -> str:
    return ", ".join(f"{prefix}`{c}`" for c in columns)

