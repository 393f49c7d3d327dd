"""Where the Spark service listens, and what only its server can set: shared by the sessions
that connect to it (``session.py``) and the service that starts it (``service.py``)."""
from __future__ import annotations

import socket
from urllib.parse import urlparse

DEFAULT_PORT = 15002
#: Spark settings that only the server can take (a Connect session cannot set them).
STATIC_KEYS = ("spark.sql.extensions", "spark.sql.catalog.spark_catalog", "spark.sql.catalogImplementation",
               "spark.sql.warehouse.dir", "spark.jars", "spark.jars.packages")


def host_port(address: str) -> tuple[str, int]:
    parsed = urlparse(address if "://" in address else f"sc://{address}")
    return parsed.hostname or "127.0.0.1", parsed.port or DEFAULT_PORT


def reachable(address: str, timeout: float = 2.0) -> bool:
    """True when something accepts TCP connections at ``address`` (``sc://host:port``)."""
    try:
        with socket.create_connection(host_port(address), timeout=timeout):
            return True
    except OSError:
        return False
