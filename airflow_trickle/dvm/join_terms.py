"""Which inputs of a join's delta terms can be probed by key, and by which keys.

A term of a join's delta, ``ΔRi ⋈ R1,new ⋈ … ⋈ Rn,old``, needs of each other input only the
rows that can meet the change: those whose join key is among the keys of the change, or of an
input already restricted that way.  This pass (pure, over the block's sqlglot template, no
Spark) walks each term's equalities outwards from the change and records, for each stored
input it reaches, the column looked up, the relation whose column gives the keys, and the
version the term reads it at.  The refresh (``refresh/probe_joins.py``) reads the change with
delta-rs, probes the inputs' arrangements (``storage/arrangement.py``) in this order and binds
the rows found (:class:`~airflow_trickle.dvm.bindings.Bindings`);
:func:`~airflow_trickle.dvm.join.join_delta` then reads them in that term only.

Restricting an input to the keys an equality can match is exact when every row the term
outputs must satisfy the equality: a conjunct of the WHERE, or of an inner join's ON.  The ON
of a LEFT [OUTER|SEMI|ANTI] join restricts only its right side (a left row without a partner
is still output); blocks with a FULL join are left alone.  Only ``=`` qualifies (``<=>`` would
match NULL keys, which an arrangement leaves out).  An input that is an aggregate of one table
grouped by the column looked up (``dvm/keyed.py``) is looked up through that table.

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

from airflow_trickle.dvm.base import Node, Versions, operators
from airflow_trickle.dvm.block import Block
from airflow_trickle.dvm.conjuncts import columns_by_alias, equalities, has_full_join
from airflow_trickle.dvm.keyed import stored_columns
from airflow_trickle.dvm.scan import Scan


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
    #: The changed item is an aggregate of the changed table (``dvm/keyed.py``): its change rows
    #: give the keys the other inputs are probed by, and the item keeps its own delta.
    aggregated: bool = False


@dataclass(frozen=True)
class JoinedBlock:
    """A block joining several FROM items (none by a FULL join): what its lookups walk."""

    block: Block
    aliases: list[str]
    used: dict[str, set[str]]  # the columns of each item the block reads
    equalities: list[tuple[int, str, int, str]]  # ``dvm/conjuncts.equalities``


def joined_blocks(node: Node):
    """Each :class:`JoinedBlock` under ``node``."""
    for block in operators(node):
        if isinstance(block, Block) and len(block.items) > 1 and not has_full_join(block):
            aliases = [alias for alias, _ in block.items]
            yield JoinedBlock(block, aliases, columns_by_alias(block.template, aliases), equalities(block, aliases))


def join_terms(node: Node, v: Versions) -> tuple[JoinTerm, ...]:
    """Every join-delta term under ``node`` whose change is a stored table's change feed and
    that reaches at least one other stored input by an equality."""
    return tuple(term for joined in joined_blocks(node) for term in _block_terms(joined, v))


def _block_terms(joined: JoinedBlock, v: Versions) -> list[JoinTerm]:
    block, used, found = joined.block, joined.used, joined.equalities
    terms = []
    for i, (alias, node) in enumerate(block.items):
        item = node.keyed()
        scan = node if isinstance(node, Scan) else item.scan if item else None
        if not (scan is not None and scan.changed(v) and block.is_linear_in(i)
                and v.use_cdf.get(scan.name, True) and used.get(alias)):
            continue
        probes = walk(block, i, used, found, lambda item: "new" if item < i else "old")
        if probes:
            terms.append(JoinTerm(block=block, changed=i, source=scan.name,
                                  change_columns=item.columns if item else tuple(sorted(used[alias])),
                                  probes=tuple(probes), aggregated=item is not None))
    return terms


def walk(block: Block, start: int, used: dict[str, set[str]], equalities, which,
         blocked=frozenset()) -> list[Probe]:
    """The probes reaching out from FROM item ``start`` along ``equalities``, in an order
    where each probe's keys are known before it runs (``which(item)``: the version it reads).

    An item that is an aggregate of one table (``dvm/keyed.py``) is probed through that table,
    by the group column an equality names; its rows found are the table's, so a probe by them,
    or a filter on them, names the table's column too.  ``blocked`` items are neither probed
    nor give keys (an outer term probes its changed item apart, once per version)."""
    aliases = [alias for alias, _ in block.items]
    stored = [stored_columns(node) for _, node in block.items]

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
