"""Where the Spark service listens, and what only its server can set: shared by the sessions
that connect to it (``session.py``) and the service that starts it (``service.py``)."""
from __future__ import annotations

import ipaddress
import socket
from urllib.parse import quote, unquote, urlparse

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


def is_loopback(host: str) -> bool:
    """Whether ``host`` is this machine's loopback interface only.

    >>> [is_loopback(h) for h in ("127.0.0.1", "localhost", "::1", "0.0.0.0", "10.0.0.5")]
    [True, True, True, False, False]
    """
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def client_address(bind: str, port: int) -> str:
    """The address clients on this machine reach a service bound to ``bind`` by: loopback for
    loopback and the wildcard addresses, else the address itself.

    >>> client_address("0.0.0.0", 15002), client_address("10.0.0.5", 1)
    ('sc://127.0.0.1:15002', 'sc://10.0.0.5:1')
    """
    host = "127.0.0.1" if is_loopback(bind) or bind in ("0.0.0.0", "::", "") else bind
    return f"sc://{host}:{port}"


def with_token(address: str, token: str | None) -> str:
    """``address`` with the service's authentication ``token``, sent as a bearer token with
    every call -- the ``authorization`` header the server checks.

    Why not pyspark's own ``token=`` parameter: it makes the client speak TLS to any host but
    ``localhost``, and the Spark Connect server speaks none itself.  Given ``use_ssl=true`` (TLS
    terminated in front of the service) the ``token=`` parameter is kept.  A token already in
    ``address`` (a ``spark_connect`` connection's password) wins over ``token``.

    >>> with_token("sc://10.0.0.5:15002", "s3cr3t")
    'sc://10.0.0.5:15002/;authorization=Bearer%20s3cr3t'
    >>> with_token("sc://h:1/;user_id=a;token=t%2Fx", None)
    'sc://h:1/;user_id=a;authorization=Bearer%20t%2Fx'
    >>> with_token("sc://h:1/;use_ssl=true", "t"), with_token("sc://h:1", None)
    ('sc://h:1/;use_ssl=true;token=t', 'sc://h:1')
    """
    base, _, params = address.partition("/;")
    base = base.rstrip("/")
    pairs = [p.split("=", 1) for p in params.split(";") if "=" in p] if params else []
    given = [unquote(v) for k, v in pairs if k == "token"]
    token = given[0] if given else token
    pairs = [(k, v) for k, v in pairs if k not in ("token", "authorization")]
    if token is not None:
        tls = any(k == "use_ssl" and v.lower() == "true" for k, v in pairs)
        pairs.append(("token", quote(token, safe="")) if tls else
                     ("authorization", quote(f"Bearer {token}", safe="")))
    return base + ("/;" + ";".join(f"{k}={v}" for k, v in pairs) if pairs else "")


def without_secrets(address: str) -> str:
    """``address`` as it may be shown: its token left out.

    >>> without_secrets("sc://h:1/;user_id=a;token=t"), without_secrets("sc://h:1/;authorization=Bearer%20t")
    ('sc://h:1/;user_id=a', 'sc://h:1')
    """
    base, _, params = address.partition("/;")
    kept = [p for p in params.split(";") if p and p.split("=", 1)[0] not in ("token", "authorization")]
    return base.rstrip("/") + ("/;" + ";".join(kept) if kept else "")
