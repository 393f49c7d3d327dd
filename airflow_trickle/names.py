"""Names: tables (``[database.]table``, normalised to lower-case ``database.table``), storage
locations, and the key of a refresh's commit metadata."""
from __future__ import annotations

import json

import re

from airflow_trickle.errors import InvalidNameError
from airflow_trickle.model import HIDDEN_PREFIX

DEFAULT_DATABASE = "default"
#: The key of a refresh's record in a Delta commit's metadata (``userMetadata``).
COMMIT_KEY = "airflow_trickle"
_PART = r"[A-Za-z_][A-Za-z0-9_]*"
_NAME = re.compile(rf"^(?:(?P<db>{_PART})\.)?(?P<table>{_PART})$")


def commit_user_metadata(metadata: dict) -> str:
    """The ``userMetadata`` a commit of ours carries: ``metadata`` under :data:`COMMIT_KEY`, as
    JSON -- one rendering, whichever engine commits (Spark or delta-rs)."""
    return json.dumps({COMMIT_KEY: metadata}, sort_keys=True, default=str)


def qualify_name(name: str, *, database: str = DEFAULT_DATABASE) -> str:
    """``Orders`` -> ``default.orders``; ``shop.Orders`` -> ``shop.orders``; anything else raises."""
    match = _NAME.match(str(name).strip()) if name else None
    if not match:
        raise InvalidNameError(
            f"invalid table name {name!r}", hint="use [database.]table with letters, digits and underscores"
        )
    if match["table"].lower().startswith(HIDDEN_PREFIX):
        raise InvalidNameError(f"table names may not start with {HIDDEN_PREFIX!r}: {name!r}")
    return f"{(match['db'] or database).lower()}.{match['table'].lower()}"


def split_name(qualified: str) -> tuple[str, str]:
    database, table = qualified.split(".", 1)
    return database, table


def quote_name(qualified: str) -> str:
    """``shop.orders`` -> ```shop`.`orders```, for Spark SQL text."""
    return ".".join(f"`{part}`" for part in split_name(qualified))


def quote_identifier(identifier: str) -> str:
    """A column, database or path as one Spark SQL identifier: in backticks, backticks doubled."""
    return "`" + identifier.replace("`", "``") + "`"


def quote_string(text: str) -> str:
    """A Spark SQL string literal holding ``text`` exactly (backslashes and quotes escaped)."""
    return "'" + text.replace("\\", "\\\\").replace("'", "\\'") + "'"


def normalize_location(location: str) -> str:
    """``file:/tmp/x`` (as Spark reports it) -> ``/tmp/x``; other URIs unchanged."""
    if location.startswith("file://"):
        return location[len("file://"):]
    if location.startswith("file:"):
        return location[len("file:"):]
    return location
