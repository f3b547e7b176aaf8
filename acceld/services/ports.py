"""The ports a service (or the all-in-one) listens on, and which option sets each one.

A port another process holds should stop a start with one line that names the address and
the option to change, before anything is started, rather than a traceback from deep in a
server (or, worse, a readiness probe that connects to the other process and reports the
service up). ``acceld all --port P`` moves the whole all-in-one: the API to P and, unless
their ports are configured, the conductor to P+1 and the agent to P+2.
"""

from __future__ import annotations

import errno
import re
import socket
from dataclasses import dataclass

from oslo_config import cfg
from oslo_config.cfg import Locations

# The all-in-one's services in port order: --port P puts the n-th on P+n.
ALLINONE = ("api", "conductor", "agent")


class PortProblem(RuntimeError):
    """A port cannot be listened on (held by another process, or given twice); the message
    is the one line the command prints."""


@dataclass(frozen=True)
class Listener:
    service: str  # "conductor", or "conductor metrics"
    host: str
    port: int
    option: str  # "[conductor] port"
    source: str  # where the value came from: "--port 7666 + 1", "/etc/acceld/acceld.conf"

    @property
    def address(self) -> str:
        return f"[{self.host}]:{self.port}" if ":" in self.host else f"{self.host}:{self.port}"


def _source(conf: cfg.ConfigOpts, name: str, group: str) -> str:
    where = conf.get_location(name, group)
    if where is None or where.location is Locations.opt_default:
        return "the default"
    if where.location is Locations.environment:
        return f"the environment, {where.detail}"
    if where.location is Locations.user and where.detail:
        return where.detail
    return "the command line"


def allinone_ports(conf: cfg.ConfigOpts, base: int | None) -> dict[str, tuple[int, str]]:
    """Each all-in-one service's port and where it came from. With ``base`` (``--port``) the
    API is on base and a service whose port nobody configured on base + its place."""
    ports: dict[str, tuple[int, str]] = {}
    for offset, service in enumerate(ALLINONE):
        configured = _source(conf, "port", service)
        if base is not None and (offset == 0 or configured == "the default"):
            if not 0 < base + offset <= 65535:
                raise PortProblem(f"--port {base} puts the {service} on {base + offset}, "
                                  "beyond the last port (65535)")
            ports[service] = (base + offset,
                              f"--port {base}" + (f" + {offset}" if offset else ""))
        else:
            ports[service] = (getattr(conf, service).port, configured)
    return ports


def metrics_listeners(conf: cfg.ConfigOpts, services: tuple[str, ...]) -> list[Listener]:
    """The enabled [metrics] listeners of ``services``."""
    found = []
    for service in services:
        if getattr(conf.metrics, f"{service}_enabled", False):
            found.append(Listener(f"{service} metrics", getattr(conf.metrics, f"{service}_host_ip"),
                                  getattr(conf.metrics, f"{service}_port"),
                                  f"[metrics] {service}_port",
                                  _source(conf, f"{service}_port", "metrics")))
    return found


def allinone_listeners(conf: cfg.ConfigOpts, base: int | None) -> list[Listener]:
    """Every address the all-in-one's services will listen on."""
    found = [Listener(service, getattr(conf, service).host_ip, port, f"[{service}] port", source)
             for service, (port, source) in allinone_ports(conf, base).items()]
    return found + metrics_listeners(conf, ALLINONE)


def _hint(listener: Listener) -> str:
    if listener.service in ALLINONE and (listener.source == "the default"
                                         or listener.source.startswith("--port")):
        return (f"set by {listener.option} ({listener.source}); `acceld all --port P` puts "
                "the API on P, the conductor on P+1 and the agent on P+2")
    return f"set by {listener.option} ({listener.source})"


def check_free(listeners: list[Listener]) -> None:
    """Raise :class:`PortProblem` for the first port given twice or held by another process.

    The probe binds as the servers do (SO_REUSEADDR, so a port in TIME_WAIT after a restart
    is free) and closes at once."""
    seen: dict[tuple[str, int], Listener] = {}
    for listener in listeners:
        other = seen.get((listener.host, listener.port))
        if other is not None:
            raise PortProblem(
                f"{listener.address} is both the {other.service}'s port ({other.option}, "
                f"{other.source}) and the {listener.service}'s ({listener.option}, "
                f"{listener.source}): give one of them another port")
        seen[(listener.host, listener.port)] = listener
        error = _bind_error(listener.host, listener.port)
        if error == errno.EADDRINUSE:
            raise PortProblem(f"{listener.address} is already in use by another process: it is "
                              f"the {listener.service}'s port, {_hint(listener)}")
        if error == errno.EACCES:
            raise PortProblem(f"{listener.address} may not be listened on by this user (a "
                              f"port below 1024 needs root): it is the {listener.service}'s "
                              f"port, {_hint(listener)}")


def _bind_error(host: str, port: int) -> int | None:
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except socket.gaierror:
        return None  # the service says what is wrong with the address itself
    family, kind, proto, _name, address = infos[0]
    with socket.socket(family, kind, proto) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(address)
        except OSError as exc:
            return exc.errno
    return None


_ADDRESS = re.compile(r", (\d+)\)")  # socket.create_server's "... on address ('h', 6667))"


def describe_in_use(conf: cfg.ConfigOpts, service: str, exc: OSError) -> str:
    """One line for a service whose listener found its port taken (another process took it
    after any check): the address and the option that sets it."""
    candidates = [Listener(service, getattr(conf, service).host_ip, getattr(conf, service).port,
                           f"[{service}] port or --port", _source(conf, "port", service))
                  ] if service in (*ALLINONE, "driver") else []
    candidates += metrics_listeners(conf, (service,))
    match = _ADDRESS.search(str(exc))
    named = [c for c in candidates if match and c.port == int(match.group(1))] or candidates
    if not named:
        return f"{exc.strerror or exc}: another process holds the port"
    return "; or ".join(f"{c.address} is already in use by another process: it is the "
                        f"{c.service}'s port, set by {c.option} ({c.source})" for c in named)
