#!/usr/bin/python3
"""mlinfra-alert-receiver: the webhook end of Alertmanager on the monitoring host.

Alertmanager POSTs notifications (its webhook format, version 4) here. Each notification is
appended as one JSON line to a log file that people read with `tail` and tests read over SSH,
and the last notifications are served back on GET /notifications. It is what the lab routes
alerts to, and a stand-in for a site's chat or paging webhook: real sites point
monitoring_alert_webhook_url elsewhere and do not run this.

Only the standard library (Python 3.11). Binds where it is told (127.0.0.1 by default: only
the Alertmanager on the same host talks to it).
"""
from __future__ import annotations

import argparse
import collections
import http.server
import json
import logging
import os
import signal
import sys
import threading
import time
from typing import Any, Deque, Optional, Sequence

LOG = logging.getLogger("mlinfra-alert-receiver")
MAX_BODY = 1024 * 1024  # Alertmanager batches alerts; a megabyte is far above any real group
KEEP_IN_MEMORY = 200


class Store:
    """Appends notifications to the log file (0640) and keeps the last ones in memory."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.lock = threading.Lock()
        self.recent: Deque[dict[str, Any]] = collections.deque(maxlen=KEEP_IN_MEMORY)
        directory = os.path.dirname(path)
        if directory:
            os.makedirs(directory, mode=0o750, exist_ok=True)

    def add(self, notification: dict[str, Any]) -> None:
        record = {"received_at": time.time(), **notification}
        line = json.dumps(record, sort_keys=True) + "\n"
        with self.lock:
            fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o640)
            with os.fdopen(fd, "a", encoding="utf-8") as handle:
                handle.write(line)
            self.recent.append(record)

    def last(self) -> list[dict[str, Any]]:
        with self.lock:
            return list(self.recent)


def summarize(notification: dict[str, Any]) -> str:
    alerts = notification.get("alerts") or []
    names = sorted({str(a.get("labels", {}).get("alertname", "?")) for a in alerts})
    return "%s: %s (%d alert%s)" % (notification.get("status", "?"), ", ".join(names) or "-",
                                    len(alerts), "" if len(alerts) == 1 else "s")


class Handler(http.server.BaseHTTPRequestHandler):
    server: "ReceiverServer"
    server_version = "mlinfra-alert-receiver"

    def log_message(self, fmt: str, *args: Any) -> None:  # access log off: the JSONL is the log
        pass

    def _reply(self, code: int, body: bytes, content_type: str = "application/json") -> None:
        self.send_response(code)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_POST(self) -> None:  # noqa: N802 (http.server's naming)
        try:
            length = int(self.headers.get("Content-Length", "0"))
        except ValueError:
            length = -1
        if length < 0 or length > MAX_BODY:
            self._reply(413 if length > MAX_BODY else 400, b'{"error": "bad Content-Length"}\n')
            return
        try:
            notification = json.loads(self.rfile.read(length) or b"null")
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            self._reply(400, json.dumps({"error": "not JSON: %s" % exc}).encode() + b"\n")
            return
        if not isinstance(notification, dict) or not isinstance(notification.get("alerts"), list):
            self._reply(400, b'{"error": "not an Alertmanager webhook notification (no alerts list)"}\n')
            return
        try:
            self.server.store.add(notification)
        except OSError as exc:
            LOG.error("cannot record a notification in %s: %s", self.server.store.path, exc.strerror or exc)
            self._reply(500, b'{"error": "cannot record the notification"}\n')
            return
        LOG.info("%s", summarize(notification))
        self._reply(200, b'{"status": "recorded"}\n')

    def do_GET(self) -> None:  # noqa: N802
        if self.path.split("?", 1)[0] in ("/notifications", "/"):
            body = json.dumps(self.server.store.last(), sort_keys=True).encode() + b"\n"
            self._reply(200, body)
        elif self.path == "/-/healthy":
            self._reply(200, b"ok\n", "text/plain")
        else:
            self._reply(404, b'{"error": "not found"}\n')


class ReceiverServer(http.server.ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, address: tuple[str, int], store: Store) -> None:
        self.store = store
        super().__init__(address, Handler)


def listen_address(text: str) -> tuple[str, int]:
    host, sep, port = text.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise argparse.ArgumentTypeError("expected HOST:PORT, for example 127.0.0.1:9095, got %r" % text)
    return host.strip("[]"), int(port)


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", maxsplit=1)[0])
    parser.add_argument("--listen", type=listen_address, default=("127.0.0.1", 9095), metavar="HOST:PORT")
    parser.add_argument("--log", default="/var/lib/mlinfra-alert-receiver/alerts.jsonl", metavar="PATH",
                        help="JSON-lines file the notifications are appended to")
    args = parser.parse_args(argv)
    logging.basicConfig(stream=sys.stderr, level=logging.INFO,
                        format="mlinfra-alert-receiver: %(levelname)s: %(message)s")
    try:
        server = ReceiverServer(args.listen, Store(args.log))
    except OSError as exc:
        LOG.error("cannot listen on %s:%d or open %s: %s", args.listen[0], args.listen[1], args.log,
                  exc.strerror or exc)
        return 1
    signal.signal(signal.SIGTERM, lambda *_: threading.Thread(target=server.shutdown).start())
    LOG.info("listening on http://%s:%d/ (recording to %s)", args.listen[0], args.listen[1], args.log)
    with server:
        server.serve_forever()
    return 0


if __name__ == "__main__":
    sys.exit(main())
