"""An HTTP proxy in front of the S3 server that makes Delta commits slow, as a loaded store does.

Every ``PUT`` of a Delta log entry (``.../_delta_log/<version>.json``) of a table outside the
catalog is held before it is forwarded; everything else passes at once (the catalog is written
by delta-rs alone, with conditional PUTs: slowing it shows nothing).  On s3proxy over loopback a
PUT takes milliseconds, so the window in which two writers can both find version N free and
both write it is milliseconds wide; on a real store under load it is as wide as its slowest
PUT.  The race tests use this to put writers into that window on purpose -- with the writer
lease they still take turns, without it one commit is silently replaced.

A held PUT waits up to ``delay`` seconds for a second writer's PUT of the same entry, and
goes on alone if none comes.  A pair is crossed, as requests on a loaded network may be: the
store applies the second one first, so it keeps the first one's entry, and answers the first
one first, so the second one records its refresh last.  That is the schedule in which a lost
commit shows: the store keeps one writer's changes while the catalog records the other's
frontier (with the plain order, the writer whose entry is kept also records last, and a replaced
refresh that had read the same source versions goes unnoticed).

Requests and answers are passed through byte for byte (the ``Host`` header included, which
the requests' signatures cover).  The proxy runs in a process of its own
(:class:`SlowCommitsProcess`, ``python -m tests.helpers.slow_commits UPSTREAM_PORT DELAY``): in
the test's process, a delta-rs call that went through it deadlocked (the call kept Python's
interpreter lock while it waited for the proxy's thread).
``GET /__stats`` answers with what it held, as JSON.
"""
from __future__ import annotations

import http.client
import json
import os
import re
import socket
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

_REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
_COMMIT = re.compile(r"/_delta_log/\d{20}\.json$")
_HOP = {"connection", "keep-alive", "proxy-connection", "transfer-encoding", "upgrade"}


class _Meeting:
    """Two PUTs of one log entry, crossed."""

    def __init__(self):
        self.met = threading.Event()
        self.second_applied = threading.Event()
        self.first_answered = threading.Event()


