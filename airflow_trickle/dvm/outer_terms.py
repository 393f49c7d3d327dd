"""The terms of a LEFT join's null-supplying side that can be recomputed from lookups.

The term of such an item (``dvm/outer_join.py``) is the chain recomputed before and after for
K, the join-key values of the item's change.  The changed item is probed by K at both
versions; the item holding the other side of the key by K too (the term keeps only rows whose
key is in K), and the inputs reached from it along equalities (``dvm/join_terms.walk``).
"""
from __future__ import annotations

from dataclasses import dataclass

from sqlglot import exp

from airflow_trickle.dvm.base import Node, Versions
from airflow_trickle.dvm.conjuncts import pair_sql, plain_equalities
from airflow_trickle.dvm.join import JoinKind
from airflow_trickle.dvm.join_terms import JoinedBlock, Probe, joined_blocks, walk
from airflow_trickle.dvm.keyed import stored_columns

#: The pseudo FROM item whose rows are an outer term's join-key values (:class:`OuterTerm`).
OUTER_KEYS = -1


@dataclass(frozen=True)
class OuterTerm:
    """The term of ``block``'s join delta for FROM item ``changed``, the null-supplying side of a
    LEFT join, recomputed for K, the join-key values of the item's change.

    Probing by the change's keys -- a superset of K where the item is a keyed aggregate -- is
    exact: the term restricts both sides to K itself.  The key is an ``=`` of the ON, so a NULL
    among the change's keys is left out of the lookups: a row whose key is NULL meets no
    partner, and the preserved rows it would select are output alike before and after,
    cancelling whether both sides hold them or neither does."""

    block: Node
    changed: int
    source: str  # the changed table (the item's, or its aggregate's)
    key: str  # the changed table's column holding the join key
    columns: tuple[str, ...]  # the changed table's columns the item reads
    probes: tuple[Probe, ...]  # the preserved side's by the keys (``by`` is OUTER_KEYS), then onwards

    def changed_probe(self) -> Probe:
        """The lookup of the changed item, by the change's keys (at both versions)."""
        return Probe(item=self.changed, source=self.source, which="", key=self.key, columns=self.columns,
                     by=OUTER_KEYS, by_column=self.key)


def outer_terms(node: Node, v: Versions) -> tuple[OuterTerm, ...]:
    """Every outer term under ``node`` whose changed item is a stored table's change feed (or a
    keyed aggregate of one) joined by a plain column (:class:`OuterTerm`)."""
    return tuple(term for joined in joined_blocks(node) for term in _block_outer_terms(joined, v))


def _block_outer_terms(joined: JoinedBlock, v: Versions) -> list[OuterTerm]:
    block, aliases, used = joined.block, joined.aliases, joined.used
    found = []
    for i, (alias, item) in enumerate(block.items):
        step = block.step(i)
        stored = stored_columns(item)
        if step.kind is not JoinKind.LEFT or stored is None or not item.changed(v) \
                or not v.use_cdf.get(stored.table, True):
            continue
        equal = plain_equalities(block.template.args["joins"][i - 1].args.get("on"))
        pair = next(((o, k) for o, k in zip(step.outer_keys, step.item_keys)
                     if isinstance(k, exp.Column) and k.table == alias
                     and stored.column(k.name) is not None and pair_sql(o, k) in equal), None)
        if pair is None:
            continue
        outer, own = pair
        key = stored.column(own.name)
        probes = []
        j = aliases.index(outer.table) if isinstance(outer, exp.Column) and outer.table in aliases else None
        held = stored_columns(block.items[j][1]) if j is not None else None
        if held is not None and held.column(outer.name) is not None:
            probes.append(Probe(item=j, source=held.table, which="new" if j < i else "old",
                                key=held.column(outer.name), columns=held.columns(used[aliases[j]]),
                                by=OUTER_KEYS, by_column=key))
            probes += walk(block, j, used, joined.equalities, lambda n: "new" if n < i else "old", blocked={i})
        found.append(OuterTerm(block=block, changed=i, source=stored.table, key=key,
                               columns=stored.columns(used[alias]), probes=tuple(probes)))
    return found
