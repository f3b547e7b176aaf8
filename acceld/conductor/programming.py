"""The conductor's programming component: relays program requests to the node's agent.

``POST /deployables/{uuid}/program`` ``{"kind": "bitstream"|"firmware",
"image_id": <uuid>}`` (or ``"function_id"`` instead of ``image_id``, as a bind
asks) finds the deployable's node, holds the database lease
``program:<deployable uuid>`` so that programs of one deployable run one at a
time across every conductor, calls the agent's ``POST /program`` and, only
when the driver succeeded, records ``bitstream_id``. Errors keep the status
the client should see: 4xx for what the client can fix, 409 when another
program of the deployable outlasted the wait, 502 when the agent, driver or
image service failed, 503 when the agent cannot be reached.

The API's program requests also record their progress on the deployable
(``program_status`` PROGRAMMING, then SUCCEEDED or FAILED with
``program_reason``; microversion 2.5 shows them). With ``"async": true`` the
route answers 202 once the deployable and its agent are found and runs the
program on one of ``[conductor] program_workers`` threads; the client follows
the deployable. A program left PROGRAMMING by a conductor that stopped is
failed by a periodic sweep once no live program could still be running.

A program never runs under an instance: under the lease it locks the
deployable row, answers 409 naming the ARQs while any of its attach handles is
in use or being taken, and marks the deployable as being programmed until the
result is recorded; binds refuse its handles meanwhile
(acceld.conductor.binding.target.lock_deployable).

Fencing. The transaction that marks the deployable also takes its next fencing token
(acceld.db.fences), sent with the agent call; right before the call the mark is checked
again (still this program's, not lapsed, no newer token) and otherwise nothing is sent. The
agent refuses a token older than one a later program sent, or than a bind's prepare of one
of the deployable's handles allows (that bind saw the mark lapsed): a conductor that stalls
past its mark does not write the device under a Bound ARQ (acceld.agent.fences). A fenced
program is a 409 that did nothing: nothing is recorded, and it is logged once. A refusal
that shows the database behind the agent (restored from a backup) raises the deployable's
token to the agent's floor, and the program is sent once more under a newer token while
its mark holds (acceld.conductor.fencing.caught_up).

Binding calls :meth:`Programmer.program` directly (profile groups with
``accel:bitstream_id`` or ``accel:function_id``), with a ``precheck`` that
re-reads the deployable under the lease: it skips an image already held and
refuses to reprogram under attach handles in use.
"""

from __future__ import annotations

import datetime as dt
import logging
import time
import uuid as uuidlib
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import falcon
from oslo_config import cfg
from sqlalchemy import Connection, select

from acceld import request_ids
from acceld.clients.agent import AgentCallError, AgentCaller, AgentUnavailable
from acceld.conductor.fencing import caught_up, is_fenced, post_fenced
from acceld.conductor.service import PeriodicTask
from acceld.db import deployables as dep_db
from acceld.db import device_events
from acceld.db import fences, leases
from acceld.db.clock import db_now, sql_now
from acceld.db.models import deployables
from acceld.db.engine import Database
from acceld.internal.server import json_body, respond
from acceld.metrics import record as metrics

LOG = logging.getLogger(__name__)

KINDS = ("bitstream", "firmware")
_LEASE_POLL = 0.2
_FENCE_FIELDS = ("deployable_uuid", "fence_token")


class ProgramError(Exception):
    """A program request failed; ``status`` is what the API answers, ``message`` why;
    ``timed_out``: the agent did not answer in time (it may still be writing the device)."""

    def __init__(self, status: int, message: str, timed_out: bool = False,
                 fenced: bool = False) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.timed_out = timed_out
        self.fenced = fenced  # nothing was done: a newer claim holds the deployable


def local_name(stored_name: str, hostname: str) -> str:
    """The driver's own name of a deployable: the inventory stores ``<hostname>_<name>``."""
    prefix = f"{hostname}_"
    return stored_name[len(prefix):] if stored_name.startswith(prefix) else stored_name


