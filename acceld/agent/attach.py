"""The agent's attach-handle routes: prepare a handle before a bind, release it after.

``POST /attach-handles/prepare`` and ``POST /attach-handles/release``, from the
conductor, body ``{"driver_name", "deployable_name", "attach_type",
"attach_info"}``: the deployable's driver (by its ``driver_name``) is asked to
``prepare_attach_handle`` (e.g. create the vGPU mdev) or
``release_attach_handle`` (remove it). Both are idempotent in the drivers:
preparing a prepared handle, or releasing a released one, succeeds. Steps on
one handle are serialised here, and recorded in the agent's host-step journal
(acceld.agent.host_steps): before a prepare, until its release succeeded.

Fencing (acceld.agent.fences): a conductor from this release adds ``"handle_uuid"`` and
``"fence_token"`` (the token its claim took on the handle row), and a prepare also
``"deployable_uuid"`` and ``"deployable_fence"`` (the deployable's token as the bind read
it). A token older than the lowest this agent still accepts for the handle is refused with
409 before the driver is asked anything; the store is written durably first. A request
without them (an older conductor) is not fenced, unless a request with them reached the same
handle before (or, for its deployable, a program): then it is refused with 409 too.

Answers: 200 ``{"attach_type", "attach_info"}`` (prepare; the info as the
driver returned it) or ``{"released": true}``; 400 for a malformed request or
a driver that does not support the step; 409 fenced (the message begins
``Fenced:``); 502 when the driver failed or the fence store could not be
written; 503 when the driver is not loaded in this agent.
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass
from typing import Any, Callable

import falcon

from acceld.agent.fences import (Fenced, FenceStore, FenceStoreError, handle_key,
                                 is_uuid, local_key, raise_program_floor, valid_bind_token,
                                 valid_token)
from acceld.agent.host_steps import HostStepJournal
from acceld.drivers.base import ATTACH_TYPES, AttachHandle, Driver, DriverError, NotSupported
from acceld.internal.server import json_body, respond

LOG = logging.getLogger(__name__)

_FIELDS = ("driver_name", "deployable_name", "attach_type", "attach_info")
# Sent by conductors that fence their calls (optional: older conductors send none).
_FENCE_FIELDS = ("handle_uuid", "fence_token", "deployable_uuid", "deployable_fence")


@dataclass(frozen=True)
class Fence:
    """A request's fencing tokens: the handle's, and (prepare) the deployable's floor."""

    handle_uuid: str
    token: int
    deployable_uuid: str | None = None
    deployable_token: int | None = None


