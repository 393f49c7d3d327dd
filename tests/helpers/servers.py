"""What the test servers share: a free port on 127.0.0.1, a process group started and awaited,
and a stop that ends the whole group."""
from __future__ import annotations

import os
import signal
import socket
import subprocess
import time
from pathlib import Path


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class LocalServer:
    """A server process of the tests; subclasses say what to run (:meth:`command`) and what to
    do once it listens (:meth:`ready`)."""

    #: Its name in errors, and the name of its log file in ``directory``.
    name = "server"
    start_timeout = 120.0

    def __init__(self, directory: str | os.PathLike):
        self.directory = Path(directory)
        self.directory.mkdir(parents=True, exist_ok=True)
        self.port = free_port()
        self.process: subprocess.Popen | None = None

    def command(self) -> list[str]:
        raise NotImplementedError

    def ready(self) -> None:
        """Called once the port accepts connections."""

    def start(self):
        command = self.command()
        with open(self.directory / f"{self.name}.log", "ab") as log:
            self.process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                            cwd=self.directory, start_new_session=True)
        deadline = time.monotonic() + self.start_timeout
        while True:
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.5):
                    break
            except OSError:
                if self.process.poll() is not None or time.monotonic() > deadline:
                    self.stop()
                    raise RuntimeError(f"{self.name} did not start; see {self.directory / (self.name + '.log')}")
                time.sleep(0.1)
        self.ready()
        return self

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(15)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait()
        self.process = None

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