class Programmer:
    """Programs deployables through their agents; safe to share between threads."""

    def __init__(self, conf: cfg.ConfigOpts, db: Database, secret: bytes | None = None) -> None:
        self.conf = conf
        self.db = db
        self.agents = AgentCaller(conf, db, secret)

    @metrics.program
    def program(self, deployable_uuid: str, kind: str, *, image_id: str | None = None,
                function_id: str | None = None,
                precheck: Callable[[Connection, int], bool] | None = None) -> str:
        """Program and record; return the image id written. Raises ProgramError.

        ``precheck(conn, deployable_id)`` (with ``image_id`` only) runs once the program
        lease is held, on a fresh read: what the caller decided before waiting for the
        lease may be stale (another bind programmed meanwhile). It returns False when
        no program is needed (``image_id`` is returned unwritten) and may raise to
        refuse; the lease stays held from that check to the recorded result.

        The check runs in the write transaction that marks the deployable as being
        programmed (:meth:`_hold`): 409 naming the ARQs while any attach handle of it is in
        use or being taken, and no bind takes one of its handles until the mark is cleared
        with the result (or lapses after a crash).
        """
        if precheck is not None and image_id is None:
            raise ValueError("precheck needs image_id")
        if kind not in KINDS:
            raise ProgramError(400, f"Unknown image kind {kind!r}; expected one of "
                                    f"{', '.join(KINDS)}.")
        if (image_id is None) == (function_id is None):
            raise ProgramError(400, "Name exactly one of image_id and function_id.")
        target, url = self.locate(deployable_uuid)
        request: dict[str, Any] = {"driver_name": target.driver_name,
                                   "deployable_name": local_name(target.name, target.hostname),
                                   "kind": kind}
        if image_id is not None:
            request["image_id"] = image_id
        else:
            request["function_id"] = function_id
        with self._lease(target.uuid, target.name) as lease:
            with self.db.write() as conn:
                fence = self._hold(conn, target, lease, precheck)
                if fence is None:
                    return str(image_id)
            request = {**request, "deployable_uuid": target.uuid, "fence_token": fence}
            try:
                if not self._still_ours(target.id, lease.owner, fence):
                    raise ProgramError(409, f"The programming mark of deployable {target.name} "
                                            "lapsed before the program was sent (this "
                                            "conductor stalled past it); nothing was "
                                            "programmed.", fenced=True)
                answer = self._send(url, target, request, lease.owner)
                written = answer.get("image_id") if isinstance(answer, dict) else None
                if not isinstance(written, str):
                    raise ProgramError(502, f"The agent of host {target.hostname} answered "
                                            "without the image id it programmed.")
            except ProgramError as exc:
                failure = _program_event(target, kind, request, f"failed: {exc.message}")
                if exc.fenced:
                    LOG.warning("Program of deployable %s on %s fenced (nothing written; a "
                                "newer claim holds it): %s", target.name, target.hostname,
                                exc.message)
                if exc.timed_out:
                    # The agent may still be writing the device: binds stay out for one
                    # more program_timeout (+ 30 s), then the mark lapses.
                    self._unhold(target.id, lease.owner, keep_for=lease.timeout + 30,
                                 event=failure)
                else:
                    self._unhold(target.id, lease.owner, event=failure)
                raise
            except BaseException as exc:
                self._unhold(target.id, lease.owner, event=_program_event(
                    target, kind, request, f"failed: {exc.__class__.__name__}: {exc}"))
                raise
            with self.db.write() as conn:
                found = dep_db.end_programming(conn, target.id, lease.owner,
                                               written if kind == "bitstream" else None)
                if found:
                    device_events.record(conn, target.device_uuid, target.hostname,
                                         device_events.PROGRAM_SUCCEEDED,
                                         f"{kind} {written} programmed into {target.name}")
            if not found:
                raise ProgramError(404, f"Deployable {deployable_uuid} was removed "
                                        "while it was being programmed.")
        LOG.info("Programmed %s %s into deployable %s on %s", kind, written, target.name,
                 target.hostname)
        return written

    def _hold(self, conn: Connection, target: Any, lease: "_ProgramLease",
              precheck: Callable[[Connection, int], bool] | None) -> int | None:
        """Under the deployable's row lock: run ``precheck``, refuse (409) while any of its
        attach handles is in use or being taken, and mark it as being programmed, so that
        no bind takes a handle until the program ends. Returns the fencing token the mark
        took; None: no program is needed."""
        row = dep_db.lock_for_program(conn, target.id)
        if row is None:
            raise ProgramError(404, f"Deployable {target.uuid} could not be found.")
        if precheck is not None and not precheck(conn, target.id):
            return None
        refuse_if_held(conn, target.id, target.name)
        until = db_now(conn) + dt.timedelta(seconds=lease.timeout + 30)
        dep_db.begin_programming(conn, target.id, lease.owner, until)
        return fences.take_deployable_token(conn, target.id)

    def _still_ours(self, deployable_id: int, owner: str, fence: int) -> bool:
        """Right before the call: the mark is still ``owner``'s, has not lapsed by the
        database's clock, and no later program took a newer token. The agent's fence covers
        a stall after this read."""
        with self.db.read() as conn:
            return conn.execute(select(deployables.c.id).where(
                deployables.c.id == deployable_id, deployables.c.programming_owner == owner,
                deployables.c.programming_until > sql_now(conn.dialect.name),
                deployables.c.fence_token == fence)).first() is not None

    def _send(self, url: str, target: Any, request: dict, owner: str) -> Any:
        """The agent call; sent once more, with a newer token, when the agent refused it
        only because the database is behind it (restored from a backup) and the mark is
        still ``owner``'s (acceld.conductor.fencing.caught_up)."""
        try:
            return self._call_agent(url, target.hostname, request)
        except ProgramError as exc:
            if not exc.fenced or not caught_up(self.db, deployables, target.id, exc.message,
                                               f"deployable {target.name}", target.hostname):
                raise
            with self.db.write() as conn:
                if conn.execute(select(deployables.c.id).where(
                        deployables.c.id == target.id,
                        deployables.c.programming_owner == owner,
                        deployables.c.programming_until > sql_now(conn.dialect.name))
                        .with_for_update()).first() is None:
                    raise
                fence = fences.take_deployable_token(conn, target.id)
            return self._call_agent(url, target.hostname, {**request, "fence_token": fence})

    def _unhold(self, deployable_id: int, owner: str, keep_for: float | None = None,
                event: tuple[str, str, str] | None = None) -> None:
        """A failed program gives the deployable back to binds (its mark would lapse);
        ``keep_for``: not yet, only after that many more seconds (a timed-out program).
        ``event``: (device uuid, host, detail) of the failure, for the device's history."""
        try:
            with self.db.write() as conn:
                if event is not None:
                    device_events.record(conn, event[0], event[1],
                                         device_events.PROGRAM_FAILED, event[2])
                if keep_for is None:
                    dep_db.end_programming(conn, deployable_id, owner, None)
                else:
                    dep_db.extend_programming(
                        conn, deployable_id, owner,
                        db_now(conn) + dt.timedelta(seconds=keep_for))
        except Exception:  # noqa: BLE001 - never mask the program's own error
            LOG.exception("Could not clear the programming mark of deployable id %s",
                          deployable_id)

    def resolve_function(self, deployable_uuid: str, function_id: str) -> str:
        """The image id ``function_id`` stands for, asked of the deployable's agent (the
        image source is the node's). Raises ProgramError."""
        target, url = self.locate(deployable_uuid)
        answer = self._call_agent(url, target.hostname, {"function_id": function_id},
                                  path="/images/resolve")
        image_id = answer.get("image_id") if isinstance(answer, dict) else None
        if not isinstance(image_id, str):
            raise ProgramError(502, f"The agent of host {target.hostname} did not resolve "
                                    f"function id {function_id}.")
        return image_id

    def locate(self, deployable_uuid: str):  # type: ignore[no-untyped-def]
        """The deployable (with its node) and its agent's URL, or ProgramError."""
        with self.db.read() as conn:
            target = dep_db.program_target(conn, deployable_uuid)
            if target is None:
                raise ProgramError(404, f"Deployable {deployable_uuid} could not be found.")
            try:
                url = self.agents.locate(target.hostname, conn)
            except AgentUnavailable as exc:
                raise ProgramError(503, (
                    f"The agent of host {target.hostname} is down; deployable "
                    f"{target.name} cannot be programmed now." if exc.registered else
                    f"No agent has registered for host {target.hostname}, where deployable "
                    f"{target.name} is.")) from None
        return target, url

    def _call_agent(self, url: str, hostname: str, request: dict,
                    path: str = "/program") -> Any:
        """``request`` may carry the mark's fencing fields; they are left out for an agent
        from before fencing (acceld.conductor.fencing)."""
        timeout = float(self.conf.conductor.program_timeout)
        fence = {k: v for k, v in request.items() if k in _FENCE_FIELDS}
        body = {k: v for k, v in request.items() if k not in _FENCE_FIELDS}
        try:
            return post_fenced(lambda sent: self.agents.post(
                url, hostname, path, sent, timeout=timeout,
                timeout_message=f"The agent of host {hostname} did not finish programming "
                                f"within {timeout:.0f} s ([conductor] program_timeout); "
                                "the device state is unknown."), hostname, body, fence)
        except AgentCallError as exc:
            if is_fenced(exc.status, exc.message):
                raise ProgramError(409, exc.message, fenced=True) from None
            raise ProgramError(exc.status, exc.message,
                               timed_out=bool(getattr(exc, "timed_out", False))) from None

    def _lease(self, deployable_uuid: str, name: str):  # type: ignore[no-untyped-def]
        return _ProgramLease(self.db, deployable_uuid, name,
                             float(self.conf.conductor.program_timeout))


