"""The project file's shape as typed models: every key, its type, and the JSON Schema of the file.

``loading.py`` validates a project file against :class:`ProjectFile` before it reads anything:
the shape (known keys, types, choices) is checked here, once, so each mistake becomes one clear
error that names the key, the stream table and the expected form; what needs more than the shape
(SQL, schedules, sources, cycles) is checked by ``loading.py`` afterwards.  Values are strict
because YAML is generous: ``tags: airflow_trickle`` is a string, not fifteen one-letter tags;
``deadline: "no"`` is a string, not false; ``retries: "three"`` is no number.

The same models publish the file's JSON Schema (``trickle schema``, ``docs/project-file.schema.json``)
for editors' completion and for checks in CI.

>>> ProjectFile.model_validate({"project": "p", "stream_tables": [{"name": "s.t", "query": "SELECT 1"}]}).project
'p'
"""
from __future__ import annotations

from datetime import date
from typing import Any, Literal, Optional, Union, get_type_hints

from pydantic import BaseModel, ConfigDict, Field, ValidationError, create_model, field_validator

from airflow_trickle.config import TrickleConfig
from airflow_trickle.errors import ProjectError, ProjectErrors, TrickleError

#: The settings whose values are words from a closed set (any case in the file).
SETTING_CHOICES = {"cdc_mode": ("auto", "cdf", "snapshot"),
                   "default_refresh_mode": ("DIFFERENTIAL", "FULL", "AUTO"),
                   "full_refresh_write": ("auto", "merge", "overwrite")}
REFRESH_MODES = SETTING_CHOICES["default_refresh_mode"]


#: A schedule has at most five fields: a duration, ``on_commit``, ``@daily``, or a five-field
#: cron expression (a sixth field would be read as seconds); empty is CALCULATED.
SCHEDULE_PATTERN = r"^(\s*|\s*\S+(\s+\S+){0,4}\s*)$"
SCHEDULE_FORM = "a duration (30s, 5m, 1h30m), a five-field cron expression, or on_commit"


def _canonical(value, allowed: tuple[str, ...]):
    """``allowed``'s spelling of ``value`` when it names one in any case; else ``value`` as it is
    (the Literal then refuses it, listing the choices)."""
    if isinstance(value, str):
        for word in allowed:
            if value.strip().lower() == word.lower():
                return word
    return value


class _Section(BaseModel):
    # extra keys are typos; strict: no string is taken for a number or a flag
    model_config = ConfigDict(extra="forbid", strict=True)


def _refresh_mode_word(cls, value):
    return _canonical(value, REFRESH_MODES)


def _diamond_word(cls, value):
    return _canonical(value, ("none", "atomic", "fastest", "slowest"))


class _TableDefaults(_Section):
    """The keys a stream table sets, or takes from ``defaults``."""

    schedule: Optional[str] = Field(None, pattern=SCHEDULE_PATTERN, description=SCHEDULE_FORM + "; empty: CALCULATED")
    refresh_mode: Optional[Literal["DIFFERENTIAL", "FULL", "AUTO"]] = None
    diamond_consistency: Optional[Literal["none", "atomic"]] = None
    diamond_schedule_policy: Optional[Literal["fastest", "slowest"]] = None

    _mode = field_validator("refresh_mode", mode="before")(classmethod(_refresh_mode_word))
    _diamond = field_validator("diamond_consistency", "diamond_schedule_policy", mode="before")(
        classmethod(_diamond_word))


class TableEntry(_TableDefaults):
    """One stream table (an item of ``stream_tables``)."""

    name: str = Field(description="qualified name, database.table")
    query: Optional[str] = Field(None, description="the defining query (Spark SQL)")
    query_file: Optional[str] = Field(None, description="a file holding the defining query, relative to the project file")
    freshness: Optional[str] = Field(None, description="how stale the table may get, a duration such as '10m'")
    description: Optional[str] = None
    cluster_by: Optional[Union[list[str], str]] = Field(None, description="the storage's clustering columns")
    options: Optional[dict[str, Any]] = Field(None, description="the table's options, as the Python API's "
                                                                 "create_stream_table(options=...) takes them")


