"""The agent's attach-handle routes: prepare a handle before a bind, release it after.

``POST /attach-handles/prepare`` and ``POST /attach-handles/release``, from the
conductor, body ``{"driver_name", "deployable_name", "attach_type",
"attach_info"}``: the deployable's driver (by its ``driver_name``) is asked to
``prepare_attach_handle`` (e.g. create the vGPU mdev) or
``release_attach_handle`` (remove it). Both are idempotent in the drivers:
preparing a prepared handle, or releasing a released one, succeeds. Steps on
one handle are serialised here.

Answers: 200 ``{"attach_type", "attach_info"}`` (prepare; the info as the
driver returned it) or ``{"released": true}``; 400 for a malformed request or
a driver that does not support the step; 502 when the driver failed; 503 when
the driver is not loaded in this agent.
"""

from __future__ import annotations

import logging
import threading
from typing import Any, Callable

import falcon
import requests

from acceld.clients.conductor import conductor_url
from acceld.clients.internal import InternalClient, InternalError, tls_verify
from acceld.internal.auth import CONDUCTOR
from acceld.drivers.base import ATTACH_TYPES, AttachHandle, Driver, DriverError, NotSupported
from acceld.internal.server import json_body, respond

LOG = logging.getLogger(__name__)

_FIELDS = ("driver_name", "deployable_name", "attach_type", "attach_info")


class AttachFailed(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


class AttachSteps:
    """Runs drivers' prepare/release steps. ``find_driver(name)`` returns a loaded driver or
    None."""

    def __init__(self, find_driver: Callable[[str], Driver | None], hostname: str) -> None:
        self.find_driver = find_driver
        self.hostname = hostname
        self._guard = threading.Lock()
        self._locks: dict[str, threading.Lock] = {}

    def _lock(self, key: str) -> threading.Lock:
        with self._guard:
            return self._locks.setdefault(key, threading.Lock())

    def run(self, step: str, request: Any) -> dict[str, Any]:
        driver_name, deployable, handle = _parse(request)
        driver = self.find_driver(driver_name)
        if driver is None:
            raise AttachFailed(503, f"Driver {driver_name} is not loaded on host "
                                    f"{self.hostname}; the attach handle of deployable "
                                    f"{deployable} cannot be {step}d here.")
        key = f"{driver_name}/{handle.attach_type}/{sorted(handle.attach_info.items())}"
        with self._lock(key):
            try:
                if step == "prepare":
                    done = driver.prepare_attach_handle(handle)
                    LOG.info("Prepared %s attach handle %s of %s (driver %s)",
                             handle.attach_type, handle.attach_info, deployable, driver_name)
                    return {"attach_type": done.attach_type, "attach_info": done.attach_info}
                driver.release_attach_handle(handle)
                LOG.info("Released %s attach handle %s of %s (driver %s)", handle.attach_type,
                         handle.attach_info, deployable, driver_name)
                return {"released": True}
            except NotSupported as exc:
                raise AttachFailed(400, f"Deployable {deployable}: {exc}") from None
            except DriverError as exc:
                raise AttachFailed(502, f"Driver {driver_name} failed to {step} the "
                                        f"{handle.attach_type} attach handle of {deployable}: "
                                        f"{exc}") from None
            except Exception as exc:  # noqa: BLE001 - a driver bug: report it, keep serving
                LOG.exception("Driver %s raised in %s_attach_handle", driver_name, step)
                raise AttachFailed(502, f"Driver {driver_name} failed unexpectedly to {step} "
                                        f"the attach handle of {deployable}: "
                                        f"{exc.__class__.__name__}: {exc}") from None

    def routes(self) -> dict:
        return {"/attach-handles/prepare": {"POST": self.on_prepare},
                "/attach-handles/release": {"POST": self.on_release}}

    def on_prepare(self, req: falcon.Request, resp: falcon.Response) -> None:
        self._answer(req, resp, "prepare")

    def on_release(self, req: falcon.Request, resp: falcon.Response) -> None:
        self._answer(req, resp, "release")

    def _answer(self, req: falcon.Request, resp: falcon.Response, step: str) -> None:
        try:
            answer = self.run(step, json_body(req))
        except AttachFailed as exc:
            raise falcon.HTTPError(exc.status, description=exc.message) from None
        respond(resp, answer)


def _parse(request: Any) -> tuple[str, str, AttachHandle]:
    if not isinstance(request, dict):
        raise AttachFailed(400, "Expected a JSON object.")
    unknown = set(request) - set(_FIELDS)
    if unknown:
        raise AttachFailed(400, f"Unknown keys: {', '.join(sorted(unknown))}.")
    for name in ("driver_name", "deployable_name"):
        value = request.get(name)
        if not isinstance(value, str) or not value or len(value) > 255:
            raise AttachFailed(400, f"{name} is required (a string of 1 to 255 characters).")
    attach_type, info = request.get("attach_type"), request.get("attach_info")
    if attach_type not in ATTACH_TYPES:
        raise AttachFailed(400, f"attach_type must be one of {', '.join(ATTACH_TYPES)}.")
    if not isinstance(info, dict) or not info or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in info.items()):
        raise AttachFailed(400, "attach_info must be a non-empty object of strings.")
    return (request["driver_name"], request["deployable_name"],
            AttachHandle(attach_type=attach_type, attach_info=dict(info)))


