"""Which inputs of a join's delta terms can be probed by key, and by which keys.

A term of a join's delta, ``ΔRi ⋈ R1,new ⋈ … ⋈ Rn,old``, needs of each other input only the
rows that can meet the change: those whose join key is among the keys of the change, or of an
input already restricted that way.  This pass (pure, over the block's sqlglot template, no
Spark) walks each term's equalities outwards from the change and records, for each stored
input it reaches, the column looked up, the relation whose column gives the keys, and the
version the term reads it at.  The refresh (``refresh/arranged.py``) reads the change with
delta-rs, probes the inputs' arrangements (``storage/arrangement.py``) in this order and binds
the rows found into the :class:`~airflow_trickle.dvm.base.Versions` the delta is rendered
with; :func:`~airflow_trickle.dvm.join.join_delta` then reads them in that term only.

Restricting an input to the keys an equality can match is exact when every row the term
outputs must satisfy the equality: a conjunct of the WHERE, or of an inner join's ON.  The ON
of a LEFT [OUTER|SEMI|ANTI] join restricts only its right side (a left row without a partner
is still output); blocks with a FULL join are left alone.  Only ``=`` qualifies (``<=>`` would
match NULL keys, which an arrangement leaves out).

Beyond a join's linear terms, the same lookups serve:

* an input that is an aggregate of one table grouped by the column looked up (:func:`keyed`:
  a subquery the optimizer made a join), looked up through that table;
* such an aggregate's own touched groups, recomputed from its table's rows of the change's
  keys (:func:`keyed_deltas`), and those of an aggregate of a join whose group values the
  changes' keys bound (:func:`group_keys_of_changes`);
* the term of a LEFT join's null-supplying side (:func:`outer_terms`), recomputed for the
  change's join keys from both sides looked up by them.

    >>> from airflow_trickle.dvm.planner import plan
    >>> cols = {"s.o": ["ok", "ck", "d"], "s.l": ["ok", "q", "x"], "s.c": ["ck", "n"]}
    >>> node = plan("SELECT c.n, SUM(l.q) AS q FROM s.o AS o, s.l AS l, s.c AS c "
    ...             "WHERE o.ok = l.ok AND o.ck = c.ck GROUP BY c.n", cols)
    >>> v = Versions(old={"s.o": 1, "s.l": 1, "s.c": 1}, new={"s.o": 2, "s.l": 1, "s.c": 1}, columns=cols)
    >>> for term in join_terms(node, v):
    ...     print(term.source, term.change_columns, [(p.source, p.key, p.by, p.by_column, p.which) for p in term.probes])
    s.o ('ck', 'ok') [('s.l', 'ok', 0, 'ok', 'old'), ('s.c', 'ck', 0, 'ck', 'old')]
"""
from __future__ import annotations

from dataclasses import dataclass

from sqlglot import exp

from airflow_trickle.dvm.base import Node, Versions, operators
from airflow_trickle.sql.parse import DIALECT


@dataclass(frozen=True)
class Probe:
    """One input of a term looked up by key."""

    item: int  # its FROM item
    source: str  # the stored table
    which: str  # the version the term reads it at: "old" or "new"
    key: str  # its column looked up
    columns: tuple[str, ...]  # its columns the block reads (the key among them)
    by: int  # the FROM item whose rows give the keys: the changed one, or one probed before
    by_column: str  # that item's column holding them
    #: Further equalities with items known by then, ``(item, its column, this input's column)``:
    #: the rows found are kept only where those match too (``ps_partkey = l_partkey`` after a
    #: probe by ``ps_suppkey = l_suppkey``)
    also: tuple[tuple[int, str, str], ...] = ()


@dataclass(frozen=True)
class JoinTerm:
    """The term of ``block``'s join delta that joins the change of FROM item ``changed``."""

    block: Node
    changed: int
    source: str  # the changed stored table
    change_columns: tuple[str, ...]  # its columns the block reads
    probes: tuple[Probe, ...]  # in the order they can run (each ``by`` is known before)
    #: The changed item is an aggregate of the changed table (:func:`keyed`): its change rows
    #: give the keys the other inputs are probed by, and the item keeps its own delta.
    aggregated: bool = False


