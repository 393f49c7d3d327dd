"""Where a warehouse and its tables live: a URI and the options that reach it.

A :class:`Location` is the one storage setting every layer passes on: the warehouse's, and --
through :meth:`Location.at` -- each table's under it, with the same options.  delta-rs reads
and commits with :attr:`Location.options`; the Spark side gets the same settings as Hadoop's
``fs.s3a.*`` (:func:`spark_settings`); listing, removal and the writer lease
(``storage/lease.py``) go through the object store itself (obstore, the Python face of the
``object_store`` crate delta-rs is built on), never ``os.listdir`` on an object-store warehouse.

Options use the ``object_store`` names delta-rs documents (``aws_endpoint``,
``aws_access_key_id``, ``aws_secret_access_key``, ``aws_region``, ``aws_allow_http``, ...);
the spellings users bring from the AWS tools (``AWS_ENDPOINT_URL``, ``endpoint_url``,
``region``) are accepted and renamed (:func:`normalize_options`).  Credentials left out come from
the standard AWS environment variables in both engines.  Secrets never leave this object in
clear: ``repr`` and :meth:`Location.redacted` mask them.
"""
from __future__ import annotations

import os
import re
import shutil
from dataclasses import dataclass, field
from functools import cached_property
from typing import Mapping
from urllib.parse import urlparse

#: URI schemes of object stores; ``s3a`` (Hadoop's name) is S3.
S3_SCHEMES = ("s3", "s3a")
#: Schemes passed through to both engines untested (documented so).
PASSED_THROUGH_SCHEMES = ("abfss", "abfs", "az", "gs", "gcs")

#: Option names users bring from the AWS tools -> the ``object_store`` names.
_ALIASES = {
    "aws_endpoint_url": "aws_endpoint", "endpoint_url": "aws_endpoint", "endpoint": "aws_endpoint",
    "aws_default_region": "aws_region", "region": "aws_region",
    "access_key_id": "aws_access_key_id", "secret_access_key": "aws_secret_access_key",
    "session_token": "aws_session_token", "aws_token": "aws_session_token", "token": "aws_session_token",
    "allow_http": "aws_allow_http", "virtual_hosted_style_request": "aws_virtual_hosted_style_request",
}
#: Option names whose values are credentials: masked wherever they are shown.
_SECRET = re.compile(r"secret|token|password|credential|access_key|account_key|sas|private_key", re.I)


def normalize_options(options: Mapping[str, object] | None) -> dict[str, str]:
    """Storage options with ``object_store`` names and string values.

    >>> normalize_options({"AWS_ENDPOINT_URL": "http://127.0.0.1:9000", "allow_http": True, "region": "eu"})
    {'aws_endpoint': 'http://127.0.0.1:9000', 'aws_allow_http': 'true', 'aws_region': 'eu'}
    """
    normalized: dict[str, str] = {}
    for key, value in (options or {}).items():
        if value is None:
            continue
        name = str(key).strip().lower()
        name = _ALIASES.get(name, name)
        normalized[name] = str(value).lower() if isinstance(value, bool) else str(value)
    return normalized


def is_secret(option: str) -> bool:
    """Whether an option's value is a credential (masked in logs, notes and the UI).

    >>> is_secret("aws_secret_access_key"), is_secret("aws_session_token"), is_secret("aws_region")
    (True, True, False)
    """
    return bool(_SECRET.search(option))


def redact(options: Mapping[str, str]) -> dict[str, str]:
    """``options`` with every credential masked."""
    return {k: ("***" if is_secret(k) else v) for k, v in options.items()}


def public_options(options: Mapping[str, str]) -> dict[str, str]:
    """``options`` without credentials: what may be written into a job's arguments or a spec."""
    return {k: v for k, v in options.items() if not is_secret(k)}


def secret_environment(options: Mapping[str, str]) -> dict[str, str]:
    """The credentials of ``options`` as the standard AWS environment variables, which delta-rs
    and Hadoop's S3A read by default: how a spark-submit job gets them without a command line."""
    names = {"aws_access_key_id": "AWS_ACCESS_KEY_ID", "aws_secret_access_key": "AWS_SECRET_ACCESS_KEY",
             "aws_session_token": "AWS_SESSION_TOKEN"}
    return {names[k]: v for k, v in options.items() if k in names}


