"""A tiny Glance for tests: serves image data and property lookups, and records requests.

Enough of Glance's v2 API for the agent: ``GET /v2/images/{id}`` (the record, with
``os_hash_algo``/``os_hash_value``), ``GET /v2/images/{id}/file`` (200 with
``Content-MD5``, 404 unknown, 204 for an image without data) and
``GET /v2/images?<property>=<value>``. Every request is recorded with its headers. It runs in a thread on 127.0.0.1 and a
free port; point ``[glance] endpoint_override`` at ``url`` with
``auth_type = none``.
"""

from __future__ import annotations

import hashlib
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qsl, urlsplit


class FakeGlanceImages:
    """The images a test Glance serves: id -> (data or None, properties)."""

    def __init__(self) -> None:
        self.images: dict[str, tuple[bytes | None, dict[str, str]]] = {}
        self.requests: list[tuple[str, str, dict[str, str]]] = []
        self.corrupt: set[str] = set()  # served with a byte more than was hashed
        # Served with a record whose os_hash_value is wrong (the data, and its MD5, right).
        self.wrong_multihash: set[str] = set()
        # Served with a record without os_hash_algo/os_hash_value (an older Glance).
        self.no_multihash: set[str] = set()
        self.hash_algo = "sha512"  # Glance's default [DEFAULT] hashing_algorithm
        self.failing: int | None = None  # a status every request gets (Glance in trouble)

    def add(self, image_id: str, data: bytes | None, **properties: str) -> None:
        self.images[image_id] = (data, properties)

    def record(self, image_id: str) -> dict:
        """``GET /v2/images/{id}``: the image's record, with Glance's checksum and
        multihash once it has data (``active``), none while it is ``queued``."""
        data, properties = self.images[image_id]
        record = {"id": image_id, "status": "queued" if data is None else "active",
                  "checksum": None, "os_hash_algo": None, "os_hash_value": None,
                  **properties}
        if data is not None:
            record["checksum"] = hashlib.md5(data).hexdigest()
            if image_id not in self.no_multihash:
                value = hashlib.new(self.hash_algo, data).hexdigest()
                if image_id in self.wrong_multihash:
                    value = hashlib.new(self.hash_algo, data + b"?").hexdigest()
                record.update(os_hash_algo=self.hash_algo, os_hash_value=value)
        return record


class GlanceServer:
    def __init__(self) -> None:
        self.store = FakeGlanceImages()
        store = self.store

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args) -> None:  # type: ignore[no-untyped-def]
                pass

            def _send(self, status: int, body: bytes = b"", headers: dict | None = None) -> None:
                self.send_response(status)
                for key, value in (headers or {}).items():
                    self.send_header(key, value)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def do_GET(self) -> None:  # noqa: N802 - http.server's naming
                parts = urlsplit(self.path)
                store.requests.append(("GET", self.path, dict(self.headers)))
                if store.failing is not None:
                    self._send(store.failing, b'{"message": "unavailable"}')
                    return
                segments = parts.path.strip("/").split("/")
                if segments[:2] == ["v2", "images"] and len(segments) == 4 \
                        and segments[3] == "file":
                    found = store.images.get(segments[2])
                    if found is None:
                        self._send(404, b'{"message": "not found"}')
                    elif found[0] is None:
                        self._send(204)
                    else:
                        md5 = hashlib.md5(found[0]).hexdigest()
                        data = found[0] + (b"x" if segments[2] in store.corrupt else b"")
                        self._send(200, data, {"Content-Type": "application/octet-stream",
                                               "Content-MD5": md5})
                    return
                if segments[:2] == ["v2", "images"] and len(segments) == 3:
                    found = store.images.get(segments[2])
                    if found is None:
                        self._send(404, b'{"message": "not found"}')
                    else:
                        self._send(200, json.dumps(store.record(segments[2])).encode(),
                                   {"Content-Type": "application/json"})
                    return
                if segments == ["v2", "images"]:
                    wanted = dict(parse_qsl(parts.query))
                    images = [{"id": image_id, "status": "active", **props}
                              for image_id, (_, props) in store.images.items()
                              if all(props.get(k) == v for k, v in wanted.items())]
                    self._send(200, json.dumps({"images": images}).encode(),
                               {"Content-Type": "application/json"})
                    return
                self._send(404)

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    def start(self) -> "GlanceServer":
        self._thread.start()
        return self

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()
