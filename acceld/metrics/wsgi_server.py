"""The API's ``/metrics`` when another WSGI server than `acceld api` serves
``acceld.wsgi.api:application``: under uwsgi, the listener runs in the uwsgi master as it
does in `acceld api`'s gunicorn master (workers count into multiprocess files, the master
sums them and reads the inventory at scrape time); anywhere else, or under a uwsgi set up
so that the master cannot run it, the service says at start why it is off rather than
listening nowhere in silence.

The master runs it only when it loads the application itself (no ``lazy-apps``), is a
master (``master = true``) and runs Python threads (``enable-threads`` or ``threads``);
etc/uwsgi/acceld-api.ini sets all three.
"""

from __future__ import annotations

import atexit
import logging
import os
from typing import Any

from oslo_config import cfg

from acceld.metrics import multiproc, serve

LOG = logging.getLogger(__name__)

_TRUE = (b"true", b"1", b"yes", b"on", b"y", b"t")


def _flag(options: dict, name: str) -> bool:
    value = options.get(name)
    if isinstance(value, list):  # an option given more than once: the last one wins
        value = value[-1] if value else None
    if isinstance(value, bool):
        return value
    return isinstance(value, (bytes, str)) and (
        value.encode() if isinstance(value, str) else value).strip().lower() in _TRUE


def _threads(options: dict) -> bool:
    value = options.get("threads")
    try:
        count = int(value[-1] if isinstance(value, list) else value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        count = 0
    return _flag(options, "enable-threads") or count > 0


def why_off(uwsgi: Any | None) -> str | None:
    """Why this process cannot serve the API's metrics (None: it can). ``uwsgi`` is the
    uwsgi module, or None outside uwsgi."""
    if uwsgi is None:
        return ("this WSGI server is not uwsgi: the listener runs in `acceld api`'s gunicorn "
                "master or in a uwsgi master (etc/uwsgi/acceld-api.ini); here no "
                "process sums the workers' counters")
    options = dict(getattr(uwsgi, "opt", {}) or {})
    if uwsgi.worker_id() != 0:
        return ("uwsgi loaded the application in a worker (lazy-apps): the listener runs "
                "in the master, which loads it only without lazy-apps")
    if not _flag(options, "master"):
        return "uwsgi runs without a master (master = true): no process outlives a worker"
    if not _threads(options):
        return ("uwsgi runs no Python thread (enable-threads = true, or threads = N): the "
                "master could not answer a scrape")
    return None


def _uwsgi() -> Any | None:
    try:
        import uwsgi  # type: ignore[import-not-found]
    except ImportError:
        return None
    return uwsgi


def start(conf: cfg.ConfigOpts) -> Any:
    """At the application's import: the API's ``/metrics`` listener in this uwsgi master
    when ``[metrics] api_enabled``, or one WARNING saying why it is off. Returns the
    listener, or None."""
    if not serve.api_enabled(conf):
        return None
    uwsgi = _uwsgi()
    reason = why_off(uwsgi)
    if reason is not None:
        LOG.warning("[metrics] api_enabled = true, but the API's metrics listener "
                    "(%s:%s) is off: %s", conf.metrics.api_host_ip, conf.metrics.api_port,
                    reason)
        return None
    # One directory per metrics port (two instances on one host have two ports anyway),
    # emptied now, before any worker exists: counters restart at zero with the service.
    path = multiproc.directory(conf.state_path, f"api-metrics-{conf.metrics.api_port}")
    multiproc.enable(path)
    from acceld.db.engine import from_config

    db = from_config(conf)
    server = serve.start_api_listener(conf, db=db)
    master = os.getpid()

    def in_worker() -> None:
        """After uwsgi forked a worker: its copy of the master's listening socket and
        database pool are the master's (closed here without touching the connections)."""
        if os.getpid() == master:
            return
        server.server.socket.close()
        db.engine.dispose(close=False)
        atexit.register(multiproc.worker_exited, os.getpid())  # its live gauges go

    uwsgi.post_fork_hook = _chain(getattr(uwsgi, "post_fork_hook", None), in_worker)
    LOG.info("API metrics at %s (uwsgi master %d, the workers' counters in %s)", server.url,
             master, path)
    return server


def _chain(previous: Any, hook: Any) -> Any:
    """uwsgi keeps one post-fork hook: run the one set before (uwsgidecorators') too."""
    if previous is None:
        return hook

    def both() -> None:
        previous()
        hook()
    return both