@dataclass(frozen=True)
class Location:
    """A URI (a local directory, ``s3://bucket/prefix``, ...) and the options that reach it."""

    uri: str
    options: Mapping[str, str] = field(default_factory=dict, compare=False)

    def __post_init__(self) -> None:
        uri = str(self.uri)
        if uri.startswith("file:"):
            uri = uri[len("file://"):] if uri.startswith("file://") else uri[len("file:"):]
        if "://" not in uri:
            uri = os.path.abspath(uri)
        object.__setattr__(self, "uri", uri.rstrip("/") or "/")
        object.__setattr__(self, "options", normalize_options(self.options))

    @classmethod
    def of(cls, uri: "str | Location", options: Mapping[str, object] | None = None) -> "Location":
        return uri if isinstance(uri, Location) else cls(uri, normalize_options(options))

    def __repr__(self) -> str:
        return f"Location({self.uri!r}, {redact(self.options)!r})" if self.options else f"Location({self.uri!r})"

    __str__ = __repr__

    # -- where ------------------------------------------------------------------------------

    @property
    def scheme(self) -> str:
        return urlparse(self.uri).scheme.lower() if "://" in self.uri else ""

    @property
    def local(self) -> str | None:
        """The local path, or None for an object store."""
        return None if self.scheme else self.uri

    @property
    def is_s3(self) -> bool:
        return self.scheme in S3_SCHEMES

    def at(self, uri: str) -> "Location":
        """Another location (a table's, as the catalog or Spark reports it) with these options."""
        return Location(uri, self.options)

    def child(self, *parts: str) -> "Location":
        return Location("/".join([self.uri.rstrip("/"), *(p.strip("/") for p in parts)]), self.options)

    def name(self) -> str:
        return self.uri.rstrip("/").rsplit("/", 1)[-1]

    @property
    def delta_options(self) -> dict[str, str] | None:
        """The options for delta-rs (None when there are none)."""
        return dict(self.options) or None

    def redacted(self) -> str:
        return repr(self)

    # -- the object store -------------------------------------------------------------------

    @cached_property
    def _store(self):
        """An obstore store rooted at this location (object stores only)."""
        from obstore.store import AzureStore, GCSStore, S3Store

        parsed = urlparse(self.uri)
        prefix = parsed.path.strip("/") or None
        if self.is_s3:
            config = {k.removeprefix("aws_"): v for k, v in self.options.items() if k.startswith("aws_")}
            endpoint = config.get("endpoint", "")
            if endpoint.startswith("http://"):
                config.setdefault("allow_http", "true")
            return S3Store(parsed.netloc, prefix=prefix, config=config or None)
        if self.scheme in ("gs", "gcs"):
            config = {k.removeprefix("google_"): v for k, v in self.options.items() if k.startswith("google_")}
            return GCSStore(parsed.netloc, prefix=prefix, config=config or None)
        if self.scheme in ("abfss", "abfs", "az"):
            container, _, account = parsed.netloc.partition("@")
            config = {k.removeprefix("azure_"): v for k, v in self.options.items() if k.startswith("azure_")}
            if account:
                config.setdefault("account_name", account.split(".", 1)[0])
            return AzureStore(container, prefix=prefix, config=config or None)
        raise ValueError(f"no object store for {self.uri}")

    def list_dirs(self) -> list[str]:
        """Names of the "directories" directly under this location (empty when it is absent)."""
        if self.local:
            if not os.path.isdir(self.local):
                return []
            return sorted(e.name for e in os.scandir(self.local) if e.is_dir())
        import obstore

        listed = obstore.list_with_delimiter(self._store, None)
        return sorted(p.rstrip("/").rsplit("/", 1)[-1] for p in listed["common_prefixes"])

    def list_files(self, suffix: str = "") -> list[str]:
        """Paths (relative to this location) of every file under it that ends with ``suffix``."""
        if self.local:
            if not os.path.isdir(self.local):
                return []
            return sorted(os.path.relpath(os.path.join(folder, f), self.local)
                          for folder, _, files in os.walk(self.local) for f in files if f.endswith(suffix))
        import obstore

        return sorted(meta["path"] for batch in obstore.list(self._store) for meta in batch
                      if meta["path"].endswith(suffix))

    def exists(self, relative: str = "") -> bool:
        """Whether a file (or, for ``""``, anything) exists at ``relative`` under this location."""
        if self.local:
            return os.path.exists(os.path.join(self.local, relative) if relative else self.local)
        import obstore

        if relative:
            try:
                obstore.head(self._store, relative)
                return True
            except FileNotFoundError:
                return False
        listed = obstore.list_with_delimiter(self._store, None)
        return bool(listed["objects"] or listed["common_prefixes"])

    def is_delta_table(self) -> bool:
        if self.local:
            return os.path.isdir(os.path.join(self.local, "_delta_log"))
        return "_delta_log" in self.list_dirs()

    def read(self, relative: str) -> bytes:
        if self.local:
            with open(os.path.join(self.local, relative), "rb") as handle:
                return handle.read()
        import obstore

        return bytes(obstore.get(self._store, relative).bytes())

    def write(self, relative: str, data: bytes) -> None:
        """Put ``data`` at ``relative`` under this location, replacing what is there (readers
        see the old bytes or the new, never a half-written file)."""
        if self.local:
            path = os.path.join(self.local, relative)
            os.makedirs(os.path.dirname(path), exist_ok=True)
            partial = f"{path}.{os.getpid()}.partial"
            with open(partial, "wb") as handle:
                handle.write(data)
            os.replace(partial, path)
            return
        import obstore

        obstore.put(self._store, relative, data)

    def remove_tree(self) -> None:
        """Remove everything under this location (a dropped table's files)."""
        if self.local:
            shutil.rmtree(self.local, ignore_errors=True)
            return
        import obstore

        paths = [meta["path"] for batch in obstore.list(self._store) for meta in batch]
        for start in range(0, len(paths), 1000):
            obstore.delete(self._store, paths[start:start + 1000])