#: The pseudo FROM item whose rows are an outer term's join-key values (:class:`OuterTerm`).
OUTER_KEYS = -1


@dataclass(frozen=True)
class OuterTerm:
    """The term of ``block``'s join delta for FROM item ``changed``, the null-supplying side of a
    LEFT join (``dvm/outer_join.py``): the chain recomputed before and after for K, the join-key
    values of the item's change.

    The changed item is probed by K at both versions; the item holding the other side of the
    key by K too (the term keeps only rows whose key is in K), and the inputs reached from it
    along equalities.  Probing by the change's keys -- a superset of K where the item is an
    aggregate (``keyed``) -- is exact: the term restricts both sides to K itself.  The key is
    an ``=`` of the ON, so a NULL among the change's keys is left out of the lookups: a row
    whose key is NULL meets no partner, and the preserved rows it would select are output alike
    before and after, cancelling whether both sides hold them or neither does."""

    block: Node
    changed: int
    source: str  # the changed table (the item's, or its aggregate's)
    key: str  # the changed table's column holding the join key
    columns: tuple[str, ...]  # the changed table's columns the item reads
    probes: tuple[Probe, ...]  # the preserved side's by the keys (``by`` is OUTER_KEYS), then onwards


def _plain_equalities(on: exp.Expression | None) -> set[frozenset[str]]:
    """The ``=`` conjuncts of ``on`` (not ``<=>``: a NULL key matches nothing only under ``=``)."""
    return {_pair_sql(c.this, c.expression) for c in _conjuncts(on) if isinstance(c, exp.EQ)}


def _pair_sql(a: exp.Expression, b: exp.Expression) -> frozenset[str]:
    return frozenset((a.sql(DIALECT), b.sql(DIALECT)))


def outer_terms(node: Node, v: Versions) -> tuple[OuterTerm, ...]:
    """Every outer term under ``node`` whose changed item is a stored table's change feed (or an
    aggregate of one, :func:`keyed`) joined by a plain column (:class:`OuterTerm`)."""
    from airflow_trickle.dvm.block import Block
    from airflow_trickle.dvm.join import JoinKind

    found = []
    for block in operators(node):
        if not (isinstance(block, Block) and len(block.items) > 1) or any(
                block.step(i).kind is JoinKind.FULL for i in range(len(block.items))):
            continue
        aliases = [alias for alias, _ in block.items]
        used = _columns_by_alias(block.template, aliases)
        equalities = _equalities(block, aliases)
        for i, (alias, item) in enumerate(block.items):
            step = block.step(i)
            stored = _stored_columns(item)
            if step.kind is not JoinKind.LEFT or stored is None or not item.changed(v) \
                    or not v.use_cdf.get(stored.table, True):
                continue
            equal = _plain_equalities(block.template.args["joins"][i - 1].args.get("on"))
            pair = next(((o, k) for o, k in zip(step.outer_keys, step.item_keys)
                         if isinstance(k, exp.Column) and k.table == alias
                         and stored.column(k.name) is not None and _pair_sql(o, k) in equal), None)
            if pair is None:
                continue
            outer, own = pair
            key = stored.column(own.name)
            probes = []
            j = aliases.index(outer.table) if isinstance(outer, exp.Column) and outer.table in aliases else None
            held = _stored_columns(block.items[j][1]) if j is not None else None
            if held is not None and held.column(outer.name) is not None:
                probes.append(Probe(item=j, source=held.table, which="new" if j < i else "old",
                                    key=held.column(outer.name), columns=held.columns(used[aliases[j]]),
                                    by=OUTER_KEYS, by_column=key))
                probes += _walk(block, j, used, equalities, lambda n: "new" if n < i else "old", blocked={i})
            found.append(OuterTerm(block=block, changed=i, source=stored.table, key=key,
                                   columns=stored.columns(used[alias]), probes=tuple(probes)))
    return tuple(found)


