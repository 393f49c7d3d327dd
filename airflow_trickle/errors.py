"""One exception hierarchy for everything airflow_trickle raises on purpose.

Every message names the stream table it concerns (when there is one) and the
cause, and where it helps, what to do about it.  Callers that want to handle a
whole family catch the family (``DefinitionError``), never a message string.
"""
from __future__ import annotations


class TrickleError(Exception):
    """Base of every error raised by airflow_trickle."""

    def __init__(self, message: str, *, stream_table: str | None = None, hint: str | None = None):
        self.stream_table = stream_table
        self.cause = message
        self.hint = hint
        text = f"stream table '{stream_table}': {message}" if stream_table else message
        if hint:
            text = f"{text} ({hint})"
        super().__init__(text)


class DefinitionError(TrickleError):
    """A stream table definition is invalid; raised before anything is created."""


class InvalidNameError(DefinitionError):
    """A table name is not of the form ``[database.]table``."""


class InvalidQueryError(DefinitionError):
    """The defining query does not parse or does not analyse in Spark."""


class UnknownSourceError(DefinitionError):
    """The defining query reads a table that does not exist."""


class AlreadyExistsError(DefinitionError):
    """A stream table or a table of that name already exists."""


class CycleError(DefinitionError):
    """The definition would make stream tables depend on themselves."""

    def __init__(self, message: str, *, cycle: list[str], stream_table: str | None = None, hint: str | None = None):
        self.cycle = cycle
        super().__init__(message, stream_table=stream_table, hint=hint)


class InvalidScheduleError(DefinitionError):
    """A schedule is neither a duration (``30s``, ``5m``, ``1h30m``) nor a cron expression."""


class InvalidRefreshModeError(DefinitionError):
    """A refresh mode or status value is not one of the accepted words."""


class UnsupportedConstructError(DefinitionError):
    """The query uses a construct that cannot be maintained in the requested mode."""

    def __init__(self, message: str, *, construct: str, stream_table: str | None = None, hint: str | None = None):
        self.construct = construct
        super().__init__(message, stream_table=stream_table, hint=hint)


class ProjectError(DefinitionError):
    """A project file (or its Python form) is malformed: a missing field, a bad value, an unreadable file."""


class ProjectErrors(ProjectError):
    """Several stream tables of a project are wrong: all of them are reported at once (``errors``),
    each naming its stream table, so that one edit fixes them all."""

    def __init__(self, project: str, errors: list[TrickleError]):
        self.errors = list(errors)
        lines = "\n".join(f"  - {err}" for err in self.errors)
        super().__init__(f"project {project!r} has {len(self.errors)} problems:\n{lines}")


class InvalidParameterError(TrickleError):
    """A manual-run parameter (tables, mode, include flags) is not acceptable."""


class StreamTableNotFoundError(TrickleError):
    """No stream table of that name is registered."""


class RefreshError(TrickleError):
    """A refresh failed; the stream table keeps its previous contents."""


class CatalogError(TrickleError):
    """The catalog could not be read or written (for example, conflicts kept recurring)."""