def spark_settings(location: Location) -> dict[str, str]:
    """The Hadoop settings (as ``spark.hadoop.*``) that let Spark reach ``location``.

    S3 goes through Hadoop's S3A for both ``s3://`` and ``s3a://``: the same URI then means
    the same table to delta-rs and to Spark.  An endpoint (an S3-compatible store) implies
    path-style requests unless ``aws_virtual_hosted_style_request`` is true.  Other schemes
    are left to the cluster's own configuration.

    >>> sorted(spark_settings(Location("s3://b/w", {"aws_region": "eu-west-1"})).items())[:2]
    [('spark.hadoop.fs.s3.impl', 'org.apache.hadoop.fs.s3a.S3AFileSystem'), ('spark.hadoop.fs.s3a.endpoint.region', 'eu-west-1')]
    """
    if not location.is_s3:
        return {}
    options = location.options
    conf = {"fs.s3.impl": "org.apache.hadoop.fs.s3a.S3AFileSystem"}
    endpoint = options.get("aws_endpoint")
    if endpoint:
        conf["fs.s3a.endpoint"] = endpoint
        if options.get("aws_virtual_hosted_style_request", "false").lower() != "true":
            conf["fs.s3a.path.style.access"] = "true"
        if endpoint.startswith("http://"):
            conf["fs.s3a.connection.ssl.enabled"] = "false"
    if options.get("aws_region"):
        conf["fs.s3a.endpoint.region"] = options["aws_region"]
    elif endpoint:
        conf["fs.s3a.endpoint.region"] = "us-east-1"  # an S3-compatible store: any region signs
    if options.get("aws_access_key_id"):
        conf["fs.s3a.access.key"] = options["aws_access_key_id"]
    if options.get("aws_secret_access_key"):
        conf["fs.s3a.secret.key"] = options["aws_secret_access_key"]
    if options.get("aws_session_token"):
        conf["fs.s3a.session.token"] = options["aws_session_token"]
        conf["fs.s3a.aws.credentials.provider"] = "org.apache.hadoop.fs.s3a.TemporaryAWSCredentialsProvider"
    return {f"spark.hadoop.{k}": v for k, v in conf.items()}


def warehouse_tables(warehouse: Location) -> dict[str, str]:
    """``{"db.table": uri}`` for every Delta table of a warehouse laid out as Spark lays it out
    (``<warehouse>/<db>.db/<table>``; ``<warehouse>/<table>`` for the default database), with
    ``"db.": ""`` for each database; directories starting with ``_`` or ``.`` are not tables.
    A listing of the directory or of the object-store prefix: two requests per database."""
    found: dict[str, str] = {}
    for entry in warehouse.list_dirs():
        if entry.startswith(("_", ".")):
            continue
        folder = warehouse.child(entry)
        children = folder.list_dirs()
        if entry.endswith(".db"):
            database = entry[:-3]
            for table in children:
                if not table.startswith(("_", ".")) and folder.child(table).is_delta_table():
                    found[f"{database}.{table}".lower()] = folder.child(table).uri
            found.setdefault(f"{database}.", "")
        elif "_delta_log" in children:
            found[f"default.{entry}".lower()] = folder.uri
    return found
