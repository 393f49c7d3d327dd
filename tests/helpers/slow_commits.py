"""An HTTP proxy in front of the S3 server that makes Delta commits slow, as a loaded store does.

Every ``PUT`` of a Delta log entry (``.../_delta_log/<version>.json``) of a table outside the
catalog waits ``delay`` seconds before it is forwarded; everything else passes at once (the
catalog is written by delta-rs alone, with conditional PUTs: slowing it shows nothing).  On s3proxy over loopback a PUT takes
milliseconds, so the window in which two writers can both find version N free and both write
it is milliseconds wide; on a real store under load it is as wide as its slowest PUT.  The race
tests use this to put writers into that window on purpose -- with the writer lease they still
take turns, without it one commit is silently replaced.

Requests and answers are passed through byte for byte (the ``Host`` header included, which
the requests' signatures cover).
"""
from __future__ import annotations

import http.client
import re
import socket
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

_COMMIT = re.compile(r"/_delta_log/\d{20}\.json$")
_HOP = {"connection", "keep-alive", "proxy-connection", "transfer-encoding", "upgrade"}


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
        self._lock = threading.Lock()
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args) -> None:  # quiet
                pass

            def _forward(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
                    body = self._read_chunked()
                else:
                    body = self.rfile.read(length) if length else b""
                path = self.path.split("?", 1)[0]
                held = self.command == "PUT" and _COMMIT.search(path) and "/_trickle/" not in path and proxy.delay
                if held:
                    with proxy._lock:
                        proxy.delayed += 1
                        proxy.collisions += proxy._in_flight.get(path, 0) > 0
                        proxy._in_flight[path] = proxy._in_flight.get(path, 0) + 1
                    time.sleep(proxy.delay)
                upstream = http.client.HTTPConnection("127.0.0.1", proxy.upstream_port, timeout=120)
                headers = {k: v for k, v in self.headers.items() if k.lower() not in _HOP}
                if body or self.command in ("PUT", "POST"):
                    headers["Content-Length"] = str(len(body))
                try:
                    upstream.request(self.command, self.path, body=body or None, headers=headers)
                    answer = upstream.getresponse()
                    data = answer.read()
                finally:
                    if held:
                        with proxy._lock:
                            proxy._in_flight[path] -= 1
                self.send_response_only(answer.status, answer.reason)
                for key, value in answer.getheaders():
                    if key.lower() not in _HOP and (key.lower() != "content-length" or self.command == "HEAD"):
                        self.send_header(key, value)  # a HEAD's length is the object's, not its (empty) body's
                if self.command != "HEAD":
                    self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                if self.command != "HEAD":
                    self.wfile.write(data)
                upstream.close()

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