def _program_event(target: Any, kind: str, request: dict, outcome: str) -> tuple[str, str, str]:
    """A program's failure as a device event: (device uuid, host, detail)."""
    image = request.get("image_id") or f"function {request.get('function_id')}"
    return (target.device_uuid, target.hostname,
            f"{kind} {image} into {target.name} {outcome}")


def refuse_if_held(conn: Connection, deployable_id: int, name: str) -> None:
    """ProgramError 409 naming the ARQs that hold the deployable (a handle in use or being
    taken): a program never runs under an instance."""
    held = dep_db.holders(conn, deployable_id)
    if held:
        raise ProgramError(409, f"Deployable {name} is in use by {dep_db.describe_holders(held)}; "
                                "it is not programmed while any of its attach handles is in "
                                "use or being taken. Unbind them first.")


class _ProgramLease:
    """The DB-level guard: one program per deployable at a time, whichever conductor runs it.

    A second request waits for the lease (programs are serialised, not refused)
    up to ``program_timeout``; the lease outlives a crashed holder by at most
    that plus a margin, then lapses.
    """

    def __init__(self, db: Database, deployable_uuid: str, name: str, timeout: float) -> None:
        self.db = db
        self.name = f"program:{deployable_uuid}"
        self.deployable = name
        self.owner = uuidlib.uuid4().hex
        self.timeout = timeout

    def __enter__(self) -> "_ProgramLease":
        deadline = time.monotonic() + self.timeout
        while not leases.acquire(self.db, self.name, self.owner, self.timeout + 30):
            if time.monotonic() >= deadline:
                raise ProgramError(409, f"Deployable {self.deployable} is being programmed by "
                                        "another request that has not finished; try again.")
            time.sleep(_LEASE_POLL)
        return self

    def __exit__(self, *exc_info: object) -> None:
        try:
            leases.release(self.db, self.name, self.owner)
        except Exception:  # noqa: BLE001 - the lease lapses by itself; never mask the result
            LOG.exception("Could not release lease %s", self.name)