def agent_routes(agent: Any) -> dict:
    """The agent's route factory (acceld.agent.service.ROUTE_FACTORIES): in-process drivers."""
    return AttachSteps(agent.find_driver, agent.hostname).routes()


# Orphans: host-step resources that no handle in use accounts for.

def host_steps(drivers: list[Driver]) -> list[dict[str, Any]]:
    """Every host-step resource the in-process drivers made and that exists now
    (:meth:`acceld.drivers.base.Driver.prepared_attach_handles`), in the report's shape."""
    found: list[dict[str, Any]] = []
    for driver in drivers:
        try:
            handles = driver.prepared_attach_handles()
        except Exception as exc:  # noqa: BLE001 - one driver must not stop the others
            LOG.warning("Driver %s could not list the attach handles it prepared: %s",
                        driver.name, exc)
            continue
        found += [{"driver_name": driver.name, "attach_type": h.attach_type,
                   "attach_info": dict(h.attach_info)} for h in handles]
    return found


class HostStepAudit:
    """At start and every ``[agent] discovery_interval``: report the host-step resources
    acceld made on this node to the conductor (``POST /attach-handles/host-steps``).

    The agent does not decide what is an orphan: only the database knows which handles
    are in use. The conductor queues a release for each reported resource whose handle is
    free, and its release worker calls this agent's ``/attach-handles/release`` for it.
    """

    def __init__(self, agent: Any, client: Any) -> None:
        self.agent = agent
        self.client = client
        self._last: tuple[int, int] | None = None

    def once(self) -> dict[str, Any] | None:
        """One report; the conductor's answer, or None when it could not be sent."""
        steps = host_steps(self.agent.drivers)
        if not steps:
            return {"queued": [], "in_use": 0, "unknown": 0}  # nothing to ask about
        try:
            answer = self.client.call("POST", "/attach-handles/host-steps",
                                      {"host_steps": steps}, timeout=60)
        except (InternalError, requests.RequestException) as exc:
            LOG.warning("Could not report this node's %d prepared attach handle(s) to the "
                        "conductor (retried in %s s): %s", len(steps),
                        self.agent.conf.agent.discovery_interval, exc)
            return None
        if isinstance(answer, dict) and answer.get("queued"):
            LOG.warning("The conductor queued the release of %d orphaned attach handle(s) "
                        "of this node (prepared here, used by no ARQ): %s",
                        len(answer["queued"]), ", ".join(answer["queued"]))
        return answer

    def start(self, stop: threading.Event, interval: Callable[[], float]) -> threading.Thread:
        def loop() -> None:
            while True:
                try:
                    self.once()
                except Exception:  # noqa: BLE001 - keep the loop alive
                    LOG.exception("Host-step audit failed; retried at the next interval")
                if stop.wait(interval()):
                    return

        thread = threading.Thread(target=loop, name="host-step-audit", daemon=True)
        thread.start()
        return thread


def start_host_step_audit(agent: Any) -> threading.Thread:
    """The agent's audit loop (called from :meth:`acceld.agent.service.Agent.start`)."""
    client = InternalClient(conductor_url(agent.conf), agent.signer, timeout=60,
                            verify=tls_verify(agent.conf), destination=CONDUCTOR)
    audit = HostStepAudit(agent, client)
    agent.host_step_audit = audit
    return audit.start(agent._stop, lambda: agent.conf.agent.discovery_interval)
