"""`acceld driver NAME`: any installed driver as its own process, speaking the seed's Driver API.

- ``POST /discovery``: 202 ``{"status": "IN-PROGRESS"}``; the driver rescans in
  the background and, if its hardware changed, says hello to its agent at once.
- ``GET /hardware``: ``{"hardware": [...], "digest": "..."}``.
- More routes come from :data:`ROUTE_FACTORIES`.

It registers with its agent (``[driver] agent_url``) by ``POST /hello``
``{"status": "READY", "endpoint": "host:port", "type": "FPGA", "name": NAME,
"hardware_digest": ...}``, and repeats that hello every heartbeat interval so
that a restarted agent learns of it again.
"""

from __future__ import annotations

import logging
import threading
from typing import Any, Callable

import falcon
from oslo_config import cfg

from acceld.agent.hardware import HelloLoop, digest
from acceld.clients.internal import scheme
from acceld.drivers import loader
from acceld.drivers.base import Driver
from acceld.internal.server import Handler, InternalServer, advertised_endpoint, respond, serve
from acceld.runtime.lifecycle import (announce, catch_hup_early, repeat_until_stopped,
                                      run_until_signalled, start_stamp)
from acceld.internal.auth import NodeKeys, Signer, agent_destination, driver_destination
from acceld.runtime.secrets import own_node_key

LOG = logging.getLogger(__name__)

Routes = dict[str, dict[str, Handler]]


def agent_url(conf: cfg.ConfigOpts) -> str:
    return conf.driver.agent_url or f"{scheme(conf)}://{conf.agent.host_ip}:{conf.agent.port}"


class DriverProcess:
    def __init__(self, conf: cfg.ConfigOpts, name: str, hostname: str | None = None,
                 driver: Driver | None = None) -> None:
        self.conf = conf
        self.hostname = hostname or conf.host
        self.driver = driver if driver is not None else loader.load(name, conf, self.hostname)
        # A driver process speaks for its node, with the node's key (as its agent does).
        key = own_node_key(conf, self.hostname)
        self.signer = Signer(key.key, self.hostname, key.generation)
        self.keys = NodeKeys(self.hostname, key.key, key.generation)
        self._lock = threading.Lock()
        self._discovering = threading.Lock()
        self._records: list[Any] = []
        self._stop = threading.Event()
        self.server: InternalServer | None = None
        self.hello: HelloLoop | None = None

    def hardware(self) -> tuple[list[Any], str]:
        with self._lock:
            records = list(self._records)
        return records, digest(records)

    def discover(self) -> bool:
        with self._discovering:
            try:
                records = [r.to_dict() for r in self.driver.discover()]
            except Exception as exc:  # noqa: BLE001 - keep serving the last good report
                LOG.warning("Driver %s failed to discover (its last report is kept): %s",
                            self.driver.name, exc)
                return False
            with self._lock:
                changed = records != self._records
                self._records = records
        if changed and self.hello is not None:
            self.hello.wake()
        return changed

    def routes(self) -> Routes:
        routes: Routes = {"/discovery": {"POST": self.on_discovery},
                          "/hardware": {"GET": self.on_hardware}}
        for factory in ROUTE_FACTORIES:
            routes.update(factory(self))
        return routes

    def on_discovery(self, req: falcon.Request, resp: falcon.Response) -> None:
        threading.Thread(target=self.discover, name="discovery", daemon=True).start()
        respond(resp, {"status": "IN-PROGRESS"}, status=202)

    def on_hardware(self, req: falcon.Request, resp: falcon.Response) -> None:
        records, hardware_digest = self.hardware()
        respond(resp, {"hardware": records, "digest": hardware_digest})

    def endpoint(self) -> str:
        assert self.server is not None
        return advertised_endpoint(self.conf, self.conf.driver.host_ip, self.server.port)

    def hello_body(self) -> dict[str, Any]:
        return {"status": "READY", "endpoint": self.endpoint(),
                "type": self.driver.hardware_type, "name": self.driver.name,
                "hardware_digest": self.hardware()[1]}

    def start(self) -> "DriverProcess":
        # Named by the endpoint it advertises to its agent; no database here, so
        # credentials made before this start are refused.
        host_ip = self.conf.driver.host_ip
        self.server = serve(self.conf, self.keys, self.routes(), host_ip,
                            self.conf.driver.port,
                            destination=lambda port: driver_destination(
                                advertised_endpoint(self.conf, host_ip, port)),
                            not_before=start_stamp())
        self.discover()
        url = agent_url(self.conf)
        self.hello = HelloLoop.to_peer(self.conf, self.signer, url, self.hello_body,
                                       f"agent {url}", agent_destination(self.hostname))
        self.hello.start()
        repeat_until_stopped(self._stop, lambda: self.conf.agent.discovery_interval,
                             self.discover, "discovery-loop")
        LOG.info("Driver %s listening on %s, registering with %s", self.driver.name,
                 self.server.url, url)
        return self

    def stop(self) -> None:
        self._stop.set()
        if self.hello:
            self.hello.stop()
        if self.server:
            self.server.stop()

    def wait(self) -> None:
        run_until_signalled(self._stop, self.stop, conf=self.conf)


# Extra routes of a driver process (e.g. programming), each factory taking the DriverProcess.
ROUTE_FACTORIES: list[Callable[[DriverProcess], Routes]] = []


def run(conf: cfg.ConfigOpts, name: str) -> None:
    catch_hup_early()
    process = DriverProcess(conf, name).start()
    announce(f"acceld driver {name}: {process.server.url}")  # type: ignore[union-attr]
    process.wait()
