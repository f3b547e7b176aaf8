"""The public API as a WSGI application: ``acceld.wsgi.api:application``.

For a WSGI server the operator runs instead of `acceld api` (uwsgi, mod_wsgi, or
``gunicorn acceld.wsgi.api:application``). The configuration comes from the
environment, as for other OpenStack services' WSGI applications:
``OS_ACCELD_CONFIG_FILES`` (files separated by ``;``) and ``OS_ACCELD_CONFIG_DIR``;
with neither, the standard locations (/etc/acceld/acceld.conf, ...).

Importing the module reads the configuration, refuses ``auth_strategy = noauth``
unless ``[api] allow_insecure_noauth = true`` (the server's listen address is not
known here, so loopback cannot be told apart) and refuses an old database schema
(so the server fails to start, as `acceld api` does); each worker process builds
its own database pool and app on its first request, which keeps servers that
import before forking (uwsgi without lazy-apps, gunicorn --preload) from sharing
connections across processes. With ``[metrics] api_enabled`` a uwsgi master serves the
API's ``/metrics`` (acceld.metrics.wsgi_server); any other server logs at start why the
listener is off.
"""

from __future__ import annotations

import os
import threading
from typing import Any, Callable, Iterable

from oslo_config import cfg

from acceld import config, logs
from acceld.services import noauth_guard, schema_gate

FILES_VARIABLE = "OS_ACCELD_CONFIG_FILES"
DIR_VARIABLE = "OS_ACCELD_CONFIG_DIR"

WSGIApp = Callable[[dict, Callable], Iterable[bytes]]


def load_config(environ: dict[str, str] | None = None,
                conf: cfg.ConfigOpts | None = None) -> cfg.ConfigOpts:
    """acceld's configuration as the environment names it, else the standard places."""
    environ = os.environ if environ is None else environ
    files = [f for f in environ.get(FILES_VARIABLE, "").split(";") if f.strip()]
    dirs = [environ[DIR_VARIABLE]] if environ.get(DIR_VARIABLE) else []
    for path in files:
        if not os.path.isfile(path):
            raise RuntimeError(f"{FILES_VARIABLE} names {path!r}, which is not a file")
    return config.load(argv=[], config_files=files, config_dirs=dirs, discover=True,
                       conf=conf)


class LazyApplication:
    """Builds the app in the process that first calls it (each worker, after fork)."""

    def __init__(self, conf: cfg.ConfigOpts) -> None:
        self.conf = conf
        self._app: WSGIApp | None = None
        self._pid = 0
        self._lock = threading.Lock()

    def _load(self) -> WSGIApp:
        with self._lock:
            if self._app is None or self._pid != os.getpid():
                from acceld.api.app import wsgi_app
                from acceld.clients.conductor import client_from_config
                from acceld.db.engine import API_SQLITE_CACHE_KIB, from_config

                db = from_config(self.conf, sqlite_cache_kib=API_SQLITE_CACHE_KIB,
                              lock_timeout=self.conf.api.database_lock_timeout)
                self._app = wsgi_app(self.conf, db, client_from_config(self.conf))
                self._pid = os.getpid()
            return self._app

    def __call__(self, environ: dict, start_response: Callable) -> Any:
        app = self._app if self._pid == os.getpid() and self._app is not None else self._load()
        return app(environ, start_response)


def init_application(environ: dict[str, str] | None = None,
                     conf: cfg.ConfigOpts | None = None) -> LazyApplication:
    conf = load_config(environ, conf)
    logs.setup(conf, "api")
    noauth_guard.check_wsgi(conf)  # before the database: the cheaper refusal first
    schema_gate.check_schema(conf)
    from acceld.metrics import wsgi_server

    wsgi_server.start(conf)  # in a uwsgi master; elsewhere a WARNING says why not
    return LazyApplication(conf)


application = init_application()
