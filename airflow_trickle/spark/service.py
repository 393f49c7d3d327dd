"""The Spark service: one long-lived Spark Connect server per warehouse, so a refresh pays its
query, not a JVM start.

``trickle serve`` (or ``python -m airflow_trickle.spark.service``) starts the server with
``spark-submit --class org.apache.spark.sql.connect.service.SparkConnectServer``: the Delta
extension and catalog, the resolved Delta jars, the warehouse and the project's Spark settings
-- the same configuration an embedded session gets (:func:`~airflow_trickle.spark.session.session_conf`).
It then registers the warehouse's tables in the server's catalog, runs one Delta ``MERGE`` to
warm the JVM (the first one costs seconds), and writes ``<warehouse>/_trickle_service/service.json``
(pid and ``sc://`` address).  That file is how a second ``serve`` on the same warehouse is
refused, how ``--stop`` finds the server, and how clients find it without being told.

Clients connect with ``Trickle(remote="sc://host:port")`` (or a Spark Connect session of their
own); in Airflow the refresh task runs the engine in its own process against the server.
"""
from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from airflow_trickle.config import TrickleConfig
from airflow_trickle.errors import TrickleError
from airflow_trickle.spark.address import (DEFAULT_PORT, client_address, host_port, is_loopback,  # noqa: F401
                                           reachable)

SERVER_CLASS = "org.apache.spark.sql.connect.service.SparkConnectServer"
SERVICE_DIR = "_trickle_service"


#: Where the service listens unless ``service_bind_address`` says otherwise.
LOOPBACK = "127.0.0.1"


@dataclass(frozen=True)
class ServiceInfo:
    """What ``service.json`` records about a running service."""

    #: The ``serve`` process (SIGTERM it to stop the service).
    pid: int
    address: str
    warehouse: str
    master: str
    started_at: float
    #: The Spark Connect server's JVM, a child of ``pid``.
    server_pid: int | None = None
    #: The address it listens on, and whether calls need the service's token (never recorded).
    bind: str = LOOPBACK
    authenticated: bool = False

    @property
    def host_port(self) -> tuple[str, int]:
        return host_port(self.address)


def service_dir(warehouse: str) -> Path:
    """Where the service of ``warehouse`` keeps its state and logs: in a local warehouse, else in
    a folder of this machine's named after the warehouse URI (the service runs here either way)."""
    if "://" not in warehouse:
        return Path(warehouse) / SERVICE_DIR
    import hashlib

    from airflow_trickle.spark.jars import cache_root

    return cache_root() / "services" / hashlib.sha1(warehouse.rstrip("/").encode()).hexdigest()[:16]


def read_service(warehouse: str) -> ServiceInfo | None:
    """The service recorded for ``warehouse`` if its process is alive, else None (a stale file is removed)."""
    file = service_dir(warehouse) / "service.json"
    try:
        info = ServiceInfo(**json.loads(file.read_text()))
    except (OSError, ValueError, TypeError):
        return None
    if not _alive(info.pid):
        file.unlink(missing_ok=True)
        return None
    return info


def _refuse_if_running(warehouse: str) -> None:
    running = read_service(warehouse)
    if running is not None:
        raise TrickleError(f"a Spark service already runs for warehouse {warehouse} at {running.address} "
                           f"(pid {running.pid})", hint="use it, or stop it first: trickle serve --stop")


def _alive(pid: int) -> bool:
    """True while process ``pid`` runs (a zombie child of ours, exited but not reaped, is not alive)."""
    try:
        if os.waitpid(pid, os.WNOHANG)[0] == pid:
            return False
    except ChildProcessError:
        pass  # not our child
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def check_binding(config: TrickleConfig) -> str:
    """The address the service may listen on: loopback, or another one only with a token (the
    service runs SQL with the warehouse's credentials for anyone who reaches it)."""
    bind = config.service_bind_address or LOOPBACK
    if not is_loopback(bind) and not config.service_token:
        raise TrickleError(f"the Spark service would listen on {bind} without authentication",
                           hint="set a shared secret in TRICKLE_SERVICE_TOKEN (or serve --token-file FILE); "
                                "clients send it (the spark_connect connection's password)")
    return bind