@dataclass(frozen=True)
class Keyed:
    """A FROM item that is an aggregate of one stored table grouped by plain columns of it
    (a subquery the optimizer turned into a join: ``EXISTS``, ``IN``, a correlated aggregate).

    Its rows whose group column is in a key set K are exactly the aggregate of the table's rows
    whose column is in K -- a group holds only rows of its own value -- so the item is probed by
    probing the table by that column and letting Spark aggregate the rows found."""

    scan: Node
    alias: str  # the table's alias inside the aggregate
    columns: tuple[str, ...]  # the table's columns the aggregate reads
    keys: dict[str, str]  # the aggregate's output column -> the table's group column it is


def keyed(node: Node) -> Keyed | None:
    """``node`` as a :class:`Keyed` item, or None (not an aggregate of one stored table, or no
    output column is a plain group column).

    >>> from airflow_trickle.dvm.planner import plan
    >>> k = keyed(plan("SELECT l.ok AS k, SUM(l.q) AS q FROM s.l AS l WHERE l.q > 0 GROUP BY l.ok",
    ...                {"s.l": ["ok", "q", "x"]}))
    >>> k.scan.name, k.columns, k.keys
    ('s.l', ('ok', 'q'), {'k': 'ok'})
    """
    from airflow_trickle.dvm.block import Block
    from airflow_trickle.dvm.scan import Scan

    if not (isinstance(node, Block) and node.is_aggregate and node.group and node.window_keys is None
            and len(node.items) == 1 and isinstance(node.items[0][1], Scan)
            and not node.template.args.get("laterals") and not node.template.args.get("joins")):
        return None
    alias, scan = node.items[0]
    own = set(scan.columns)  # one FROM item: a column not qualified is its own

    def of_scan(e: exp.Expression) -> bool:
        return isinstance(e, exp.Column) and e.table in ("", alias) and e.name in own

    grouped = {g.name for g in node.group if of_scan(g)}
    keys = {}
    for name, projection in zip(node.columns, node.template.expressions):
        inner = projection.unalias()
        if of_scan(inner) and inner.name in grouped:
            keys[name] = inner.name
    if not keys:
        return None
    read = {c.name for c in node.template.find_all(exp.Column) if of_scan(c)}
    return Keyed(scan=scan, alias=alias, columns=tuple(sorted(read)), keys=keys)


@dataclass(frozen=True)
class KeyedDelta:
    """An aggregate of one changed stored table, grouped by a plain column of it, whose delta --
    its touched groups recomputed before and after -- reads that table probed by the change's
    values of the column instead of whole (``dvm/aggregate.py``)."""

    block: Node
    source: str
    key: str  # the table's group column looked up
    columns: tuple[str, ...]  # the table's columns the aggregate reads


def keyed_deltas(node: Node, v: Versions) -> tuple[KeyedDelta, ...]:
    """Every aggregate below ``node`` whose touched groups can be recomputed from its table's
    rows probed by the change's keys (:class:`KeyedDelta`): a :func:`keyed` block whose table
    changed and has a readable change feed.

    Exact: a touched group's value of the column is in the change's rows, and every stored row
    of the group holds that value.  An arrangement leaves NULL keys out: when the change touches
    the NULL group, its rows are read from the table by Spark (``Versions.null_group_rows``)."""
    found = []
    for block in operators(node):
        if block is node:
            continue  # the top aggregate is applied from its input's delta (``dvm/apply.py``)
        item = keyed(block)
        if item is None or not item.scan.changed(v) or not v.use_cdf.get(item.scan.name, True):
            continue
        column = next(iter(item.keys.values()))
        found.append(KeyedDelta(block=block, source=item.scan.name, key=column, columns=item.columns))
    return tuple(found)