class ProgrammingComponent:
    """Conductor component: the internal program route, synchronous or asynchronous."""

    def __init__(self, conf: cfg.ConfigOpts, db: Database) -> None:
        self.conf = conf
        self.db = db
        self.programmer = Programmer(conf, db)
        self._pool: ThreadPoolExecutor | None = None

    def routes(self) -> dict:
        return {"/deployables/{uuid}/program": {"POST": self.on_program}}

    def on_program(self, req: falcon.Request, resp: falcon.Response, uuid: str) -> None:
        body = json_body(req)
        if not isinstance(body, dict) or set(body) - {"kind", "image_id", "function_id",
                                                      "async"}:
            raise falcon.HTTPBadRequest(
                description="Expected {kind, image_id | function_id[, async]}.")
        run_async = body.get("async", False)
        if not isinstance(run_async, bool):
            raise falcon.HTTPBadRequest(description="async must be true or false.")
        kind = str(body.get("kind", "bitstream"))
        image_id, function_id = body.get("image_id"), body.get("function_id")
        try:
            target, _url = self.programmer.locate(uuid)  # 404 / 503 before anything starts
            with self.db.read() as conn:  # 409 before anything starts (checked again later)
                refuse_if_held(conn, target.id, target.name)
            request_id = self._start(target.id)
            if run_async:
                self._submit(uuid, target.id, request_id, kind, image_id, function_id)
                resp.status = falcon.HTTP_202
                respond(resp, {"deployable_uuid": uuid, "program_status": dep_db.PROGRAMMING})
                return
            written = self._run(uuid, target.id, request_id, kind, image_id, function_id)
        except ProgramError as exc:
            raise falcon.HTTPError(exc.status, description=exc.message) from None
        respond(resp, {"deployable_uuid": uuid, "image_id": written})

    def _start(self, deployable_id: int) -> str:
        request_id = str(uuidlib.uuid4())
        with self.db.write() as conn:
            if not dep_db.start_program(conn, deployable_id, request_id):
                raise ProgramError(404, "The deployable was removed before it could be "
                                        "programmed.")
        return request_id

    def _run(self, uuid: str, deployable_id: int, request_id: str, kind: str,
             image_id: str | None, function_id: str | None) -> str:
        """Program and record the outcome on the deployable; ProgramError passes on."""
        try:
            written = self.programmer.program(uuid, kind, image_id=image_id,
                                              function_id=function_id)
        except ProgramError as exc:
            self._finish(deployable_id, request_id, dep_db.FAILED,
                         f"{exc.status}: {exc.message}")
            raise
        except Exception:
            self._finish(deployable_id, request_id, dep_db.FAILED,
                         "500: an unexpected error stopped the program; the conductor's "
                         "log has the details.")
            raise
        self._finish(deployable_id, request_id, dep_db.SUCCEEDED, None)
        return written

    def _finish(self, deployable_id: int, request_id: str, status: str,
                reason: str | None) -> None:
        try:
            with self.db.write() as conn:
                dep_db.finish_program(conn, deployable_id, request_id, status, reason)
        except Exception:  # noqa: BLE001 - the sweep fails it later; never mask the result
            LOG.exception("Could not record the outcome of program request %s", request_id)

    def _submit(self, uuid: str, deployable_id: int, request_id: str, kind: str,
                image_id: str | None, function_id: str | None) -> None:
        if self._pool is None:
            self._pool = ThreadPoolExecutor(self.conf.conductor.program_workers,
                                            thread_name_prefix="program")

        # The worker thread's lines and calls name the request that asked for the program.
        global_id = request_ids.current_global_id()

        def job() -> None:
            with request_ids.bound(global_id):
                self._run_submitted(uuid, deployable_id, request_id, kind, image_id,
                                    function_id)

        self._pool.submit(job)

    def _run_submitted(self, uuid: str, deployable_id: int, request_id: str, kind: str,
                       image_id: str | None, function_id: str | None) -> None:
        """An asynchronous program, in a worker thread: its outcome is on the deployable."""
        try:
            with self.db.write() as conn:
                dep_db.program_begins(conn, deployable_id, request_id)
            self._run(uuid, deployable_id, request_id, kind, image_id, function_id)
        except ProgramError as exc:
            LOG.info("Asynchronous program of deployable %s failed: %s", uuid, exc.message)
        except Exception:  # noqa: BLE001 - recorded on the deployable by _run
            LOG.exception("Asynchronous program of deployable %s failed", uuid)

    def fail_stale(self) -> None:
        """FAILED for programs whose conductor stopped: no live one outlasts the lease
        wait plus the program (each program_timeout) and a margin."""
        timeout = self.conf.conductor.program_timeout
        with self.db.write() as conn:
            failed = dep_db.fail_stale_programs(
                conn, 2 * timeout + 60, "The conductor running this program stopped before it "
                              "finished; the device state is unknown: program it again.")
        if failed:
            LOG.warning("Failed %d program(s) left unfinished by a stopped conductor", failed)

    def periodic_tasks(self) -> list[PeriodicTask]:
        return [PeriodicTask("program-sweep", 60.0, self.fail_stale, exclusive=True)]

    def start(self) -> None:
        pass

    def stop(self) -> None:
        if self._pool is not None:
            # Queued programs are not begun; the sweep fails them once they are stale.
            self._pool.shutdown(wait=False, cancel_futures=True)