def server_command(config: TrickleConfig, warehouse: str, *, port: int, master: str) -> list[str]:
    """The ``spark-submit`` command line of a Connect server for ``warehouse`` (its token, if
    any, goes by the environment: :func:`server_environment`)."""
    from airflow_trickle.spark.session import session_conf

    conf = session_conf(config, warehouse, secrets=False)  # credentials: in the environment
    # Spark Connect listens on every interface by default (and a local driver on the machine's
    # address): here on loopback unless configured (:func:`check_binding`)
    conf.update({"spark.connect.grpc.binding.port": str(port),
                 "spark.connect.grpc.binding.address": check_binding(config),
                 "spark.ui.enabled": "false", "spark.log.level": "WARN"})
    if master.startswith("local"):  # a cluster's executors must reach the driver: not for them
        conf.update({"spark.driver.host": LOOPBACK, "spark.driver.bindAddress": LOOPBACK})
    command = [_spark_submit(), "--master", master, "--name", "airflow_trickle service",
               "--class", SERVER_CLASS]
    for key, value in conf.items():
        command += ["--conf", f"{key}={value}"]
    return command + ["spark-internal"]


def server_environment(config: TrickleConfig) -> dict[str, str]:
    """The server's environment: this one, the storage credentials and the service's token
    (which makes the server refuse calls without it), none of them on its command line."""
    from airflow_trickle.location import secret_environment

    environment = {**os.environ, **secret_environment(config.storage_options)}
    environment.pop("SPARK_CONNECT_AUTHENTICATE_TOKEN", None)
    if config.service_token:
        environment["SPARK_CONNECT_AUTHENTICATE_TOKEN"] = config.service_token
    return environment


def _spark_submit() -> str:
    import pyspark

    bundled = Path(pyspark.__file__).parent / "bin" / "spark-submit"
    return str(bundled) if bundled.exists() else "spark-submit"


def serve(warehouse: str, *, config: TrickleConfig | None = None, port: int = DEFAULT_PORT,
          master: str | None = None, ready=None, start_timeout: float = 180.0) -> int:
    """Run the service in the foreground until SIGTERM/SIGINT; returns the server's exit code.

    ``ready(info)`` is called once the server answers, its tables are registered and it is warm.
    """
    config = config or TrickleConfig.from_env(warehouse=warehouse)
    warehouse = os.path.abspath(warehouse) if "://" not in warehouse else warehouse
    master = master or config.spark_master
    _refuse_if_running(warehouse)
    folder = service_dir(warehouse)
    folder.mkdir(parents=True, exist_ok=True)
    lock = _hold_lock(folder, warehouse)
    bind = check_binding(config)
    port = port or free_port()
    address = client_address(bind, port)
    if reachable(address, timeout=0.5):
        lock.close()
        raise TrickleError(f"port {port} is already in use", hint="pick another with --port (0: any free port)")
    log = open(folder / "server.log", "ab")
    server = subprocess.Popen(server_command(config, warehouse, port=port, master=master), stdout=log,
                              stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True,
                              env=server_environment(config))
    stopping = []

    def stop(signum, frame):  # noqa: ARG001 - signal handler signature
        stopping.append(signum)
        _terminate(server)

    previous = {sig: signal.signal(sig, stop) for sig in (signal.SIGTERM, signal.SIGINT)}
    info_file = folder / "service.json"
    try:
        deadline = time.monotonic() + start_timeout
        while not reachable(address, timeout=0.5):
            if server.poll() is not None or stopping:
                raise TrickleError(f"the Spark service did not start (exit code {server.returncode}); "
                                   f"see {folder / 'server.log'}")
            if time.monotonic() > deadline:
                _terminate(server)
                raise TrickleError(f"the Spark service did not answer within {start_timeout:.0f} s; "
                                   f"see {folder / 'server.log'}")
            time.sleep(0.2)
        _prepare(address, config, warehouse)
        info = ServiceInfo(pid=os.getpid(), address=address, warehouse=warehouse, master=master,
                           started_at=time.time(), server_pid=server.pid, bind=bind,
                           authenticated=bool(config.service_token))
        tmp = info_file.with_suffix(".tmp")
        tmp.write_text(json.dumps(asdict(info)))
        tmp.replace(info_file)
        if ready is not None:
            ready(info)
        while server.poll() is None:
            time.sleep(0.5)
        return 0 if stopping else server.returncode
    finally:
        _terminate(server)
        log.close()
        info_file.unlink(missing_ok=True)
        lock.close()
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def _hold_lock(folder: Path, warehouse: str):
    """An exclusive lock on ``service.lock``, held for the service's life: two ``serve`` started
    at the same moment cannot both pass the check of ``service.json``."""
    import fcntl

    lock = open(folder / "service.lock", "w")
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        lock.close()
        raise TrickleError(f"a Spark service is already starting or running for warehouse {warehouse}",
                           hint="use it, or stop it first: trickle serve --stop") from None
    return lock