def join_terms(node: Node, v: Versions) -> tuple[JoinTerm, ...]:
    """Every join-delta term under ``node`` whose change is a stored table's change feed and
    that reaches at least one other stored input by an equality."""
    from airflow_trickle.dvm.block import Block

    terms = []
    for block in operators(node):
        if isinstance(block, Block) and len(block.items) > 1:
            terms += _block_terms(block, v)
    return tuple(terms)


def _block_terms(block, v: Versions) -> list[JoinTerm]:
    from airflow_trickle.dvm.join import JoinKind
    from airflow_trickle.dvm.scan import Scan

    if any(block.step(i).kind is JoinKind.FULL for i in range(len(block.items))):
        return []
    aliases = [alias for alias, _ in block.items]
    used = _columns_by_alias(block.template, aliases)
    equalities = _equalities(block, aliases)
    terms = []
    for i, (alias, node) in enumerate(block.items):
        item = keyed(node)
        scan = node if isinstance(node, Scan) else item.scan if item else None
        if not (scan is not None and scan.changed(v) and block.is_linear_in(i)
                and v.use_cdf.get(scan.name, True) and used.get(alias)):
            continue
        probes = _walk(block, i, used, equalities, lambda item: "new" if item < i else "old")
        if probes:
            terms.append(JoinTerm(block=block, changed=i, source=scan.name,
                                  change_columns=item.columns if item else tuple(sorted(used[alias])),
                                  probes=tuple(probes), aggregated=item is not None))
    return terms


@dataclass(frozen=True)
class GroupProbe:
    """How an aggregate's touched groups, once known, are recomputed from probed inputs: the
    FROM item holding a GROUP BY column is looked up by the groups' values of that column, and
    the other inputs along the equalities from it (``probes``, their ``which`` unset: the
    refresh probes them once at the old versions and once at the new)."""

    block: Node
    item: int  # the FROM item holding the GROUP BY column
    source: str
    group: int  # the GROUP BY expression's position
    key: str  # the item's column it is
    columns: tuple[str, ...]  # the item's columns the block reads
    probes: tuple[Probe, ...]


def group_probes(block, v: Versions) -> GroupProbe | None:
    """How ``block``'s touched groups can be recomputed by probes, or None.

    Restricting the inputs this way is exact: a joined row of a touched group holds one of the
    groups' values in the GROUP BY column (NULL excluded: the refresh probes only when no
    touched group has a NULL there), so its row of that item has the value, and its row of
    every item reached along an equality meets that equality (a row an outer join pads with
    NULLs brings no input row).  The groups' hash filter then keeps exactly the touched groups.

    >>> from airflow_trickle.dvm.planner import plan
    >>> cols = {"s.o": ["ok", "ck", "d"], "s.l": ["ok", "q"], "s.c": ["ck", "n"]}
    >>> block = plan("SELECT l.ok, o.d, SUM(l.q) AS q FROM s.c AS c, s.o AS o, s.l AS l "
    ...              "WHERE c.ck = o.ck AND l.ok = o.ok GROUP BY l.ok, o.d", cols)
    >>> v = Versions(old={"s.o": 1, "s.l": 1, "s.c": 1}, new={"s.o": 2, "s.l": 1, "s.c": 1}, columns=cols)
    >>> g = group_probes(block, v)
    >>> g.source, g.key, g.group, [(p.source, p.key, p.by, p.by_column) for p in g.probes]
    ('s.l', 'ok', 0, [('s.o', 'ok', 2, 'ok'), ('s.c', 'ck', 1, 'ck')])
    """
    return next(group_chains(block, v), None)


