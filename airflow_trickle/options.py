"""A stream table's own settings (``options``), parsed once, when its definition is validated.

Options arrive as a mapping from many places -- ``create_stream_table(options=...)``, a project
YAML, an ALTER, the catalog row -- and are read by the refresh, the DAG factory and the UI page.
They are checked once, here, into a frozen :class:`TableOptions` whose fields the readers use:
an unknown key (a typo would silently do nothing) or a bad value is refused with the table's
name.  Only the keys a user set are kept (:meth:`TableOptions.to_dict`), so an unset ratio keeps
following the deployment's setting, and a catalog row holds what the user wrote.
"""
from __future__ import annotations

from dataclasses import dataclass, fields, replace

from airflow_trickle.model import Choice


class DiamondConsistency(Choice):
    """How the members of a diamond are refreshed: each on its own, or all in one task."""

    NONE = "none"
    ATOMIC = "atomic"


class DiamondSchedulePolicy(Choice):
    """Which convergence point's schedule an atomic group follows."""

    FASTEST = "fastest"
    SLOWEST = "slowest"


class Placement(Choice):
    """Where a table's rows may go during its refresh (``refresh/plan.py``)."""

    AUTO = "auto"
    SPARK = "spark"


class FullRefreshWrite(Choice):
    """How a FULL refresh writes its rows (``refresh/writers.py``)."""

    AUTO = "auto"
    MERGE = "merge"
    OVERWRITE = "overwrite"


def _positive_number(value) -> float:
    if isinstance(value, (int, float)) and not isinstance(value, bool) and value > 0:
        return value
    raise ValueError


_TRUE, _FALSE = ("true", "1", "yes", "on"), ("false", "0", "no", "off")


def _flag(value) -> bool:
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text in _TRUE + _FALSE:
        return text in _TRUE
    raise ValueError


def _column_list(value) -> tuple[str, ...]:
    """Column names: a list, or one string of names separated by commas; empty (or ``none``)
    for none at all (an ALTER that turns clustering off)."""
    if isinstance(value, str):
        names = [] if value.strip().lower() == "none" else [part.strip() for part in value.split(",")]
    elif isinstance(value, (list, tuple)) and all(isinstance(part, str) for part in value):
        names = [part.strip() for part in value]
    else:
        raise ValueError
    if any(not name for name in names) or len({n.lower() for n in names}) < len(names):
        raise ValueError
    return tuple(names)


def _choice(kind):
    def parse(value):
        for member in kind:
            if member.value == str(value).strip().lower():
                return member
        raise ValueError
    return parse


#: Each option: what it must be (for the message) and how its value is parsed.
_PARSERS = {
    "diamond_consistency": ("'none' or 'atomic'", _choice(DiamondConsistency)),
    "diamond_schedule_policy": ("'fastest' or 'slowest'", _choice(DiamondSchedulePolicy)),
    "freshness_seconds": ("a positive number of seconds", _positive_number),
    "differential_max_change_ratio": ("a positive number", _positive_number),
    "differential_max_touched_ratio": ("a positive number", _positive_number),
    "differential_max_time_ratio": ("a positive number", _positive_number),
    "full_refresh_write": ("'auto', 'merge' or 'overwrite'", _choice(FullRefreshWrite)),
    "strict": ("true or false", _flag),
    "cluster_by": ("a list of distinct output column names (or none)", _column_list),
    "placement": ("'auto' or 'spark'", _choice(Placement)),
}

#: The option names, in the order the docs list them.
OPTION_NAMES = tuple(_PARSERS)