class Defaults(_TableDefaults):
    """Values every stream table takes unless it sets its own."""

    freshness_factor: Optional[float] = Field(None, gt=0, description="a table's freshness target, when it sets "
                                                                      "none, is this many times its period")


class SparkSection(_Section):
    """How refreshes reach Spark."""

    connection: Optional[str] = Field(None, description="the Airflow connection (spark_connect or spark)")
    conn_id: Optional[str] = Field(None, description="the older name of 'connection'")
    submit: Optional[bool] = None
    conf: Optional[dict[str, Union[str, int, float, bool]]] = None
    deploy_mode: Optional[str] = None
    driver_memory: Optional[str] = None
    executor_memory: Optional[str] = None
    num_executors: Optional[int] = Field(None, ge=1)


class OnCommit(_Section):
    """How the commit watcher of ``schedule: on_commit`` tables polls and coalesces."""

    poll_interval: Optional[Union[str, float]] = None
    debounce: Optional[Union[str, float]] = None
    max_wait: Optional[Union[str, float]] = None


class AirflowSection(_Section):
    """How the generated DAG looks to Airflow."""

    dag_id: Optional[str] = None
    schedule: Optional[str] = Field(None, pattern=SCHEDULE_PATTERN, description="the DAG's tick: " + SCHEDULE_FORM
                                    + ", or none for manual runs only; default: the shortest period")
    pool: Optional[str] = None
    tags: Optional[list[str]] = None
    freshness_notifier: Any = Field(None, description="dotted path of a callable called on a freshness miss")
    deadline: Optional[bool] = None
    deadline_callback: Optional[str] = None
    max_active_runs: Optional[int] = Field(None, ge=1)
    retries: Optional[int] = Field(None, ge=0)
    retry_delay: Optional[str] = Field(None, description="a duration such as '30s'")
    start_date: Optional[Union[str, date]] = None
    maintenance: Optional[str] = Field(None, pattern=SCHEDULE_PATTERN,
                                       description="the maintenance DAG's schedule; none: no maintenance DAG")
    maintenance_retention_hours: Optional[float] = Field(None, ge=0)
    notes_connection: Optional[str] = None
    on_commit: Optional[OnCommit] = None


class DeploySection(_Section):
    """What a changed project file does to the warehouse (``trickle plan`` / ``apply``, and the DAG)."""

    on_change: Literal["apply", "stop"] = Field(
        "apply", description="the DAG's plan task: 'apply' creates and ALTERs as the file says; 'stop' fails the "
                             "run with the plan, for `trickle apply` to carry out")
    prune: bool = Field(False, description="drop stream tables this project owns that the file no longer declares")


def _settings_model() -> type[BaseModel]:
    """``settings``: every :class:`~airflow_trickle.config.TrickleConfig` field but the warehouse
    and the Spark service's own (its address and its token: set where the service runs, and a
    secret has no place in a file kept in git), typed as the configuration types it; choices
    (``cdc_mode``) as closed sets of words."""
    hints = get_type_hints(TrickleConfig)
    fields: dict[str, Any] = {}
    for name, kind in hints.items():
        if name in ("warehouse", "service_bind_address", "service_token"):
            continue
        if name in SETTING_CHOICES:
            kind = Literal[SETTING_CHOICES[name]]  # type: ignore[valid-type]
        fields[name] = (Optional[kind], None)

    def canonical(cls, value, info):
        return _canonical(value, SETTING_CHOICES[info.field_name])

    return create_model("Settings", __base__=_Section, __doc__="Engine settings (docs/configuration.md).",
                        __validators__={"_choices": field_validator(*SETTING_CHOICES, mode="before")(canonical)},
                        **fields)


Settings = _settings_model()


