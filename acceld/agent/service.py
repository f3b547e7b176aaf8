"""`acceld agent`: one per compute node; its drivers' hardware, served to the conductor.

Internal API (every call signed, see acceld.internal.auth):

- ``POST /hello`` from an external driver process: ``{"status": "READY",
  "endpoint": "host:port", "type": "FPGA", "name": "fake", "hardware_digest": ...}``.
  The agent pulls that driver's ``GET /hardware`` when its digest is new.
- ``POST /discovery``: 202 ``{"status": "IN-PROGRESS"}``; rescans every in-process
  driver and asks every external driver to rescan.
- ``GET /hardware``: ``{"hardware": [...], "digest": "..."}`` over all drivers.
- More routes come from :data:`ROUTE_FACTORIES` (programming, attach handles).

The agent says hello to the conductor every ``[agent] heartbeat_interval``
seconds with the digest of its hardware, and at once when a discovery changed
it. In-process drivers come from ``[agent] enabled_drivers`` (entry points).
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable

import falcon
import requests
from oslo_config import cfg

from acceld.agent.hardware import HelloLoop, digest
from acceld.clients.conductor import (FailoverClient, HelloTimeouts, failover_client,
                                      hello_timeouts)
from acceld.clients.internal import InternalClient, InternalError, internal_url, tls_verify
from acceld.drivers import loader
from acceld.drivers.base import Driver
from acceld.internal.server import (Handler, InternalServer, advertised_endpoint, json_body,
                                    respond, serve)
from acceld.runtime.lifecycle import (catch_hup_early, repeat_until_stopped,
                                      run_until_signalled, start_stamp)
from acceld.internal import versions
from acceld.internal.auth import NodeKeys, Signer, agent_destination, driver_destination
from acceld.jsonschemas import strict_validator
from acceld.metrics import record as metrics
from acceld.metrics.serve import serve as serve_metrics
from acceld.runtime.secrets import own_node_key

LOG = logging.getLogger(__name__)

Routes = dict[str, dict[str, Handler]]

DRIVER_HELLO = strict_validator({
    "type": "object",
    "required": ["status", "endpoint", "type"],
    "additionalProperties": False,
    "properties": {
        "status": {"const": "READY"},
        "endpoint": {"type": "string", "maxLength": 255,
                     "pattern": r"^(https?://)?[A-Za-z0-9_.:\[\]-]+:[0-9]{1,5}$"},
        "type": {"type": "string", "maxLength": 30},
        "name": {"type": "string", "maxLength": 100},
        "hardware_digest": {"type": ["string", "null"], "maxLength": 64},
        # The internal API version the driver process speaks; none: 1.0.
        "api_version": versions.SCHEMA,
    },
})


class ConductorHellos:
    """The agent's hellos to the conductors, each waited for as long as it may take there
    (acceld.clients.conductor.hello_timeouts): a hello announcing the hardware a conductor
    already took is answered from the conductor's memory, one announcing other hardware
    (the first since this agent started, or a change) may wait for the conductor's pull."""

    def __init__(self, client: FailoverClient, timeouts: HelloTimeouts) -> None:
        self.client = client
        self.timeouts = timeouts
        self._taken: str | None = None  # the digest of the last hello a conductor took

    @property
    def base_url(self) -> str:
        return self.client.base_url

    @base_url.setter
    def base_url(self, url: str) -> None:  # tests point the hellos elsewhere
        self.client.base_url = url

    def call(self, method: str, path: str, body: dict[str, Any], *,
             timeout: float | None = None) -> Any:
        """POST the hello; ``timeout`` (the loop's) gives way to the one the hello needs."""
        digest = body.get("hardware_digest")
        wait = self.timeouts.answer if digest == self._taken else self.timeouts.pull
        answer = self.client.call(method, path, body, timeout=wait)
        self._taken = digest
        return answer

    def close(self) -> None:
        self.client.close()


@dataclass
class ExternalDriver:
    """A driver process that said hello; its last hardware is kept until it goes silent."""

    endpoint: str
    type: str
    name: str | None
    last_hello: float
    digest: str | None = None
    records: list[Any] = field(default_factory=list)