def _terminate(server: subprocess.Popen, grace: float = 20.0) -> None:
    if server.poll() is not None:
        return
    try:
        os.killpg(server.pid, signal.SIGTERM)
        server.wait(grace)
    except subprocess.TimeoutExpired:
        os.killpg(server.pid, signal.SIGKILL)
        server.wait()
    except ProcessLookupError:
        pass


def _prepare(address: str, config: TrickleConfig, warehouse: str) -> None:
    """Register the warehouse's tables in the server's catalog, and warm the JVM with one Delta MERGE."""
    from airflow_trickle.location import Location
    from airflow_trickle.spark.session import connect_session, sync_warehouse_tables

    spark = connect_session(address, config)
    try:
        sync_warehouse_tables(spark, Location(warehouse, config.storage_options))
        with tempfile.TemporaryDirectory(prefix="trickle-warmup-") as scratch:
            path = f"{scratch}/t"
            spark.sql(f"CREATE TABLE delta.`{path}` (k BIGINT, v BIGINT) USING delta "
                      "TBLPROPERTIES ('delta.enableChangeDataFeed' = 'true')")
            spark.sql(f"INSERT INTO delta.`{path}` SELECT id, id FROM range(10)")
            spark.sql(f"MERGE INTO delta.`{path}` t USING (SELECT id AS k, id * 2 AS v FROM range(5, 15)) s "
                      "ON t.k = s.k WHEN MATCHED THEN UPDATE SET v = s.v WHEN NOT MATCHED THEN INSERT *").collect()
            spark.sql(f"SELECT count(*) FROM table_changes_by_path('{path}', 0)").collect()
    finally:
        spark.stop()


def start_detached(warehouse: str, *, port: int = DEFAULT_PORT, master: str | None = None,
                   settings: dict | None = None, timeout: float = 240.0) -> ServiceInfo:
    """Start the service in a background process and return once it is ready."""
    warehouse = os.path.abspath(warehouse) if "://" not in warehouse else warehouse
    _refuse_if_running(warehouse)
    command = [sys.executable, "-m", "airflow_trickle.spark.service", "--warehouse", warehouse, "--port", str(port)]
    if master:
        command += ["--master", master]
    settings = dict(settings or {})
    environment = dict(os.environ)
    if settings.get("storage_options"):  # never on a command line: they may hold credentials
        environment["TRICKLE_STORAGE_OPTIONS"] = json.dumps(settings.pop("storage_options"))
    if settings.get("service_token"):
        environment["TRICKLE_SERVICE_TOKEN"] = settings.pop("service_token")
    if settings:
        command += ["--settings", json.dumps(settings)]
    folder = service_dir(warehouse)
    folder.mkdir(parents=True, exist_ok=True)
    with open(folder / "serve.log", "ab") as log:
        process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                   start_new_session=True, env=environment)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        info = read_service(warehouse)
        if info is not None and info.pid == process.pid:
            return info
        if process.poll() is not None:
            tail = (folder / "serve.log").read_text(errors="replace").strip().splitlines()[-3:]
            raise TrickleError(f"the Spark service did not start: {' / '.join(tail)}")
        time.sleep(0.2)
    os.killpg(process.pid, signal.SIGTERM)
    raise TrickleError(f"the Spark service was not ready within {timeout:.0f} s; see {folder}")


def stop_service(warehouse: str, timeout: float = 60.0) -> ServiceInfo | None:
    """Stop the service of ``warehouse`` (SIGTERM, then wait); returns what was stopped, or None."""
    info = read_service(warehouse)
    if info is None:
        return None
    os.kill(info.pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout
    while _alive(info.pid) and time.monotonic() < deadline:
        time.sleep(0.2)
    if _alive(info.pid):
        os.kill(info.pid, signal.SIGKILL)
    return info


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m airflow_trickle.spark.service",
                                     description="Run the Spark Connect service of a warehouse (foreground).")
    parser.add_argument("--warehouse", default=os.environ.get("TRICKLE_WAREHOUSE"), required=False)
    parser.add_argument("--port", type=int, default=DEFAULT_PORT, help="0: any free port")
    parser.add_argument("--master", default=None, help="Spark master (default: the spark_master setting)")
    parser.add_argument("--settings", default=None, help="JSON of airflow_trickle settings")
    args = parser.parse_args(argv)
    if not args.warehouse:
        parser.error("--warehouse (or TRICKLE_WAREHOUSE) is required")
    config = TrickleConfig.from_env(warehouse=args.warehouse, **json.loads(args.settings or "{}"))

    def announce(info: ServiceInfo) -> None:
        print(info.address, flush=True)

    try:
        return serve(args.warehouse, config=config, port=args.port, master=args.master, ready=announce)
    except TrickleError as err:
        print(f"airflow_trickle: {err}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