class SlowCommits:
    """Listens on 127.0.0.1 and forwards to ``upstream_port``; ``endpoint`` is the proxy's."""

    def __init__(self, upstream_port: int, delay: float):
        self.upstream_port = upstream_port
        self.delay = delay
        self.delayed = 0
        #: PUTs of a log entry that arrived while another PUT of the same entry was held: two
        #: writers inside the window, one of which Delta's S3 log store lets replace the other.
        self.collisions = 0
        self._in_flight: dict[str, int] = {}
        self._waiting: dict[str, _Meeting] = {}  # the first PUT of an entry, waiting for a second
        self._lock = threading.Lock()
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"
            # an answer goes out in one write, without Nagle's wait for the client's delayed ACK
            # (40 ms a request otherwise: a refresh through the proxy took four times as long)
            disable_nagle_algorithm = True
            wbufsize = -1
            upstream: http.client.HTTPConnection | None = None  # kept open across one client's requests

            def log_message(self, *args) -> None:  # quiet
                pass

            def _forward(self) -> None:
                if self.path == "/__stats":
                    data = json.dumps({"delayed": proxy.delayed, "collisions": proxy.collisions}).encode()
                    self.send_response_only(200)
                    self.send_header("Content-Length", str(len(data)))
                    self.end_headers()
                    self.wfile.write(data)
                    self.wfile.flush()
                    return
                length = int(self.headers.get("Content-Length") or 0)
                if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
                    body = self._read_chunked()
                else:
                    body = self.rfile.read(length) if length else b""
                path = self.path.split("?", 1)[0]
                held = self.command == "PUT" and _COMMIT.search(path) and "/_trickle/" not in path and proxy.delay
                meeting, second = self._hold(path) if held else (None, False)
                headers = {k: v for k, v in self.headers.items() if k.lower() not in _HOP}
                if body or self.command in ("PUT", "POST"):
                    headers["Content-Length"] = str(len(body))
                try:
                    answer, data = self._upstream(headers, body)
                finally:
                    if held:
                        with proxy._lock:
                            proxy._in_flight[path] -= 1
                    if meeting is not None and second:
                        meeting.second_applied.set()
                        # answered after the first one, so that the second records its refresh last
                        meeting.first_answered.wait(proxy.delay + 60)
                        time.sleep(proxy.delay)
                    elif meeting is not None:
                        meeting.first_answered.set()
                self.send_response_only(answer.status, answer.reason)
                for key, value in answer.getheaders():
                    if key.lower() not in _HOP and (key.lower() != "content-length" or self.command == "HEAD"):
                        self.send_header(key, value)  # a HEAD's length is the object's, not its (empty) body's
                if self.command != "HEAD":
                    self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                if self.command != "HEAD":
                    self.wfile.write(data)
                self.wfile.flush()

            def _hold(self, path: str) -> tuple[_Meeting | None, bool]:
                """Wait for a second PUT of ``path`` (up to ``delay``): ``(the pair, whether this is
                its second)``, or ``(None, False)`` when none came.  Returns when this one may go:
                a second at once, a first once its second has been applied."""
                with proxy._lock:
                    proxy.delayed += 1
                    proxy.collisions += proxy._in_flight.get(path, 0) > 0
                    proxy._in_flight[path] = proxy._in_flight.get(path, 0) + 1
                    meeting = proxy._waiting.pop(path, None)
                    if meeting is not None:
                        meeting.met.set()
                        return meeting, True
                    meeting = proxy._waiting[path] = _Meeting()
                if not meeting.met.wait(proxy.delay):
                    with proxy._lock:
                        if proxy._waiting.get(path) is meeting:  # nobody came: go on alone
                            del proxy._waiting[path]
                            return None, False
                    meeting.met.wait()  # one came just now
                meeting.second_applied.wait(proxy.delay + 60)  # so that the store keeps this one
                return meeting, False

            def _upstream(self, headers: dict, body: bytes):
                """The upstream's answer and body, over this client's connection to it (made again
                once if the server closed it meanwhile)."""
                for attempt in (1, 2):
                    if self.upstream is None:
                        self.upstream = http.client.HTTPConnection("127.0.0.1", proxy.upstream_port, timeout=120)
                    try:
                        self.upstream.request(self.command, self.path, body=body or None, headers=headers)
                        answer = self.upstream.getresponse()
                        data = answer.read()
                    except (http.client.RemoteDisconnected, ConnectionError, BrokenPipeError):
                        self.upstream.close()
                        self.upstream = None
                        if attempt == 2:
                            raise
                        continue
                    if answer.will_close:
                        self.upstream.close()
                        self.upstream = None
                    return answer, data

            def handle_expect_100(self) -> bool:
                done = super().handle_expect_100()
                self.wfile.flush()  # the client waits for it before it sends the body
                return done

            def finish(self) -> None:
                super().finish()
                if self.upstream is not None:
                    self.upstream.close()

            def _read_chunked(self) -> bytes:
                parts = []
                while True:
                    size = int(self.rfile.readline().split(b";", 1)[0].strip(), 16)
                    if size == 0:
                        self.rfile.readline()
                        return b"".join(parts)
                    parts.append(self.rfile.read(size))
                    self.rfile.readline()

            do_GET = do_PUT = do_POST = do_DELETE = do_HEAD = _forward

        class Server(ThreadingHTTPServer):
            def handle_error(self, request, client_address) -> None:  # a client that hung up: not news
                pass

        self.server = Server(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.port = self.server.server_address[1]
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def __enter__(self) -> "SlowCommits":
        self._thread.start()
        with socket.create_connection(("127.0.0.1", self.port), timeout=5):
            pass
        return self

    def __exit__(self, *exc) -> None:
        self.server.shutdown()
        self.server.server_close()


class SlowCommitsProcess:
    """:class:`SlowCommits` in a process of its own: its ``endpoint``, and what it held
    (:meth:`stats`)."""

    def __init__(self, upstream_port: int, delay: float):
        self.upstream_port, self.delay = upstream_port, delay
        self.process: subprocess.Popen | None = None
        self.port = 0

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def stats(self) -> dict:
        """``{"delayed": ..., "collisions": ...}``, as the proxy counts them."""
        connection = http.client.HTTPConnection("127.0.0.1", self.port, timeout=10)
        try:
            connection.request("GET", "/__stats")
            return json.loads(connection.getresponse().read())
        finally:
            connection.close()

    def __enter__(self) -> "SlowCommitsProcess":
        self.process = subprocess.Popen([sys.executable, "-m", "tests.helpers.slow_commits", str(self.upstream_port),
                                         str(self.delay)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                                        cwd=_REPO)
        line = self.process.stdout.readline()
        if not line.strip().isdigit():
            self.__exit__()
            raise RuntimeError(f"the slow-commit proxy did not start (exit code {self.process.poll()})")
        self.port = int(line)
        return self

    def __exit__(self, *exc) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.stdin.close()  # its end of input is its signal to stop
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.process.kill()


def main(upstream_port: int, delay: float) -> None:
    with SlowCommits(upstream_port, delay) as proxy:
        print(proxy.port, flush=True)
        sys.stdin.read()  # until the parent closes it (or ends)


if __name__ == "__main__":
    main(int(sys.argv[1]), float(sys.argv[2]))