class ProjectSections(_Section):
    """A project file's sections; its stream tables are checked one by one (:func:`checked_entry`),
    so the mistakes of several tables are reported together."""

    project: str = Field(description="the project's name; it owns the stream tables it declares")
    warehouse: Optional[str] = Field(None, description="a path or URI; default $TRICKLE_WAREHOUSE")
    sources: Optional[list[str]] = Field(None, description="the tables the queries may read besides the "
                                                           "project's own stream tables")
    defaults: Optional[Defaults] = None
    settings: Optional[Settings] = None  # type: ignore[valid-type]
    spark: Optional[SparkSection] = None
    airflow: Optional[AirflowSection] = None
    deploy: Optional[DeploySection] = None
    stream_tables: list[Any] = Field(min_length=1)


class ProjectFile(ProjectSections):
    """A project file: the stream tables one Airflow DAG keeps fresh (``docs/airflow.md``)."""

    model_config = ConfigDict(extra="forbid", strict=True, title="airflow_trickle project file")

    stream_tables: list[TableEntry] = Field(min_length=1)


def json_schema() -> dict:
    """The JSON Schema of a project file (what ``trickle schema`` prints)."""
    schema = ProjectFile.model_json_schema()
    schema["$schema"] = "https://json-schema.org/draft/2020-12/schema"
    return schema


def checked_sections(data: dict) -> dict:
    """``data``'s sections validated (its stream tables only as a non-empty list), as plain
    values; every problem reported at once, each naming its key."""
    try:
        return ProjectSections.model_validate(data).model_dump(exclude_unset=True)
    except ValidationError as err:
        _raise([_problem(error) for error in err.errors()], str(data.get("project") or "?"))


def checked_entry(entry, index: int) -> dict:
    """One item of ``stream_tables`` validated, as plain values (the keys it sets)."""
    name = entry.get("name") if isinstance(entry, dict) else None
    table = name if isinstance(name, str) and name.strip() else None
    try:
        return TableEntry.model_validate(entry).model_dump(exclude_unset=True)
    except ValidationError as err:
        where = () if table else ("stream_tables", index)
        problems = [_problem({**error, "loc": (*where, *error["loc"])}, table) for error in err.errors()]
    if len(problems) == 1:
        raise problems[0]
    raise ProjectError("; ".join(p.cause for p in problems), stream_table=table)  # one table, one error


def _raise(problems: list[TrickleError], project: str):
    if len(problems) == 1:
        raise problems[0]
    raise ProjectErrors(project, problems)


def _problem(error: dict, table: str | None = None) -> ProjectError:
    """One pydantic error as a :class:`ProjectError`: ``airflow.tags must be ..., not 'x'``."""
    loc = [part for part in error["loc"] if not _is_branch(part)]
    key = ".".join(f"[{p}]" if isinstance(p, int) else str(p) for p in loc).replace(".[", "[")
    message = (f"must be {EXPECTED[key]}" if key in EXPECTED else "must be a mapping of keys to values"
               if error["type"] in ("model_type", "dict_type") else f"must be {SCHEDULE_FORM}"
               if error["type"] == "string_pattern_mismatch" else error["msg"].replace("Input should be", "must be"))
    if error["type"] == "missing":
        return ProjectError(f"{key} is required", stream_table=table)
    if error["type"] == "extra_forbidden":
        return ProjectError(f"unknown key '{key}'", stream_table=table,
                            hint="see docs/airflow.md or `trickle schema` for the keys of a project file")
    if error["type"] == "too_short":
        return ProjectError(f"{key} must not be empty", stream_table=table)
    return ProjectError(f"{key} {message}, not {error.get('input')!r}", stream_table=table)


#: The expected form of a key, where pydantic's words ("a valid list") say too little.
EXPECTED = {"airflow.tags": "a list of tags, such as [airflow_trickle, shop]",
            "airflow.deadline": "true or false", "airflow.retries": "a whole number (0 or more)",
            "airflow.maintenance_retention_hours": "a number of hours (0 or more)",
            "airflow.max_active_runs": "a whole number (1 or more)", "spark.submit": "true or false",
            "sources": "a list of table names", "defaults.freshness_factor": "a positive number"}


def _is_branch(part) -> bool:
    """Whether a part of an error's location names the branch of a union pydantic tried
    (``str``, ``list[str]``, ``function-before[...]``) rather than a key."""
    return isinstance(part, str) and ("[" in part or part in ("str", "int", "float", "bool", "date"))
