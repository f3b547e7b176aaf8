"""`acceld api`: the public API in gunicorn worker processes, each a threaded worker with
header and body deadlines (acceld.serving.api_worker), so that slow or idle clients
hold no thread and cannot stall other requests."""

from __future__ import annotations

import gc
import logging

from gunicorn.app.base import BaseApplication
from oslo_config import cfg

from acceld import logs
from acceld.services import gunicorn_log, noauth_guard
from acceld.serving import api_worker

LOG = logging.getLogger(__name__)


def deployables_wait(conf: cfg.ConfigOpts) -> int:
    from acceld.api.handlers.deployables import program_wait

    return int(program_wait(conf))


class _Gunicorn(BaseApplication):
    def __init__(self, conf: cfg.ConfigOpts, hooks: dict | None = None) -> None:
        self.conf = conf
        self.hooks = hooks or {}  # gunicorn server hooks (metrics: acceld.metrics.serve)
        super().__init__()

    def load_config(self) -> None:
        api = self.conf.api
        settings = {
            "bind": f"{api.host_ip}:{api.port}",
            "workers": api.workers,
            "worker_class": api_worker.worker_class(api.client_header_timeout,
                                                    api.client_body_timeout,
                                                    api.max_request_body_size),
            "threads": api.threads,
            # A threaded worker's main loop reports in while requests run: this only
            # catches a worker that stopped. A synchronous program request waits for the
            # conductor (acceld.api.handlers.deployables) in its own thread.
            "timeout": max(120, deployables_wait(self.conf) + 20),
            "graceful_timeout": 10,
            "keepalive": 5,
            "proc_name": "acceld-api",
            "control_socket_disable": True,
            "accesslog": None,
            # gunicorn's lines through oslo.log (acceld.logs), not to stderr in its format.
            "logger_class": gunicorn_log.OsloLogger,
            # gunicorn's DEBUG lines (its whole configuration, a line per request) add
            # nothing to acceld's own (access line, policy, microversion, database calls).
            "loglevel": "info",
            "limit_request_line": 8190,
        }
        if api.tls_cert_file:
            settings.update(certfile=api.tls_cert_file, keyfile=api.tls_key_file)
        settings.update(self.hooks)
        for key, value in settings.items():
            if key in self.cfg.settings:
                self.cfg.set(key, value)

    def load(self):  # type: ignore[no-untyped-def]
        # Runs in each worker after fork: the engine and its pool belong to that process.
        from acceld.api.app import wsgi_app
        from acceld.clients.conductor import client_from_config
        from acceld.db.engine import API_SQLITE_CACHE_KIB, from_config

        logs.setup(self.conf, "api", starting=False)  # the master warned at start
        db = from_config(self.conf, sqlite_cache_kib=API_SQLITE_CACHE_KIB,
                              lock_timeout=self.conf.api.database_lock_timeout)
        return wsgi_app(self.conf, db, client_from_config(self.conf))

    def reload(self) -> None:
        """SIGHUP in the master (gunicorn then starts new workers, which load the app and
        open the log afresh, and stops the old ones gracefully: serving never stops):
        re-read the config files' mutable options and reopen the master's own log."""
        from acceld.runtime import lifecycle

        lifecycle.reload(self.conf)
        super().reload()


def run(conf: cfg.ConfigOpts) -> None:
    """Serve; InsecureNoauth (before anything listens) for noauth beyond loopback,
    SchemaNotCurrent for a database behind this code's schema (as the conductor)."""
    noauth_guard.check(conf)
    from acceld.services.schema_gate import check_schema_in_child

    check_schema_in_child(conf)
    from acceld.runtime.lifecycle import catch_hup_early

    catch_hup_early()  # until gunicorn's master installs its own SIGHUP handler
    from acceld.metrics.serve import api_master_hooks

    server = _Gunicorn(conf, api_master_hooks(conf))
    # What the master holds goes to the collector's permanent generation before it forks
    # the workers: a worker's collections then never write to those objects, so their
    # pages stay shared with the master instead of being copied into each worker (its
    # USS after the bench's load: 52 -> 38 MB; its RSS, which counts shared pages, is
    # the same either way).
    gc.freeze()
    server.run()
