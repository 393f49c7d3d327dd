"""The words every layer shares: modes, actions, statuses, the storage layout, hidden columns.

Values cross many hops -- the trigger form, the CLI, the API, a spark-submit argv, the engine,
the catalog -- so they are defined once here and checked once, at the edge where a user typed
them (:meth:`Choice.parse`).  The enums are ``StrEnum``: a member *is* its text, so catalog rows,
JSON and log lines carry plain words and compare equal to them.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from enum import StrEnum


class Choice(StrEnum):
    """A closed set of words, parsed case-insensitively with one error message for all of them."""

    @classmethod
    def parse(cls, value, *, what: str, stream_table: str | None = None, error=None):
        """The member ``value`` names (any case, surrounding blanks ignored), or a clear error.

        >>> RunMode.parse(" full ", what="refresh mode")
        <RunMode.FULL: 'FULL'>
        """
        if isinstance(value, cls):
            return value
        text = str(value if value is not None else "").strip()
        for member in cls:
            if member.value.lower() == text.lower():
                return member
        if error is None:
            from airflow_trickle.errors import InvalidRefreshModeError as error
        raise error(f"invalid {what} {value!r}", stream_table=stream_table, hint=f"use one of {cls.choices()}")

    @classmethod
    def choices(cls) -> str:
        """``A, B or C``: the accepted words, for messages."""
        words = [m.value for m in cls]
        return words[0] if len(words) == 1 else f"{', '.join(words[:-1])} or {words[-1]}"


class RefreshMode(Choice):
    """How a stream table is maintained, as its definition asks."""

    DIFFERENTIAL = "DIFFERENTIAL"
    FULL = "FULL"
    AUTO = "AUTO"  # differential where the query allows it, FULL otherwise


class RunMode(Choice):
    """What one refresh (manual or scheduled) asks for; AUTO lets the engine choose."""

    AUTO = "AUTO"
    FULL = "FULL"
    DIFFERENTIAL = "DIFFERENTIAL"
    REINITIALIZE = "REINITIALIZE"

    @property
    def requested(self) -> "RunMode | None":
        """The mode forced on the engine: None for AUTO."""
        return None if self is RunMode.AUTO else self


class Action(Choice):
    """What a refresh did (or, for the last two, what a history row records)."""

    NO_DATA = "NO_DATA"
    FULL = "FULL"
    DIFFERENTIAL = "DIFFERENTIAL"
    REINITIALIZE = "REINITIALIZE"
    SKIP = "SKIP"
    RESTORE = "RESTORE"  # an atomic group's member put back after a failed attempt
    NONE = "NONE"  # failed before an action was chosen
    SUSPEND = "SUSPEND"
    FRESHNESS_MISS = "FRESHNESS_MISS"
    CHANGE_FEED = "CHANGE_FEED"  # a source's change feed is at risk for this reader (``health.py``)


class Outcome(Choice):
    """The status of a refresh (a history row's ``status``)."""

    COMPLETED = "COMPLETED"
    SKIPPED = "SKIPPED"
    FAILED = "FAILED"
    ALERT = "ALERT"


class Status(Choice):
    """A stream table's status: ACTIVE refreshes; SUSPENDED (by a user) and ERROR (after repeated
    failures) skip until set ACTIVE again."""

    ACTIVE = "ACTIVE"
    SUSPENDED = "SUSPENDED"
    ERROR = "ERROR"


class SourceType(Choice):
    """What a stream table reads: a base table, or another stream table (read at its refreshes)."""

    TABLE = "TABLE"
    STREAM_TABLE = "STREAM_TABLE"


class CdcMode(Choice):
    """How a source's changes are read."""

    AUTO = "auto"
    CDF = "cdf"
    SNAPSHOT = "snapshot"


class Identity(Choice):
    """How a stored row is identified: by content and copy number (bag) or by group key (keyed)."""

    BAG = "bag"
    KEYED = "keyed"


class Strategy(Choice):
    """How a DIFFERENTIAL refresh applies its delta (``dvm/apply.py``)."""

    BAG = "bag"
    ALGEBRAIC = "algebraic"
    RECOMPUTE = "recompute"


# -- hidden columns -----------------------------------------------------------------------------

#: Prefix of every column airflow_trickle adds to a storage table; user columns may not use it.
HIDDEN_PREFIX = "__trickle_"
#: The row's identity: a NULL-safe xxhash64 of the whole row (bag) or of the group key (keyed).
ROW_ID = "__trickle_row_id"
#: The copy number among the copies of a duplicated row (1 when keyed).
DUP = "__trickle_dup"
#: The signed multiplicity of a delta row (never stored).
WEIGHT = "__trickle_w"
#: State of an algebraic aggregate: the group's row count.
COUNT = "__trickle_count"


class StateRole(Choice):
    """What a state column of aggregate *i* holds."""

    N = "n"  # COUNT(x): non-NULL inputs
    S = "s"  # SUM(x)
    M = "m"  # MIN(x) or MAX(x)


_STATE = re.compile(rf"^{HIDDEN_PREFIX}(?P<role>[nsm])(?P<index>\d+)$")


def state_column(role: StateRole, index: int) -> str:
    """The name of the state column of aggregate ``index`` with ``role``.

    >>> state_column(StateRole.S, 3)
    '__trickle_s3'
    """
    return f"{HIDDEN_PREFIX}{StateRole(role).value}{index}"


def parse_state_column(name: str) -> tuple[StateRole, int] | None:
    """``(role, aggregate index)`` of a per-aggregate state column; None for the row count and
    any other column.

    >>> parse_state_column("__trickle_m12")
    (<StateRole.M: 'm'>, 12)
    """
    match = _STATE.match(name)
    return (StateRole(match["role"]), int(match["index"])) if match else None


# -- the storage layout -------------------------------------------------------------------------

@dataclass
class StorageLayout:
    """How a stream table's rows are stored, kept in its catalog row.

    ``state`` are the hidden state columns ``(name, Spark type)`` after the visible ones, and
    ``state_exprs`` the aggregate computing each from the defining query's input (algebraic
    strategy only).  ``dup_type`` is ``bigint`` for tables created since copies are numbered per
    refresh and ``int`` for older ones (whose catalog rows record none).
    """

    identity: Identity = Identity.BAG
    strategy: Strategy | None = Strategy.BAG  # None: not maintained differentially (FULL)
    state: list[tuple[str, str]] = field(default_factory=list)
    state_exprs: list[tuple[str, str]] = field(default_factory=list)
    #: The visible output columns ``(name, Spark type)``.
    columns: list[tuple[str, str]] = field(default_factory=list)
    #: Why DIFFERENTIAL cannot maintain the query (empty when it can).
    blockers: list[str] = field(default_factory=list)
    dup_type: str = "bigint"

    @property
    def is_keyed(self) -> bool:
        return self.identity == Identity.KEYED

    def hidden_columns(self) -> list[tuple[str, str]]:
        """The hidden columns in table order: identity, copy number, state."""
        return [(ROW_ID, "bigint"), (DUP, self.dup_type)] + list(self.state)

    def state_names(self) -> list[str]:
        return [name for name, _ in self.state]

    def to_dict(self) -> dict:
        data = {"identity": self.identity.value, "state": [list(s) for s in self.state],
                "columns": [list(c) for c in self.columns], "blockers": list(self.blockers),
                "dup_type": self.dup_type}
        if self.strategy is not None:
            data["strategy"] = self.strategy.value
        if self.state_exprs:
            data["state_exprs"] = [list(s) for s in self.state_exprs]
        return data

    @classmethod
    def from_dict(cls, data: "dict | StorageLayout | None") -> "StorageLayout":
        """The layout a catalog row records (older rows may lack keys: their defaults apply)."""
        if isinstance(data, StorageLayout):
            return data
        data = data or {}
        strategy = data.get("strategy")
        return cls(identity=Identity(data.get("identity", "bag")),
                   strategy=Strategy(strategy) if strategy else None,
                   state=[tuple(s) for s in data.get("state", [])],
                   state_exprs=[tuple(s) for s in data.get("state_exprs", [])],
                   columns=[tuple(c) for c in data.get("columns") or []],
                   blockers=list(data.get("blockers", [])),
                   dup_type=data.get("dup_type", "int"))