def group_chains(block, v: Versions):
    """Each way :func:`group_probes` could look ``block``'s touched groups up, one per GROUP BY
    column that is a stored input's column, those the inputs are joined by first."""
    from airflow_trickle.dvm.join import JoinKind
    from airflow_trickle.dvm.scan import Scan

    if not getattr(block, "group", None) or any(block.step(i).kind is JoinKind.FULL for i in range(len(block.items))):
        return
    aliases = [alias for alias, _ in block.items]
    used = _columns_by_alias(block.template, aliases)
    equalities = _equalities(block, aliases)
    joined = {(aliases[a], column) for a, column, _, _ in equalities}
    # a column the inputs are joined by first: a key, of a type arrangements hold (q18 groups by
    # c_name first, a string, then by c_custkey and o_orderkey)
    order = sorted(range(len(block.group)), key=lambda k: (block.group[k].table, block.group[k].name) not in joined
                   if isinstance(block.group[k], exp.Column) else True)
    for k in order:
        expression = block.group[k]
        if not (isinstance(expression, exp.Column) and expression.table in aliases):
            continue
        item = aliases.index(expression.table)
        node = block.items[item][1]
        if not isinstance(node, Scan) or expression.name not in used.get(expression.table, ()):
            continue
        probes = _walk(block, item, used, equalities, lambda _: "")
        yield GroupProbe(block=block, item=item, source=node.name, group=k, key=expression.name,
                         columns=tuple(sorted(used[expression.table])), probes=tuple(probes))


@dataclass(frozen=True)
class GroupOrigin:
    """Where the group values one changed FROM item's term can output are found: the values of
    ``column`` in the change of ``table``, or (``via`` set) the values of ``value`` in the rows
    of another input found by them (:func:`group_keys_of_changes`)."""

    item: int  # the changed FROM item
    table: str  # its stored table
    column: str  # the table's column whose values in the change bound the groups (or key ``via``)
    own: bool  # the values are the group column's own (a NULL among them is the NULL group)
    columns: tuple[str, ...]  # the table's columns the block reads (its condition tests them)
    #: The input whose rows, looked up by ``column``'s values at both versions, hold the group
    #: values in ``value`` (TPC-H q10: a line item reaches its customer through its order)
    via: Probe | None = None
    value: str | None = None


def group_keys_of_changes(block, v: Versions, chain: GroupProbe) -> tuple[GroupOrigin, ...] | None:
    """Where the group values ``block``'s input delta touches come from: for each changed FROM
    item, a :class:`GroupOrigin` whose values hold every value of the GROUP BY column ``chain``
    looks up that the item's term can output; None when some changed item gives none.

    The item holding the group column gives that column; an item equal to it by a WHERE
    conjunct or an inner join's ON gives its side of the equality (a term's rows satisfy it);
    the null-supplying side of a LEFT join whose ON pairs it with the group column gives its
    side of the key (its term keeps only rows whose key is among the change's).  The NULL group
    is bounded only by the group column's own table: a NULL there touches it (the refresh then
    leaves the groups to Spark), a NULL on the other side of an ``=`` touches no group.

    An item equal to neither but, by such a conjunct, to a third stored input that is gives its
    side of that equality, ``via`` that input: an output row of its term holds a row of the
    third input, at the old versions or at the new, whose key is the change row's and whose
    other column is the group value.

    >>> from airflow_trickle.dvm.planner import plan
    >>> cols = {"s.c": ["ck", "n"], "s.o": ["ok", "ck", "d"], "s.l": ["ok", "q"]}
    >>> block = plan("SELECT c.ck, SUM(l.q) AS q FROM s.c AS c, s.o AS o, s.l AS l "
    ...              "WHERE c.ck = o.ck AND l.ok = o.ok GROUP BY c.ck", cols)
    >>> v = Versions(old={"s.c": 1, "s.o": 1, "s.l": 1}, new={"s.c": 1, "s.o": 2, "s.l": 2}, columns=cols)
    >>> [(o.table, o.column, o.via and (o.via.source, o.via.key), o.value)
    ...  for o in group_keys_of_changes(block, v, group_probes(block, v))]
    [('s.o', 'ck', None, None), ('s.l', 'ok', ('s.o', 'ok'), 'ck')]
    """
    from airflow_trickle.dvm.join import JoinKind

    aliases = [alias for alias, _ in block.items]
    group_alias = aliases[chain.item]
    used = _columns_by_alias(block.template, aliases)
    symmetric = [(c.this, c.expression) for c in _output_conjuncts(block)
                 if isinstance(c, exp.EQ) and isinstance(c.this, exp.Column) and isinstance(c.expression, exp.Column)]
    pairs = symmetric + [(b, a) for a, b in symmetric]

    def direct(i: int) -> list[str]:  # item i's columns every output row holds the group value in
        if i == chain.item:
            return [chain.key]
        return [mine.name for mine, other in pairs
                if mine.table == aliases[i] and other.table == group_alias and other.name == chain.key]

    found = []
    for i, (alias, node) in enumerate(block.items):
        stored = _stored_columns(node)
        if not node.changed(v):
            continue
        if stored is None or not v.use_cdf.get(stored.table, True):
            return None
        columns = stored.columns(used[alias])
        candidates = []
        if i == chain.item or block.is_linear_in(i):
            candidates = direct(i)
        elif block.step(i).kind is JoinKind.LEFT:
            step = block.step(i)
            equal = _plain_equalities(block.template.args["joins"][i - 1].args.get("on"))
            candidates += [k.name for o, k in zip(step.outer_keys, step.item_keys)
                           if isinstance(o, exp.Column) and o.table == group_alias and o.name == chain.key
                           and isinstance(k, exp.Column) and k.table == alias and _pair_sql(o, k) in equal]
        column = next((stored.column(c) for c in candidates if stored.column(c) is not None), None)
        if column is not None:
            found.append(GroupOrigin(i, stored.table, column, i == chain.item, columns))
            continue
        via = _via(block, i, pairs, direct, used) if block.is_linear_in(i) else None
        if via is None:
            return None
        mine, probe, value = via
        found.append(GroupOrigin(i, stored.table, stored.column(mine), probe.item == chain.item, columns,
                                 via=probe, value=value))
    return tuple(found) or None


