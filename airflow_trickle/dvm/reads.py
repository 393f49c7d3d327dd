"""What a refresh's statement reads: every read of a source, by version, and whether the change's
keys restrict it -- the figures behind "a delta that joins a change with a large input scans it".

A pure pass over the statement's sqlglot tree (no Spark).  A read is one table reference:

* ``change feed`` -- ``TABLE_CHANGES(name, from, to)``: the rows that changed, small;
* ``version N`` -- ``name VERSION AS OF N``, a source's state at one end of the window;
* ``stored`` -- a table named without a version (the stream table itself, read by a MERGE).

A state read is **reduced** when a SELECT around it keeps only the rows among keys computed from
a change (a ``LEFT SEMI`` join, or a ``WHERE … IN (subquery)``) and it is not itself part of
computing those keys; Spark still scans the input for it, but what is joined further is the few
rows the change reaches.  A read **scanned whole** carries every row into its join (the change's side of an inner join
is broadcast, so that join still reads the whole input).  Delta's file
skipping cannot narrow either for keys spread over the table (``benchmarks/README.md``).
These are the reads the SQL names, an upper bound on Spark's scans: two reads that feed
identical exchanges run once (``spark.sql.exchange.reuse``).

    >>> sql = ("SELECT * FROM (SELECT a FROM s.o VERSION AS OF 3) o LEFT SEMI JOIN "
    ...        "(SELECT a AS k FROM TABLE_CHANGES('s.c', 4, 5)) AS __trickle_keys ON o.a <=> __trickle_keys.k "
    ...        "UNION ALL SELECT a FROM s.o VERSION AS OF 3")
    >>> for line in describe(statement_reads(sql)):
    ...     print(line)
    s.c change feed 4..5: 1 read
    s.o version 3: 2 reads (1 reduced by the change's keys, 1 scanned whole)
"""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from enum import StrEnum

import sqlglot
from sqlglot import exp

from airflow_trickle.sql.parse import DIALECT


class ReadKind(StrEnum):
    CHANGE_FEED = "change feed"
    VERSION = "version"
    STORED = "stored"


@dataclass(frozen=True)
class Read:
    """One table reference of a statement."""

    table: str
    kind: ReadKind
    #: ``"3"`` for a version, ``"4..5"`` for a change feed, ``""`` for the stored table.
    at: str
    #: Whether the change's keys restrict the rows this read carries into its joins.
    reduced: bool

    @property
    def what(self) -> str:
        """``s.o version 3``, ``s.o change feed 4..5``, ``s.st stored``."""
        return f"{self.table} {self.kind} {self.at}".rstrip()


def statement_reads(sql: str) -> list[Read]:
    """Every source read of the statement ``sql`` (Spark SQL), in the order they appear."""
    tree = sqlglot.parse_one(sql, read=DIALECT)
    reads = []
    for table in tree.find_all(exp.Table):
        read = _read(table)
        if read is not None:
            reads.append(Read(read[0], read[1], read[2], reduced=read[1] is not ReadKind.CHANGE_FEED and _reduced(table)))
    return reads


def describe(reads: list[Read]) -> list[str]:
    """One line per distinct read: how often the statement makes it and, for a state, whether the
    change's keys restrict it or it is scanned whole into its joins."""
    counts = Counter(r.what for r in reads)
    reduced = Counter(r.what for r in reads if r.reduced)
    kinds = {r.what: r.kind for r in reads}
    lines = []
    for what in sorted(counts):
        n, k = counts[what], reduced[what]
        line = f"{what}: {n} read{'s' if n != 1 else ''}"
        if kinds[what] is not ReadKind.CHANGE_FEED:
            parts = ([f"{k} reduced by the change's keys"] if k else []) + ([f"{n - k} scanned whole"] if n - k else [])
            line += " (" + (", ".join(parts) if n > 1 else parts[0][2:]) + ")"
        lines.append(line)
    return lines


def _read(table: exp.Table) -> tuple[str, ReadKind, str] | None:
    """``(name, kind, at)`` of a table reference; None for a view the statement defines itself
    (a CTE, or a relation the refresh registered: ``__trickle_…``)."""
    if isinstance(table.this, exp.Anonymous) and table.this.name.upper() == "TABLE_CHANGES":
        name, start, end = (a.name for a in table.this.expressions[:3])
        return name, ReadKind.CHANGE_FEED, f"{start}..{end}"
    if not isinstance(table.this, exp.Identifier) or table.name.startswith("__trickle"):
        return None
    name = ".".join(part.name for part in table.parts)
    if not table.db and _is_cte(table):
        return None
    version = table.args.get("version")
    if version is not None:
        return name, ReadKind.VERSION, version.expression.name
    return name, ReadKind.STORED, ""


def _is_cte(table: exp.Table) -> bool:
    node = table.parent
    while node is not None:
        with_ = node.args.get("with") if isinstance(node, exp.Query) else None
        if with_ is not None and any(cte.alias == table.name for cte in with_.expressions):
            return True
        node = node.parent
    return False


def _reduced(table: exp.Table) -> bool:
    """Whether a SELECT around ``table`` restricts its rows by keys that ``table`` does not
    itself help compute."""
    path = {id(table)}
    node = table
    while node.parent is not None:
        node = node.parent
        path.add(id(node))
        if isinstance(node, exp.Select):
            restrictions = _restrictions(node)
            if any(id(r) in path for r in restrictions):
                return False  # ``table`` is read to compute the keys, the keys do not restrict it
            if restrictions:
                return True
    return False


def _restrictions(select: exp.Select) -> list[exp.Expression]:
    """The key sets a SELECT keeps its rows among: its ``LEFT SEMI`` joins' relations and the
    subqueries of its WHERE's ``IN``s (not those of a nested SELECT)."""
    found = [join.this for join in select.args.get("joins") or [] if join.args.get("kind") == "SEMI"]
    where = select.args.get("where")
    if where is not None:
        for in_ in where.find_all(exp.In):
            query = in_.args.get("query")
            if query is not None and in_.find_ancestor(exp.Select) is select:
                found.append(query)
    return found
