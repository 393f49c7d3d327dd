"""What a refresh learned before rendering a delta, handed to the operators that read it.

A refresh computes some parts of a delta before the statement that applies it: it reads a
change once, counts an aggregate's touched groups, looks inputs up through arrangements,
checkpoints a recursive CTE's parts.  It binds what it found here, per operator; the operator
tree itself is never changed after planning, and an operator with nothing bound renders its
plain SQL.  Each kind of fact has its own typed entry, so a renderer reads only what was meant
for it, and tests assert on the entries themselves.
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import NamedTuple


class Relation(NamedTuple):
    """Rows a refresh handed to Spark as a temporary view, and the columns it holds."""

    view: str
    columns: tuple[str, ...]


#: FROM item -> the relation holding its rows found.
Relations = dict[int, Relation]


@dataclass(frozen=True)
class GroupRows:
    """The rows an aggregate's touched groups are recomputed from, looked up at both versions."""

    old: Relations
    new: Relations
    #: The relations hold every row of a superset of the touched groups and nothing else: the
    #: recompute needs no filter by the groups -- an unchanged group comes out alike before and
    #: after and cancels -- and the input delta is not computed at all.
    whole: bool = False
    #: The column whose NULL rows were left out (an arrangement holds no NULL key): the recompute
    #: reads that group's rows from the table itself.
    null_rows: str | None = None

    def at(self, which: str) -> Relations:
        return self.old if which == "old" else self.new


@dataclass(frozen=True)
class OuterRows:
    """The relations an outer term (``dvm/outer_terms.py``) looked up: the items both sides
    share, and the changed item's rows at the old and the new versions."""

    shared: Relations
    old: Relations
    new: Relations

    def at(self, which: str) -> Relations:
        return {**self.shared, **(self.old if which == "old" else self.new)}


class Reach(NamedTuple):
    """A recursive CTE's rows reached from a part of its delta, looked up before rendering."""

    view: str
    levels: int | None  # None: not counted (Spark recurses over the rows)


@dataclass(frozen=True)
class Bindings:
    """Facts bound per operator (by identity: operators are not hashable values)."""

    changes: dict[int, str] = field(default_factory=dict)  # a scan -> the view of its change
    parts: dict[tuple[int, str], str] = field(default_factory=dict)  # (recursive CTE, part) -> view
    reach: dict[tuple[int, str], Reach] = field(default_factory=dict)  # (recursive CTE, side) -> reach
    joined: dict[int, str] = field(default_factory=dict)  # a recursive CTE -> its stored rows E's change joins
    touched: dict[int, list[tuple]] = field(default_factory=dict)  # an aggregate -> its touched groups
    groups: dict[int, GroupRows] = field(default_factory=dict)  # an aggregate -> its groups' rows
    probed: dict[tuple[int, int], Relations] = field(default_factory=dict)  # (block, changed item) -> rows
    outer: dict[tuple[int, int], OuterRows] = field(default_factory=dict)  # (block, changed item) -> rows

    def change(self, scan) -> str | None:
        """The view holding ``scan``'s change rows with their weights, if one was read ahead."""
        return self.changes.get(id(scan))

    def with_change(self, scan, view: str) -> Bindings:
        return replace(self, changes={**self.changes, id(scan): view})

    def part(self, node, part: str) -> str | None:
        """The view a refresh computed ``part`` of a recursive CTE's delta into, if it did."""
        return self.parts.get((id(node), part))

    def with_part(self, node, part: str, view: str) -> Bindings:
        return replace(self, parts={**self.parts, (id(node), part): view})

    def reached(self, node, side: str) -> Reach | None:
        """What a recursive CTE's ``side`` ("removed", "added") reached, if it was looked up."""
        return self.reach.get((id(node), side))

    def with_reach(self, node, side: str, reach: Reach) -> Bindings:
        return replace(self, reach={**self.reach, (id(node), side): reach})

    def old_joined(self, node) -> str | None:
        """The view of a recursive CTE's stored rows that E's change can join, if read ahead."""
        return self.joined.get(id(node))

    def with_old_joined(self, node, view: str) -> Bindings:
        return replace(self, joined={**self.joined, id(node): view})

    def touched_groups(self, block) -> list[tuple] | None:
        """The groups an aggregate's input delta touches, as ``(hash, value of each GROUP BY
        expression)``, when a refresh counted them and found them few; None: not known."""
        return self.touched.get(id(block))

    def with_touched_groups(self, block, groups: list[tuple]) -> Bindings:
        return replace(self, touched={**self.touched, id(block): groups})

    def group_rows(self, block) -> GroupRows | None:
        """The rows ``block``'s touched groups are recomputed from, if they were looked up."""
        return self.groups.get(id(block))

    def with_group_rows(self, block, rows: GroupRows) -> Bindings:
        return replace(self, groups={**self.groups, id(block): rows})

    def probed_term(self, block, changed: int) -> Relations | None:
        """The relations looked up for the term of ``block``'s join delta that joins the change
        of FROM item ``changed`` (``dvm/join_terms.py``); the changed item's holds its change
        rows with their weights."""
        return self.probed.get((id(block), changed))

    def with_probed_term(self, block, changed: int, relations: Relations) -> Bindings:
        return replace(self, probed={**self.probed, (id(block), changed): relations})

    def outer_term(self, block, changed: int) -> OuterRows | None:
        """The relations looked up for the outer term of ``block``'s FROM item ``changed``."""
        return self.outer.get((id(block), changed))

    def with_outer_term(self, block, changed: int, rows: OuterRows) -> Bindings:
        return replace(self, outer={**self.outer, (id(block), changed): rows})