@dataclass(frozen=True)
class TableOptions:
    """A stream table's options; None where the user set nothing (the default, or the
    deployment's setting, applies).

    >>> options = TableOptions.parse({"strict": "yes", "diamond_consistency": "atomic"}, stream_table="s.t")
    >>> options.is_strict, options.is_atomic, options.to_dict()
    (True, True, {'diamond_consistency': 'atomic', 'strict': True})
    >>> TableOptions.parse({"stirct": True}, stream_table="s.t")
    Traceback (most recent call last):
    ...
    airflow_trickle.errors.DefinitionError: stream table 's.t': unknown option 'stirct' (the options are diamond_consistency, diamond_schedule_policy, freshness_seconds, differential_max_change_ratio, differential_max_touched_ratio, differential_max_time_ratio, full_refresh_write, strict, cluster_by, placement)
    >>> TableOptions.parse({"cluster_by": "customer_id, day"}, stream_table="s.t").to_dict()
    {'cluster_by': ['customer_id', 'day']}
    """

    diamond_consistency: DiamondConsistency | None = None
    diamond_schedule_policy: DiamondSchedulePolicy | None = None
    freshness_seconds: float | None = None
    differential_max_change_ratio: float | None = None
    differential_max_touched_ratio: float | None = None
    differential_max_time_ratio: float | None = None
    full_refresh_write: FullRefreshWrite | None = None
    strict: bool | None = None
    #: The storage table's clustering columns (Delta liquid clustering); () for none, set by an
    #: ALTER that turns it off.
    cluster_by: tuple[str, ...] | None = None
    #: ``spark``: nothing of the table's rows goes through the refreshing process (no lookups
    #: through arrangements, no delta-rs commits); ``auto``: the planner's bounds decide.
    placement: Placement | None = None

    @classmethod
    def parse(cls, options: "dict | TableOptions | None", *, stream_table: str | None) -> "TableOptions":
        """The options of ``options`` (a mapping), checked; a clear error names the table."""
        from airflow_trickle.errors import DefinitionError

        if options is None:
            return cls()
        if isinstance(options, TableOptions):
            return options
        if not isinstance(options, dict):
            raise DefinitionError(f"options must be a mapping of option names to values, not {options!r}",
                                  stream_table=stream_table)
        unknown = sorted(str(key) for key in options if key not in _PARSERS)
        if unknown:
            raise DefinitionError(f"unknown option{'s' if len(unknown) > 1 else ''} {', '.join(map(repr, unknown))}",
                                  stream_table=stream_table, hint=f"the options are {', '.join(OPTION_NAMES)}")
        values = {}
        for key, value in options.items():
            if value is None:
                continue
            wanted, parse = _PARSERS[key]
            try:
                values[key] = parse(value)
            except (ValueError, TypeError):
                raise DefinitionError(f"option {key!r} must be {wanted}, not {value!r}",
                                      stream_table=stream_table) from None
        return cls(**values)

    def to_dict(self) -> dict:
        """The options the user set, as plain JSON values (a catalog row, a definition record)."""
        data = {}
        for f in fields(self):
            value = getattr(self, f.name)
            if value is not None:
                data[f.name] = (value.value if isinstance(value, Choice)
                                 else list(value) if isinstance(value, tuple) else value)
        return data

    def merged(self, other: "TableOptions") -> "TableOptions":
        """These options with every option ``other`` sets taken from it (an ALTER)."""
        return replace(self, **{f.name: getattr(other, f.name) for f in fields(other)
                                if getattr(other, f.name) is not None})

    def __bool__(self) -> bool:
        return bool(self.to_dict())

    @property
    def is_strict(self) -> bool:
        """Whether the table never falls back to FULL (``strict``)."""
        return bool(self.strict)

    @property
    def is_atomic(self) -> bool:
        """Whether the table, a convergence point, has its diamond refreshed in one task."""
        return self.diamond_consistency is DiamondConsistency.ATOMIC

    @property
    def schedule_policy(self) -> DiamondSchedulePolicy:
        return self.diamond_schedule_policy or DiamondSchedulePolicy.FASTEST

    def ratio(self, name: str, config) -> float:
        """A cost-model ratio: the table's own, else the deployment's (``config``)."""
        own = getattr(self, name)
        return float(own if own is not None else getattr(config, name))

    @property
    def clustering(self) -> tuple[str, ...]:
        """The storage table's clustering columns as the user named them (none: ())."""
        return self.cluster_by or ()

    def full_write(self, config) -> FullRefreshWrite:
        """How a FULL refresh writes: the table's own choice, else the deployment's."""
        return self.full_refresh_write or FullRefreshWrite(str(config.full_refresh_write).lower())