def _via(block, i: int, pairs, direct, used) -> tuple[str, Probe, str] | None:
    """``(item i's column, the lookup of a third stored input by it, that input's column holding
    the group value)`` for :func:`group_keys_of_changes`; None when no equality gives one."""
    aliases = [alias for alias, _ in block.items]
    stored_i = _stored_columns(block.items[i][1])
    for mine, other in pairs:
        if mine.table != aliases[i] or other.table not in aliases or other.table == aliases[i]:
            continue
        j = aliases.index(other.table)
        stored_j = _stored_columns(block.items[j][1])
        if stored_j is None or stored_i.column(mine.name) is None or stored_j.column(other.name) is None:
            continue
        value = next((stored_j.column(c) for c in direct(j) if stored_j.column(c) is not None), None)
        if value is not None:
            probe = Probe(item=j, source=stored_j.table, which="", key=stored_j.column(other.name),
                          columns=stored_j.columns(used[other.table]), by=i, by_column=stored_i.column(mine.name))
            return mine.name, probe, value
    return None


def _walk(block, start: int, used: dict[str, set[str]], equalities, which, blocked=frozenset()) -> list[Probe]:
    """The probes reaching out from FROM item ``start`` along ``equalities``, in an order
    where each probe's keys are known before it runs (``which(item)``: the version it reads).

    An item that is an aggregate of one table (:func:`keyed`) is probed through that table, by
    the group column an equality names; its rows found are the table's, so a probe by them, or
    a filter on them, names the table's column too.  ``blocked`` items are neither probed nor
    give keys (an outer term probes its changed item apart, once per version)."""
    aliases = [alias for alias, _ in block.items]
    stored = [_stored_columns(node) for _, node in block.items]

    def column_of(item: int, column: str) -> str | None:
        return stored[item].column(column) if stored[item] else None

    known, probes = {start}, []
    progress = True
    while progress:
        progress = False
        for known_item, known_column, item, column in equalities:
            if not (known_item in known and item not in known and stored[item] and item not in blocked
                    and column in used.get(aliases[item], ())):
                continue
            key, by_column = column_of(item, column), column_of(known_item, known_column)
            if key is None or by_column is None:
                continue
            source, held = stored[item].table, stored[item].columns(used[aliases[item]])
            also = tuple(dict.fromkeys((k, column_of(k, kc), column_of(item, c)) for k, kc, j, c in equalities
                                       if j == item and k in known and k not in blocked
                                       and (k, kc, c) != (known_item, known_column, column)
                                       and column_of(k, kc) is not None and column_of(item, c) is not None))
            probes.append(Probe(item=item, source=source, which=which(item), key=key, columns=held,
                                by=known_item, by_column=by_column, also=also))
            known.add(item)
            progress = True
    return probes


