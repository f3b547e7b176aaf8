"""The least of Nova and Glance that the ``openstack accelerator`` CLI reaches for.

``arq bind`` resolves its server argument through the compute API
(``find_server``) and ``deployable program`` checks the image in Glance before
patching. This server answers those lookups (and the version discovery in
front of them) for the servers and images a test registers, 404 for anything
else, and records Nova's ``os-server-external-events`` posts. Loopback only,
a free port, stopped by the test that starts it.
"""

from __future__ import annotations

import json
import re
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

COMPUTE = "/compute/v2.1"
IMAGE = "/image"


class MinimalCloud:
    def __init__(self) -> None:
        self.servers: dict[str, dict] = {}
        self.images: dict[str, dict] = {}
        self.events: list[dict] = []
        self.requests: list[tuple[str, str]] = []
        cloud = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args) -> None:  # type: ignore[no-untyped-def]
                pass

            def _send(self, status: int, body: object | None = None) -> None:
                data = json.dumps(body).encode() if body is not None else b""
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self) -> None:  # noqa: N802 - http.server's naming
                cloud.requests.append(("GET", self.path))
                status, body = cloud.answer_get(self.path.split("?", 1)[0].rstrip("/"))
                self._send(status, body)

            def do_POST(self) -> None:  # noqa: N802
                cloud.requests.append(("POST", self.path))
                length = int(self.headers.get("Content-Length") or 0)
                raw = self.rfile.read(length)
                if self.path.rstrip("/") == f"{COMPUTE}/os-server-external-events":
                    events = json.loads(raw)["events"]
                    cloud.events.extend(events)
                    self._send(200, {"events": [{**e, "code": 200} for e in events]})
                else:
                    self._send(404, {"itemNotFound": {"code": 404, "message": "Not found"}})

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    @property
    def compute_url(self) -> str:
        return self.url + COMPUTE

    @property
    def image_url(self) -> str:
        return self.url + IMAGE

    def answer_get(self, path: str) -> tuple[int, object]:
        if path == COMPUTE:
            return 200, {"version": {
                "id": "v2.1", "status": "CURRENT", "version": "2.96", "min_version": "2.1",
                "links": [{"rel": "self", "href": self.compute_url + "/"}]}}
        match = re.fullmatch(rf"{COMPUTE}/servers/([^/]+)", path)
        if match and match.group(1) in self.servers:
            return 200, {"server": self.servers[match.group(1)]}
        if path in (IMAGE, IMAGE + "/versions"):
            return 200, {"versions": [{
                "id": "v2.16", "status": "CURRENT",
                "links": [{"rel": "self", "href": self.image_url + "/v2/"}]}]}
        match = re.fullmatch(rf"{IMAGE}/v2/images/([^/]+)", path)
        if match and match.group(1) in self.images:
            return 200, self.images[match.group(1)]
        return 404, {"itemNotFound": {"code": 404, "message": f"{path} not found"}}

    def add_server(self, server_id: str, name: str = "vm") -> None:
        self.servers[server_id] = {"id": server_id, "name": name, "status": "ACTIVE",
                                   "links": []}

    def add_image(self, image_id: str, name: str = "bitstream") -> None:
        self.images[image_id] = {"id": image_id, "name": name, "status": "active",
                                 "disk_format": "raw", "container_format": "bare",
                                 "visibility": "public", "size": 2048}

    def start(self) -> "MinimalCloud":
        self._thread.start()
        return self

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()
