"""The agent's programming route: fetch an image, hand it to the deployable's driver.

``POST /program`` ``{"driver_name", "deployable_name", "kind", "image_id" |
"function_id"}`` (from the conductor) resolves a function id to an image id,
gets the image from the node's image source (acceld.agent.images), and calls
``driver.program(deployable_name, path, kind)``; ``POST /images/resolve``
``{"function_id"}`` answers the image id a function id stands for; ``POST
/deployables/fence`` ``{"driver_name", "deployable_name", "deployable_uuid",
"deployable_fence"}`` (a bind of a handle with no host step) refuses from then on every
program up to that token (see Fencing). Programs of one deployable
are serialised by a lock per deployable (the conductor also holds a database
lease); the answer is ``{"image_id": ...}`` once the driver returned.

Fencing (acceld.agent.fences): a conductor from this release adds ``"deployable_uuid"`` and
``"fence_token"`` (the token its programming mark took on the deployable row). Once the
image is at hand, right before the driver writes, a token older than the lowest this agent
still accepts for the deployable (raised by a newer program, or by a bind of one of its
handles: an mdev prepare, or ``POST /deployables/fence`` for a handle with no host step) is
refused with 409 ``Fenced: ...`` and the device is not written; a newer one is recorded
durably first, and the deployable's fence lock is held until the driver returned, so a
bind's fence either comes first (the program is refused) or waits for the write to end.
"For the deployable" means two keys: the row's uuid and the device as this agent names it
(driver and name), so that a row of the same device discovered again after its host was
re-registered (a new uuid) refuses what an earlier row's stalled conductor still sends. A
request without them (an older conductor) is not fenced, unless a request with them (a
program, or a prepare of one of its handles) reached the same deployable before: then it is
refused with 409 too.

Statuses: 400 for what the client can fix (unknown image, a driver that cannot
program that kind of image), 409 when an earlier program of the deployable
did not finish in time or the request is fenced, 502 when the driver or the image service failed, 503
when the driver is not loaded here or the image service is unreachable.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from typing import Any, Callable, Iterator

import falcon
from oslo_config import cfg

from acceld.agent import images
from acceld.agent.fences import (Fenced, FenceStore, FenceStoreError, deployable_key,
                                 is_uuid, local_key, program_identity, raise_program_floor,
                                 valid_bind_token, valid_token)
from acceld.drivers.base import Driver, DriverError, NotSupported
from acceld.internal.server import json_body, respond

LOG = logging.getLogger(__name__)

KINDS = ("bitstream", "firmware")


class ProgramFailed(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


class DeployableLocks:
    """One lock per (driver, deployable): a second program waits for the first."""

    def __init__(self) -> None:
        self._guard = threading.Lock()
        self._locks: dict[tuple[str, str], threading.Lock] = {}

    def get(self, driver_name: str, deployable_name: str) -> threading.Lock:
        with self._guard:
            return self._locks.setdefault((driver_name, deployable_name), threading.Lock())


class Programming:
    """Programs deployables of this node's drivers. ``find_driver(name)`` returns a loaded
    driver or None."""

    def __init__(self, conf: cfg.ConfigOpts, find_driver: Callable[[str], Driver | None],
                 source: images.ImageSource | None = None,
                 after_program: Callable[[], None] | None = None,
                 fences: FenceStore | None = None) -> None:
        self.conf = conf
        self.fences = fences  # None: nothing is fenced
        self.find_driver = find_driver
        self.source = source if source is not None else images.from_config(conf)
        self.locks = DeployableLocks()
        # Called after a successful program: a new bitstream may change what the driver reports.
        self.after_program = after_program

    def program(self, request: Any) -> dict[str, str]:
        driver_name, name, kind, image_id, function_id = _parse(request)
        fence = _fence(request)
        driver = self.find_driver(driver_name)
        if driver is None:
            raise ProgramFailed(503, f"Driver {driver_name} is not loaded on host "
                                     f"{self.conf.host}; deployable {name} cannot be "
                                     "programmed here.")
        lock = self.locks.get(driver_name, name)
        timeout = float(self.conf.conductor.program_timeout)
        if not lock.acquire(timeout=timeout):
            raise ProgramFailed(409, f"Deployable {name} is still being programmed by an "
                                     "earlier request; try again.")
        try:
            try:
                if function_id is not None:
                    image_id = self.source.find_by_function(function_id)
                with self.source.open(image_id) as path, \
                        self._admitted(fence, driver_name, name):
                    LOG.info("Programming %s %s into %s (driver %s)", kind, image_id, name,
                             driver_name)
                    driver.program(name, path, kind)
            except ProgramFailed:  # fenced, or the fence store failed: nothing written
                raise
            except images.ImageError as exc:
                raise ProgramFailed(exc.status, exc.message) from None
            except NotSupported as exc:
                raise ProgramFailed(400, f"Deployable {name}: {exc}") from None
            except DriverError as exc:
                raise ProgramFailed(502, f"Driver {driver_name} failed to program {kind} "
                                         f"{image_id} into {name}: {exc}") from None
            except Exception as exc:  # noqa: BLE001 - a driver bug: report it, keep serving
                LOG.exception("Driver %s raised while programming %s", driver_name, name)
                raise ProgramFailed(502, f"Driver {driver_name} failed unexpectedly while "
                                         f"programming {name}: {exc.__class__.__name__}: "
                                         f"{exc}") from None
        finally:
            lock.release()
        if self.after_program is not None:
            self.after_program()
        return {"image_id": image_id, "kind": kind}

    @contextlib.contextmanager
    def _admitted(self, fence: tuple[str, int] | None, driver_name: str,
                  name: str) -> Iterator[None]:
        """Right before the write, with the image at hand: refuse an older token (409),
        record a newer one durably (502 when it cannot be), and hold the deployable's fence
        lock around the write (a bind's fence waits for it: :meth:`fence`); refuse a
        token-less request for a deployable a token reached."""
        if self.fences is None:
            yield
            return
        local = local_key(program_identity(driver_name, name))
        with contextlib.ExitStack() as held:
            try:
                if fence is None:
                    self.fences.admit_untokened(local, f"The program of deployable {name}")
                else:  # the device, and the row: a re-registered device is a new row
                    held.enter_context(self.fences.holding(
                        (local, deployable_key(fence[0])), fence[1],
                        f"The program of deployable {name} ({fence[0]})"))
            except Fenced as exc:
                LOG.warning("%s", exc)
                raise ProgramFailed(409, str(exc)) from None
            except FenceStoreError as exc:
                LOG.error("Deployable %s not programmed: %s", name, exc)
                raise ProgramFailed(502, f"Deployable {name} was not programmed: "
                                         f"{exc}.") from None
            yield

    def fence(self, request: Any) -> dict[str, bool]:
        """A bind of one of the deployable's handles with no host step (PCI) read its token
        *m*: every program up to *m* has ended or is stale, and is refused from now on. Waits
        for a program writing the device now (its fence lock). ``by_device``: the device's
        floor was raised too (an agent of the release before answers without it, and the
        conductor then does not count the row as told)."""
        driver_name, name, dep_uuid, token = _parse_fence(request)
        if self.fences is None:
            return {"fenced": False}
        try:
            raise_program_floor(self.fences, driver_name, name, dep_uuid, token + 1)
        except FenceStoreError as exc:
            LOG.error("Deployable %s not fenced: %s", name, exc)
            raise ProgramFailed(502, f"Deployable {name} was not fenced: {exc}.") from None
        return {"fenced": True, "by_device": True}

    def resolve(self, request: Any) -> dict[str, str]:
        """The image id an ``accel:function_id`` stands for on this node (binding asks first,
        so that it programs only when the deployable holds another image)."""
        function_id = request.get("function_id") if isinstance(request, dict) else None
        if not isinstance(function_id, str) or not function_id or len(function_id) > 255:
            raise ProgramFailed(400, "function_id must be a non-empty string.")
        try:
            return {"image_id": self.source.find_by_function(function_id)}
        except images.ImageError as exc:
            raise ProgramFailed(exc.status, exc.message) from None

    def routes(self) -> dict:
        return {"/program": {"POST": self.on_program},
                "/images/resolve": {"POST": self.on_resolve},
                "/deployables/fence": {"POST": self.on_fence}}

    def on_fence(self, req: falcon.Request, resp: falcon.Response) -> None:
        _serve(self.fence, req, resp)

    def on_resolve(self, req: falcon.Request, resp: falcon.Response) -> None:
        _serve(self.resolve, req, resp)

    def on_program(self, req: falcon.Request, resp: falcon.Response) -> None:
        _serve(self.program, req, resp)


def _serve(handler: Callable[[Any], dict], req: falcon.Request,
           resp: falcon.Response) -> None:
    """``handler``'s answer to the request's JSON body; a ProgramFailed its status."""
    try:
        answer = handler(json_body(req))
    except ProgramFailed as exc:
        raise falcon.HTTPError(exc.status, description=exc.message) from None
    respond(resp, answer)


def _parse(request: Any) -> tuple[str, str, str, str | None, str | None]:
    if not isinstance(request, dict):
        raise ProgramFailed(400, "Expected a JSON object.")
    unknown = set(request) - {"driver_name", "deployable_name", "kind", "image_id",
                              "function_id", "deployable_uuid", "fence_token"}
    if unknown:
        raise ProgramFailed(400, f"Unknown keys: {', '.join(sorted(unknown))}.")
    driver_name, name = request.get("driver_name"), request.get("deployable_name")
    kind = request.get("kind", "bitstream")
    if not isinstance(driver_name, str) or not driver_name:
        raise ProgramFailed(400, "driver_name is required.")
    if not isinstance(name, str) or not name:
        raise ProgramFailed(400, "deployable_name is required.")
    if kind not in KINDS:
        raise ProgramFailed(400, f"kind must be one of {', '.join(KINDS)}.")
    image_id, function_id = request.get("image_id"), request.get("function_id")
    if (image_id is None) == (function_id is None):
        raise ProgramFailed(400, "Name exactly one of image_id and function_id.")
    if image_id is not None:
        try:
            image_id = images.check_image_id(image_id)
        except images.ImageError as exc:
            raise ProgramFailed(400, exc.message) from None
    elif not isinstance(function_id, str) or not function_id or len(function_id) > 255:
        raise ProgramFailed(400, "function_id must be a non-empty string.")
    return driver_name, name, kind, image_id, function_id


def _fence(request: dict) -> tuple[str, int] | None:
    """(deployable uuid, token), or None when the request carries none (older conductor)."""
    dep_uuid, token = request.get("deployable_uuid"), request.get("fence_token")
    if dep_uuid is None and token is None:
        return None
    if not is_uuid(dep_uuid) or not valid_token(token):
        raise ProgramFailed(400, "deployable_uuid (a UUID) and fence_token (an integer from 0 "
                                 "to 2^63-1) go together.")
    return dep_uuid, token


def _parse_fence(request: Any) -> tuple[str, str, str, int]:
    """``POST /deployables/fence``: (driver name, deployable name, uuid, the bind's token)."""
    fields = ("driver_name", "deployable_name", "deployable_uuid", "deployable_fence")
    if not isinstance(request, dict):
        raise ProgramFailed(400, "Expected a JSON object.")
    unknown = set(request) - set(fields)
    if unknown:
        raise ProgramFailed(400, f"Unknown keys: {', '.join(sorted(unknown))}.")
    driver_name, name = request.get("driver_name"), request.get("deployable_name")
    dep_uuid, token = request.get("deployable_uuid"), request.get("deployable_fence")
    if not isinstance(driver_name, str) or not driver_name or len(driver_name) > 255 \
            or not isinstance(name, str) or not name or len(name) > 255:
        raise ProgramFailed(400, "driver_name and deployable_name are required (strings of 1 "
                                 "to 255 characters).")
    if not is_uuid(dep_uuid) or not valid_bind_token(token):
        raise ProgramFailed(400, "deployable_uuid (a UUID) and deployable_fence (an integer "
                                 "from 0 to 2^63-2) are required.")
    return driver_name, name, dep_uuid, token


def agent_routes(agent: Any) -> dict:
    """The agent's route factory (acceld.agent.service.ROUTE_FACTORIES): in-process drivers
    only; a rescan follows each successful program; programs fenced under ``state_path``
    (acceld.agent.fences)."""
    return Programming(agent.conf, agent.find_driver,
                       after_program=agent.discover_in_background,
                       fences=FenceStore.for_agent(agent.conf, agent.hostname)).routes()