class Agent:
    """The node agent: drivers, their hardware, the internal server and the hello loop."""

    def __init__(self, conf: cfg.ConfigOpts, hostname: str | None = None,
                 drivers: list[Driver] | None = None) -> None:
        self.conf = conf
        self.hostname = hostname or conf.host
        self.drivers = drivers if drivers is not None else [
            loader.load(name, conf, self.hostname) for name in loader.enabled(conf)]
        # The node's own key: its calls are signed with it, its server accepts only it.
        key = own_node_key(conf, self.hostname)
        self.signer = Signer(key.key, self.hostname, key.generation)
        self.keys = NodeKeys(self.hostname, key.key, key.generation)
        self._lock = threading.Lock()
        self._records: dict[str, list[Any]] = {}  # driver name -> its records (in-process)
        self.external: dict[str, ExternalDriver] = {}
        self._discovering = threading.Lock()
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self.server: InternalServer | None = None
        self.hello: HelloLoop | None = None
        self.host_step_audit: Any = None  # acceld.agent.host_steps.HostStepAudit, once started
        # Discoveries run since start: each hello carries it, and the conductor counts a new
        # one as one more health report of the node's devices (acceld.quarantine).
        self.discoveries = 0

    # What the routes and other components use

    def find_driver(self, name: str) -> Driver | None:
        return next((d for d in self.drivers if d.name == name), None)

    def hardware(self) -> tuple[list[Any], str]:
        records, hardware_digest, _ = self.snapshot()
        return records, hardware_digest

    def snapshot(self) -> tuple[list[Any], str, int]:
        """The records, their digest and the discovery count, read together: a hello never
        pairs a discovery's count with the hardware of an earlier one."""
        with self._lock:
            records = [r for rs in self._records.values() for r in rs]
            records += [r for ext in self.external.values() for r in ext.records]
            count = self.discoveries
        return records, digest(records), count

    def client(self, endpoint: str, timeout: float = 30.0) -> InternalClient:
        url = internal_url(self.conf, endpoint)
        # A driver process that never answers, or trickles, holds no agent thread past
        # ``timeout`` in all (acceld.clients.deadline).
        return InternalClient(url, self.signer, timeout=(min(5.0, timeout), timeout),
                              verify=tls_verify(self.conf),
                              destination=driver_destination(endpoint), deadline=timeout)

    # Discovery

    def discover(self) -> bool:
        """Rescan in-process drivers, ask external ones to rescan; True if hardware changed."""
        with self._discovering:
            _, before = self.hardware()
            for driver in self.drivers:
                try:
                    records = [r.to_dict() for r in metrics.discover(driver)]
                except Exception as exc:  # noqa: BLE001 - one driver must not stop the others
                    LOG.warning("Driver %s failed to discover (its last report is kept): %s",
                                driver.name, exc)
                    continue
                with self._lock:
                    self._records[driver.name] = records
            for ext in list(self.external.values()):
                self._call_external(ext, "POST", "/discovery", {})
            self._expire_external()
            with self._lock:
                self.discoveries += 1
            _, after = self.hardware()
        if after != before and self.hello is not None:
            self.hello.wake()
        return after != before

    def discover_in_background(self) -> None:
        threading.Thread(target=self.discover, name="discovery", daemon=True).start()

    def _call_external(self, ext: ExternalDriver, method: str, path: str,
                       body: Any = None) -> Any:
        client = self.client(ext.endpoint)
        try:
            return client.call(method, path, body)
        except (InternalError, requests.RequestException) as exc:
            LOG.warning("Driver process at %s: %s %s failed: %s", ext.endpoint, method, path,
                        exc)
            return None
        finally:
            client.close()

    def _expire_external(self) -> None:
        limit = self.conf.agent.heartbeat_interval * self.conf.conductor.agent_down_intervals
        now = time.monotonic()
        with self._lock:
            for endpoint, ext in list(self.external.items()):
                if now - ext.last_hello > limit:
                    LOG.warning("Driver process %s at %s silent for %.0f s: its hardware is "
                                "dropped", ext.name or ext.type, endpoint, now - ext.last_hello)
                    del self.external[endpoint]

    def pull_external(self, ext: ExternalDriver) -> None:
        answer = self._call_external(ext, "GET", "/hardware")
        if not isinstance(answer, dict) or not isinstance(answer.get("hardware"), list):
            raise falcon.HTTPBadGateway(description=f"GET /hardware of {ext.endpoint} gave no "
                                                    "hardware list")
        _, before = self.hardware()
        with self._lock:
            ext.records = answer["hardware"]
            ext.digest = answer.get("digest")
        if self.hardware()[1] != before and self.hello is not None:
            self.hello.wake()

    # Routes

    def routes(self) -> Routes:
        routes: Routes = {
            "/hello": {"POST": self.on_driver_hello},
            "/discovery": {"POST": self.on_discovery},
            "/hardware": {"GET": self.on_hardware},
        }
        for factory in ROUTE_FACTORIES:
            routes.update(factory(self))
        return routes

    def on_driver_hello(self, req: falcon.Request, resp: falcon.Response) -> None:
        body = json_body(req)
        error = next(iter(DRIVER_HELLO.iter_errors(body)), None)
        if error is not None:
            raise falcon.HTTPBadRequest(description=f"Invalid driver hello: {error.message}")
        try:
            agreed = versions.agree(body)
        except versions.Unsupported as exc:
            raise falcon.HTTPBadRequest(description=str(exc)) from None
        endpoint = body["endpoint"]
        with self._lock:
            ext = self.external.get(endpoint)
            if ext is None:
                ext = self.external[endpoint] = ExternalDriver(
                    endpoint, body["type"], body.get("name"), time.monotonic())
                LOG.info("Driver process %s (%s) registered from %s", body.get("name", "?"),
                         body["type"], endpoint)
            ext.last_hello = time.monotonic()
            stale = body.get("hardware_digest") is None or \
                body.get("hardware_digest") != ext.digest
        if stale:
            self.pull_external(ext)
        respond(resp, versions.answer(body, agreed, {
            "status": "OK", "heartbeat_interval": self.conf.agent.heartbeat_interval}))

    def on_discovery(self, req: falcon.Request, resp: falcon.Response) -> None:
        self.discover_in_background()
        respond(resp, {"status": "IN-PROGRESS"}, status=202)

    def on_hardware(self, req: falcon.Request, resp: falcon.Response) -> None:
        records, hardware_digest = self.hardware()
        respond(resp, {"hardware": records, "digest": hardware_digest})

    # Lifecycle

    def endpoint(self) -> str:
        assert self.server is not None
        if self.conf.agent.advertise_endpoint:
            return self.conf.agent.advertise_endpoint
        return advertised_endpoint(self.conf, self.conf.agent.host_ip, self.server.port)

    def hello_body(self) -> dict[str, Any]:
        _, hardware_digest, discoveries = self.snapshot()
        return {"status": "READY", "endpoint": self.endpoint(), "hostname": self.hostname,
                "heartbeat_interval": self.conf.agent.heartbeat_interval,
                "hardware_digest": hardware_digest, "discovery": discoveries,
                "drivers": [d.name for d in self.drivers]}

    def start(self) -> "Agent":
        # Named by its node; no database here, so credentials made before this start are
        # refused (what the previous process accepted cannot be replayed to this one).
        self.server = serve(self.conf, self.keys, self.routes(), self.conf.agent.host_ip,
                            self.conf.agent.port, destination=agent_destination(self.hostname),
                            not_before=start_stamp())
        self.discover()
        # Any conductor serves the hello; the client spreads agents over [conductor] url
        # and fails over when its conductor stops answering (acceld.clients.conductor).
        timeouts = hello_timeouts(self.conf)
        client = failover_client(self.conf, self.signer, prefer=self.hostname,
                                 timeout=timeouts.answer, connect_timeout=timeouts.connect)
        self.hello = HelloLoop(ConductorHellos(client, timeouts),  # type: ignore[arg-type]
                               self.conf.agent.heartbeat_interval, self.hello_body,
                               f"conductor {','.join(client.urls)}")
        self.hello.start()
        self._threads.append(repeat_until_stopped(
            self._stop, lambda: self.conf.agent.discovery_interval, self.discover,
            "discovery-loop"))
        # Host steps acceld made here that no ARQ uses (orphaned mdevs): reported to the
        # conductor now and every discovery interval (acceld.agent.host_steps.HostStepAudit).
        from acceld.agent.host_steps import start_host_step_audit

        self._threads.append(start_host_step_audit(self))
        LOG.info("Agent of host %s listening on %s with drivers %s", self.hostname,
                 self.server.url, ", ".join(d.name for d in self.drivers) or "none")
        return self

    def stop(self) -> None:
        self._stop.set()
        if self.hello:
            self.hello.stop()
        if self.server:
            self.server.stop()
        for thread in self._threads:
            thread.join(timeout=5)

    def wait(self) -> None:
        run_until_signalled(self._stop, self.stop, conf=self.conf)


# Extra internal routes of the agent, each factory taking the Agent and returning
# {path: {method: handler}} (programming, attach-handle preparation, ...).
ROUTE_FACTORIES: list[Callable[[Agent], Routes]] = []


def _programming(agent: Agent) -> Routes:
    from acceld.agent.programming import agent_routes

    return agent_routes(agent)


ROUTE_FACTORIES.append(_programming)


def _attach_handles(agent: Agent) -> Routes:
    from acceld.agent.attach import agent_routes

    return agent_routes(agent)


ROUTE_FACTORIES.append(_attach_handles)


def _version(agent: Agent) -> Routes:
    from acceld.agent.version_route import agent_routes

    return agent_routes(agent)


ROUTE_FACTORIES.append(_version)


def run(conf: cfg.ConfigOpts) -> None:
    catch_hup_early()
    serve_metrics(conf, "agent")
    Agent(conf).start().wait()