@dataclass(frozen=True)
class _Stored:
    """How a FROM item's rows come from one stored table: a scan's columns are the table's
    own, a :func:`keyed` aggregate's group columns name the table's columns they are."""

    table: str
    renamed: dict[str, str] | None  # the item's column -> the table's (None: every column is itself)
    reads: tuple[str, ...] | None  # the table's columns to read (None: those the block reads)

    def column(self, name: str) -> str | None:
        """The table's column the item's column ``name`` is; None when it is none of them."""
        return name if self.renamed is None else self.renamed.get(name)

    def columns(self, used: set[str]) -> tuple[str, ...]:
        """The table's columns a lookup reads, ``used`` being what the block reads of the item."""
        return self.reads or tuple(sorted(used))


def _stored_columns(node: Node) -> _Stored | None:
    """How ``node``'s rows come from one stored table (:class:`_Stored`); None for an item
    that is neither a scan nor a :func:`keyed` aggregate."""
    from airflow_trickle.dvm.scan import Scan

    if isinstance(node, Scan):
        return _Stored(node.name, None, None)
    item = keyed(node)
    return _Stored(item.scan.name, item.keys, item.columns) if item else None


def _columns_by_alias(template: exp.Select, aliases: list[str]) -> dict[str, set[str]]:
    """The columns of each FROM item the block reads anywhere in its SELECT."""
    used: dict[str, set[str]] = {a: set() for a in aliases}
    for column in template.find_all(exp.Column):
        if column.table in used and not isinstance(column.this, exp.Star):
            used[column.table].add(column.name)
    return used


def _equalities(block, aliases: list[str]) -> list[tuple[int, str, int, str]]:
    """``(known item, its column, probed item, its column)`` for every equality that may restrict
    the probed item, both ways round where both sides may be restricted."""
    from airflow_trickle.dvm.join import JoinKind

    index = {alias: n for n, alias in enumerate(aliases)}
    found = []

    def add(conjunct: exp.Expression, only: int | None) -> None:
        if not (isinstance(conjunct, exp.EQ) and isinstance(conjunct.this, exp.Column)
                and isinstance(conjunct.expression, exp.Column)):
            return
        left, right = conjunct.this, conjunct.expression
        if left.table not in index or right.table not in index or left.table == right.table:
            return
        a, b = index[left.table], index[right.table]
        if only is None or b == only:
            found.append((a, left.name, b, right.name))
        if only is None or a == only:
            found.append((b, right.name, a, left.name))

    where = block.template.args.get("where")
    for conjunct in _conjuncts(where.this if where is not None else None):
        add(conjunct, None)
    for n, join in enumerate(block.template.args.get("joins") or [], start=1):
        kind = block.step(n).kind
        for conjunct in _conjuncts(join.args.get("on")):
            add(conjunct, None if kind is JoinKind.INNER else n)
    return found


