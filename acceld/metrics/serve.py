"""Starting metrics for one service, from ``[metrics]``.

Each service serves ``/metrics`` on an address of its own (``[metrics]
<service>_host_ip``/``<service>_port``), off by default. For the API that listener
runs in the gunicorn master: it sums the workers' multiprocess files (so counters
add up across workers and survive a worker's restart) and reads the inventory from
the database at scrape time, and it keeps answering while every worker is busy.
"""

from __future__ import annotations

import logging
import os
import threading
from typing import Any

from oslo_config import cfg

from acceld.metrics import multiproc

LOG = logging.getLogger(__name__)


def api_enabled(conf: cfg.ConfigOpts) -> bool:
    return bool(conf.metrics.api_enabled)


def api_middleware(conf: cfg.ConfigOpts) -> list[Any]:
    """The request-counting middleware when the API's metrics are on, else nothing."""
    if not api_enabled(conf):
        return []
    from acceld.metrics.requests import RequestMetrics

    return [RequestMetrics()]


def api_master_hooks(conf: cfg.ConfigOpts) -> dict[str, Any]:
    """gunicorn settings for the API's master: empty when metrics are off. Prepares the
    multiprocess directory now (before any worker exists); the listener starts once the
    master is ready, and a worker's exit drops its live gauges."""
    if not api_enabled(conf):
        return {}
    path = multiproc.directory(conf.state_path, f"api-{conf.api.port}")
    multiproc.enable(path)
    guard = threading.Lock()
    holder: dict[str, Any] = {}

    def when_ready(arbiter: Any) -> None:
        holder["server"] = start_api_listener(conf, guard)

    def child_exit(arbiter: Any, worker: Any) -> None:
        multiproc.worker_exited(worker.pid)

    def post_fork(arbiter: Any, worker: Any) -> None:
        server = holder.get("server")
        if server is not None:  # the worker has no use for the master's listening socket
            server.server.socket.close()

    # No worker is forked while a scrape holds a database connection (a child would share
    # the connection's socket with the master); scrapes wait for a fork, forks for a scrape.
    os.register_at_fork(before=guard.acquire, after_in_parent=guard.release,
                        after_in_child=guard.release)
    return {"when_ready": when_ready, "child_exit": child_exit, "post_fork": post_fork}


def start_api_listener(conf: cfg.ConfigOpts, guard: threading.Lock | None = None,
                       db: Any = None) -> Any:
    """The API's ``/metrics``: the workers' counters (multiprocess) and the inventory (read
    through ``db``, by default an engine of its own)."""
    from prometheus_client import CollectorRegistry
    from prometheus_client.multiprocess import MultiProcessCollector

    from acceld.db.engine import from_config
    from acceld.metrics.inventory import InventoryCollector

    registry = CollectorRegistry()
    if multiproc.enabled():
        registry.register(_ApiFamiliesOnly(MultiProcessCollector(None)))
    else:  # one process (tests): this process's own families
        from acceld.metrics.families import SERVICES

        for family in SERVICES["api"]:
            registry.register(family)
    registry.register(InventoryCollector(db or from_config(conf), guard))
    return _start(registry, conf.metrics.api_host_ip, conf.metrics.api_port, "api")


class _ApiFamiliesOnly:
    """The workers' files hold every family their process created, the conductor's
    label-less ones too (at zero: the families module defines them all); only the API's
    are the API's to show (an `acceld_placement_up 0` here would fire an alert)."""

    def __init__(self, collector: Any) -> None:
        from acceld.metrics.families import SERVICES

        self.collector = collector
        self.names = {name for family in SERVICES["api"] for name in _family_names(family)}

    def collect(self) -> Any:
        return (f for f in self.collector.collect() if f.name in self.names)


def _family_names(family: Any) -> set[str]:
    return {metric.name for metric in family.describe()}


def serve(conf: cfg.ConfigOpts, service: str) -> Any:
    """The conductor's or the agent's ``/metrics``, when ``[metrics] <service>_enabled``;
    None when off."""
    if not conf.metrics[f"{service}_enabled"]:
        return None
    from acceld.metrics.families import registry_for

    return _start(registry_for(service), conf.metrics[f"{service}_host_ip"],
                  conf.metrics[f"{service}_port"], service)


def _start(registry: Any, host: str, port: int, service: str) -> Any:
    from acceld.metrics.http import MetricsServer

    try:
        server = MetricsServer(registry, host, port)
    except OSError as exc:
        raise SystemExit(f"acceld {service}: cannot listen for metrics on {host}:{port} "
                         f"([metrics] {service}_host_ip/{service}_port): {exc}") from None
    return server.start()