class AttachFailed(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


class AttachSteps:
    """Runs drivers' prepare/release steps. ``find_driver(name)`` returns a loaded driver or
    None."""

    def __init__(self, find_driver: Callable[[str], Driver | None], hostname: str,
                 journal: HostStepJournal | None = None,
                 fences: FenceStore | None = None) -> None:
        self.find_driver = find_driver
        self.hostname = hostname
        self.journal = journal
        # None: nothing is fenced (tests of the steps alone).
        self.fences = fences
        self._guard = threading.Lock()
        self._locks: dict[str, threading.Lock] = {}

    def _lock(self, key: str) -> threading.Lock:
        with self._guard:
            return self._locks.setdefault(key, threading.Lock())

    def run(self, step: str, request: Any) -> dict[str, Any]:
        driver_name, deployable, handle = _parse(request)
        fence = _fence(request, step)
        driver = self.find_driver(driver_name)
        if driver is None:
            raise AttachFailed(503, f"Driver {driver_name} is not loaded on host "
                                    f"{self.hostname}; the attach handle of deployable "
                                    f"{deployable} cannot be {step}d here.")
        key = f"{driver_name}/{handle.attach_type}/{sorted(handle.attach_info.items())}"
        with self._lock(key):
            self._admit(fence, step, deployable, key, driver_name)
            try:
                if step == "prepare":
                    done = self._prepare(driver, driver_name, handle)
                    LOG.info("Prepared %s attach handle %s of %s (driver %s)",
                             handle.attach_type, handle.attach_info, deployable, driver_name)
                    return {"attach_type": done.attach_type, "attach_info": done.attach_info}
                driver.release_attach_handle(handle)
                if self.journal is not None:
                    self.journal.forget(driver_name, handle)
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

    def _admit(self, fence: Fence | None, step: str, deployable: str, local: str,
               driver_name: str) -> None:
        """Under the handle's lock, before the driver: refuse an older token (409), record
        a newer one durably. A prepare also raises the deployable's floor: the bind that
        sends it took the handle while no program held the deployable. A token-less call is
        refused for a handle (``local``: as this agent names it) that a token reached."""
        if self.fences is None:
            return
        what = f"The {step} of attach handle {fence.handle_uuid if fence else local} of " \
               f"{deployable}"
        try:
            if fence is None:
                self.fences.admit_untokened(local_key(local), what)
                return
            self.fences.mark_fenced(local_key(local))
            self.fences.admit(handle_key(fence.handle_uuid), fence.token, what)
            if fence.deployable_uuid is not None and fence.deployable_token is not None:
                raise_program_floor(self.fences, driver_name, deployable,
                                    fence.deployable_uuid, fence.deployable_token + 1)
        except Fenced as exc:
            LOG.warning("%s", exc)
            raise AttachFailed(409, str(exc)) from None
        except FenceStoreError as exc:
            LOG.error("Attach handle of %s not %sd: %s", deployable, step, exc)
            raise AttachFailed(502, f"The agent of host {self.hostname} did not {step} the "
                                    f"attach handle of {deployable}: {exc}.") from None

    def _prepare(self, driver: Driver, driver_name: str, handle: AttachHandle) -> AttachHandle:
        """The driver's prepare, journaled first: without the record, a step the driver
        cannot mark as acceld's could never be found again as an orphan. A refused first
        prepare leaves nothing, so its record goes; an earlier prepare's record stays."""
        if self.journal is None:
            return driver.prepare_attach_handle(handle)
        try:
            first = self.journal.record(driver_name, handle)
        except OSError as exc:
            raise DriverError(f"the agent could not record the host step in "
                              f"{self.journal.directory}: {exc}") from None
        try:
            return driver.prepare_attach_handle(handle)
        except (NotSupported, DriverError):
            if first:
                self.journal.forget(driver_name, handle)
            raise

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
    unknown = set(request) - set(_FIELDS) - set(_FENCE_FIELDS)
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


def _fence(request: dict, step: str) -> Fence | None:
    """The request's fencing tokens, or None when it carries none (an older conductor)."""
    if not any(name in request for name in _FENCE_FIELDS):
        return None
    handle_uuid, token = request.get("handle_uuid"), request.get("fence_token")
    if not is_uuid(handle_uuid) or not valid_token(token):
        raise AttachFailed(400, "handle_uuid (a UUID) and fence_token (an integer from 0 to "
                                "2^63-1) go together.")
    dep_uuid, dep_token = request.get("deployable_uuid"), request.get("deployable_fence")
    if dep_uuid is None and dep_token is None:
        return Fence(handle_uuid, token)
    if step != "prepare" or not is_uuid(dep_uuid) or not valid_bind_token(dep_token):
        raise AttachFailed(400, "deployable_uuid (a UUID) and deployable_fence (an integer "
                                "from 0 to 2^63-2) go together, on a prepare only.")
    return Fence(handle_uuid, token, dep_uuid, dep_token)


def agent_routes(agent: Any) -> dict:
    """The agent's route factory (acceld.agent.service.ROUTE_FACTORIES): in-process drivers,
    their steps journaled and fenced under ``state_path`` (acceld.agent.host_steps,
    acceld.agent.fences)."""
    return AttachSteps(agent.find_driver, agent.hostname,
                       HostStepJournal.for_agent(agent.conf, agent.hostname),
                       FenceStore.for_agent(agent.conf, agent.hostname)).routes()