def item_conditions(block) -> dict[int, exp.Expression]:
    """For each FROM item of ``block``, what its own rows must satisfy to meet an output row of
    the block: the parts of the WHERE and of the inner joins' ONs that read only its columns
    (for the null-supplying side of a LEFT join, of its own ON only); items without any are
    left out, and so is every item of a block with a FULL join.

    Why: a lookup gathers an input's rows by key, and a change carries every changed row; the
    rows that fail the block's own filter meet no output row, so the refresh may leave them out
    before looking further (fewer keys) and before handing them to Spark (fewer rows).  A row
    of the preserved side of a LEFT join is output whatever its partners, but still only when
    it passes the WHERE; a null-supplying row is output only when its ON holds.  An OR keeps
    the disjunction of its disjuncts' parts, and gives nothing when one disjunct has none.

    >>> from airflow_trickle.dvm.planner import plan
    >>> cols = {"s.l": ["k", "d", "m"], "s.p": ["k", "t"]}
    >>> node = plan("SELECT SUM(l.m) AS m FROM s.l AS l, s.p AS p WHERE (l.k = p.k AND l.d > 5 AND p.t = 'a') "
    ...             "OR (l.k = p.k AND l.d < 2 AND l.m = 1)", cols)
    >>> {node.items[i][0]: c.sql() for i, c in item_conditions(node).items()}
    {'l': 'l.d > 5 OR (l.d < 2 AND l.m = 1)'}
    """
    from airflow_trickle.dvm.join import JoinKind

    kinds = [block.step(i).kind for i in range(len(block.items))]
    if JoinKind.FULL in kinds:
        return {}
    joins = block.template.args.get("joins") or []
    shared = _output_conjuncts(block)
    found = {}
    for i, (alias, _) in enumerate(block.items):
        own = _conjuncts(joins[i - 1].args.get("on")) if kinds[i] is JoinKind.LEFT else shared
        parts = [part for part in (_restricted(c, alias) for c in own) if part is not None]
        if parts:
            found[i] = exp.and_(*parts) if len(parts) > 1 else parts[0]
    return found


def _output_conjuncts(block) -> list[exp.Expression]:
    """The conjuncts every output row of ``block`` satisfies: the WHERE's and the inner joins' ONs'."""
    from airflow_trickle.dvm.join import JoinKind

    where = block.template.args.get("where")
    found = _conjuncts(where.this if where is not None else None)
    for n, join in enumerate(block.template.args.get("joins") or [], start=1):
        if block.step(n).kind is JoinKind.INNER:
            found += _conjuncts(join.args.get("on"))
    return found


def _restricted(condition: exp.Expression, alias: str) -> exp.Expression | None:
    """What every row satisfying ``condition`` satisfies of the columns of ``alias`` alone (a
    copy); None when nothing is known."""
    while isinstance(condition, exp.Paren):
        condition = condition.this
    if isinstance(condition, exp.And):
        parts = [part for part in (_restricted(c, alias) for c in condition.flatten()) if part is not None]
        return (exp.and_(*parts) if len(parts) > 1 else parts[0]) if parts else None
    if isinstance(condition, exp.Or):
        parts = [_restricted(c, alias) for c in condition.flatten()]
        return None if any(part is None for part in parts) else exp.or_(*parts)
    columns = list(condition.find_all(exp.Column))
    if columns and all(c.table == alias for c in columns) and condition.find(exp.Query) is None:
        return condition.copy()
    return None


def _conjuncts(condition: exp.Expression | None) -> list[exp.Expression]:
    """The conjuncts of ``condition``, and those every disjunct of a conjunct that is an OR
    holds alike (TPC-H q19's join equality, repeated in each of its three disjuncts)."""
    if condition is None:
        return []
    while isinstance(condition, exp.Paren):
        condition = condition.this
    found = list(condition.flatten()) if isinstance(condition, exp.And) else [condition]
    return found + [common for c in found if isinstance(c, exp.Or) for common in _common_conjuncts(c)]


def _common_conjuncts(disjunction: exp.Or) -> list[exp.Expression]:
    """The conjuncts found, written alike, in every disjunct of ``disjunction``."""
    disjuncts = [_conjuncts(d) for d in disjunction.flatten()]
    texts = [{c.sql() for c in conjuncts} for conjuncts in disjuncts[1:]]
    return [c for c in disjuncts[0] if all(c.sql() in held for held in texts)]
