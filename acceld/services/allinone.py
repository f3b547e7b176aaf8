"""`acceld all`: every service on one machine, one Ctrl-C to stop them all.

Each service runs as its own process (the same commands a cloud runs
separately), started in order; a line ``acceld <service>: <url>`` is printed
once the service answers. SIGHUP is passed on to every service (each reopens its log
and re-reads its config files) and handled by `all` itself the same way. Every port is checked before anything starts
(acceld.services.ports): one taken stops the start with one line naming its option, and
``--port P`` moves the API to P and the conductor and agent to P+1 and P+2.
"""

from __future__ import annotations

import logging
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass

from oslo_config import cfg

from acceld.db import migrate
from acceld.db.engine import from_config
from acceld.runtime import lifecycle
from acceld.services import ports
from acceld.runtime.secrets import ensure_secret_file, ensure_state_dir

LOG = logging.getLogger(__name__)


@dataclass
class Service:
    name: str
    argv: list[str]
    url: str
    ready_url: str  # http(s)://... is polled with GET; tcp://host:port is connected to
    # Start at the same time as the service before it rather than once that one is ready:
    # for a service that needs nothing of the previous one to start (it saves a start time).
    with_previous: bool = False


def services(conf: cfg.ConfigOpts, common: list[str]) -> list[Service]:
    """The services the all-in-one starts, in start order."""
    api_url = f"http://{conf.api.host_ip}:{conf.api.port}/accelerator/v2"
    api_args = ["--port", str(conf.api.port), "--workers", str(conf.api.workers)]
    conductor_url = f"http://{conf.conductor.host_ip}:{conf.conductor.port}"
    return [
        Service("conductor", ["conductor", *common, "--port", str(conf.conductor.port)],
                conductor_url, f"tcp://{conf.conductor.host_ip}:{conf.conductor.port}"),
        Service("api", ["api", *common, *api_args], api_url, api_url, with_previous=True),
        # One agent for this machine, with [agent] enabled_drivers (default fake and pci).
        Service("agent", ["agent", *common, "--port", str(conf.agent.port)],
                f"http://{conf.agent.host_ip}:{conf.agent.port}",
                f"tcp://{conf.agent.host_ip}:{conf.agent.port}"),
    ]


def _wait_ready(proc: subprocess.Popen, url: str, timeout: float = 60.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            return False
        if url.startswith("tcp://"):
            host, _, port = url[len("tcp://"):].rpartition(":")
            try:
                socket.create_connection((host, int(port)), timeout=1.0).close()
                return True
            except OSError:
                time.sleep(0.05)
                continue
        try:
            with urllib.request.urlopen(url, timeout=1.0):
                return True
        except urllib.error.HTTPError:
            return True  # it answers; auth or a 4xx is still an answer
        except (urllib.error.URLError, OSError):
            time.sleep(0.05)
    return False


def _child_environment(conf: cfg.ConfigOpts) -> dict[str, str]:
    """The services' environment: the all-in-one runs every service as the invoking user,
    so its agent does root operations itself rather than through a privsep daemon
    (acceld.privileged), unless the environment already says otherwise. Each service's
    port is the all-in-one's choice (``--port`` moves them all), so that the API and the
    agent reach the conductor where it listens."""
    return {"OS_AGENT__PRIVILEGED_CALLS": "in_process", **os.environ,
            **{f"OS_{service.upper()}__PORT": str(getattr(conf, service).port)
               for service in ports.ALLINONE},
            lifecycle.PARENT_ENV: str(os.getpid())}


def claim_ports(conf: cfg.ConfigOpts, base_port: int | None) -> None:
    """Settle each service's port (``--port P``: the API on P and, unless configured, the
    conductor on P+1 and the agent on P+2) and check that every address the services will
    listen on is free: PortProblem, naming the address and its option, before anything
    starts."""
    listeners = ports.allinone_listeners(conf, base_port)
    for service, (port, _source) in ports.allinone_ports(conf, base_port).items():
        conf.set_override("port", port, group=service)
    ports.check_free(listeners)


def run(conf: cfg.ConfigOpts, config_files: list[str], config_dirs: list[str] = (),  # type: ignore[assignment]
        base_port: int | None = None) -> int:
    """Start every service and wait; PortProblem (nothing started) for a port that is taken."""
    claim_ports(conf, base_port)
    lifecycle.catch_hup_early()  # logrotate may send it while the services start
    state_path = os.path.abspath(conf.state_path)
    if conf.internal.shared_secret:
        ensure_state_dir(state_path)
    else:
        ensure_secret_file(state_path)  # makes (or checks) the private directory too
    db = from_config(conf)
    migrate.upgrade(db)
    db.dispose()

    common = ["--state-path", state_path]
    for path in config_files:
        common += ["--config-file", path]
    for path in config_dirs:  # what the command found or was given, passed on as it is
        common += ["--config-dir", path]
    procs: list[subprocess.Popen] = []
    stopping = False

    def stop(*_args) -> None:  # type: ignore[no-untyped-def]
        nonlocal stopping
        stopping = True

    signal.signal(signal.SIGINT, stop)
    signal.signal(signal.SIGTERM, stop)
    starting: list[tuple[Service, subprocess.Popen]] = []

    def ready() -> bool:
        """Wait for the services being started, in order; print each one's line."""
        for service, proc in starting:
            if not _wait_ready(proc, service.ready_url) or stopping:
                if not stopping:
                    print(f"acceld {service.name} failed to start", file=sys.stderr, flush=True)
                return False
            lifecycle.announce(f"acceld {service.name}: {service.url}")
            LOG.info("acceld %s (pid %d) ready at %s", service.name, proc.pid, service.url)
        starting.clear()
        return True

    try:
        for service in services(conf, common):
            if not service.with_previous and not ready():
                return 1
            argv = [sys.executable, "-m", "acceld.cmd.main", *service.argv]
            proc = subprocess.Popen(argv, start_new_session=True,
                                    env=_child_environment(conf))
            procs.append(proc)
            starting.append((service, proc))
            LOG.info("acceld %s started (pid %d)", service.name, proc.pid)
        if not ready():
            return 1
        from acceld import dashboard

        lifecycle.announce(dashboard.announcement(
            f"http://{conf.api.host_ip}:{conf.api.port}", conf.api.port))
        while not stopping:
            if lifecycle.take_hup():  # logrotate: every service reopens its log too
                _forward_hup(procs)
                lifecycle.reload(conf)
            for proc in procs:
                if proc.poll() is not None:
                    print(f"acceld: a service exited ({proc.args[3]}, status {proc.returncode});"
                          " stopping", file=sys.stderr, flush=True)
                    return 1
            time.sleep(0.2)
        LOG.info("stopping every service")
        return 0
    finally:
        _stop_all(procs)


def _forward_hup(procs: list[subprocess.Popen]) -> None:
    """SIGHUP to each service's own process (not its group: the API's gunicorn master
    replaces its workers gracefully, whereas a worker given SIGHUP would just exit)."""
    for proc in procs:
        if proc.poll() is None:
            try:
                os.kill(proc.pid, signal.SIGHUP)
            except ProcessLookupError:
                pass


def _stop_all(procs: list[subprocess.Popen]) -> None:
    for proc in reversed(procs):
        if proc.poll() is None:
            try:
                os.killpg(proc.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
    deadline = time.monotonic() + 15
    for proc in reversed(procs):
        try:
            proc.wait(max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
