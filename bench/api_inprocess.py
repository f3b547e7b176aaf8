"""The public API's own cost per request, without any HTTP server: the WSGI app (build_app)
and the whole pipeline (wsgi_app: access log, edge, noauth identity) called in process on
SQLite, 2,000 times per route after 200 warm-up calls; 100 device profiles listed, as in
`make bench`. Separates the app's time from the
server's when `make bench` moves.

    .venv/bin/python -m bench.api_inprocess
"""

from __future__ import annotations

import io
import sys
import tempfile
import time

from acceld import config
from acceld.api import app as api_app
from acceld.db import migrate
from acceld.db.engine import Database

ROUTES = ("/accelerator/", "/accelerator/v2/device_profiles")
CALLS = 2000
PROFILES = 100


def _environ(path: str) -> dict:
    return {"REQUEST_METHOD": "GET", "PATH_INFO": path, "QUERY_STRING": "",
            "SERVER_NAME": "bench", "SERVER_PORT": "80", "SERVER_PROTOCOL": "HTTP/1.1",
            "REMOTE_ADDR": "127.0.0.1", "wsgi.url_scheme": "http",
            "wsgi.input": io.BytesIO(b""), "wsgi.errors": sys.stderr,
            "HTTP_X_ROLES": "admin", "HTTP_X_PROJECT_ID": "bench"}


def _start_response(status, headers, exc_info=None) -> None:  # type: ignore[no-untyped-def]
    return None


def main() -> None:
    state = tempfile.mkdtemp(prefix="acceld-inprocess-")
    conf = config.load([], config_files=[])
    conf.set_override("state_path", state)
    db = Database(f"sqlite:///{state}/acceld.sqlite")
    migrate.upgrade(db)
    seed = api_app.build_app(conf, db)
    for i in range(PROFILES):  # as `make bench` lists: 100 profiles
        body = b'[{"name": "seed-%d", "groups": [{"resources:FPGA": "1"}]}]' % i
        environ = {**_environ("/accelerator/v2/device_profiles"), "REQUEST_METHOD": "POST",
                   "CONTENT_TYPE": "application/json", "CONTENT_LENGTH": str(len(body)),
                   "wsgi.input": io.BytesIO(body)}
        b"".join(seed(environ, _start_response))
    for name, app in (("app alone", api_app.build_app(conf, db)),
                      ("whole pipeline", api_app.wsgi_app(conf, db))):
        for path in ROUTES:
            for _ in range(200):
                b"".join(app(_environ(path), _start_response))
            started = time.perf_counter()
            for _ in range(CALLS):
                b"".join(app(_environ(path), _start_response))
            per_call = (time.perf_counter() - started) / CALLS
            print(f"{name:15} GET {path:35} {per_call * 1e6:6.0f} us")


if __name__ == "__main__":
    main()
