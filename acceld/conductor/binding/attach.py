"""Binding prepares the attach handle on its host when the handle needs it (an mdev).

A handle that :func:`acceld.drivers.base.needs_attach_step` names is made
usable by the node's agent before the ARQ becomes ``Bound``. That is a network
call, so a bind of such a handle takes two transactions with the call between:

1. the bind transaction takes the handle as usual but, instead of ``Bound``,
   records it on the still-``BindStarted`` ARQ and leaves the job ``pending``
   (:func:`hold`);
2. the agent prepares the handle (no transaction open);
3. a second transaction, if the job is still this claim's, moves the ARQ to
   ``Bound``, or to ``BindFailed`` and gives the handle back.

Crash safety: a conductor killed between 1 and 3 leaves a ``BindStarted`` ARQ
holding the handle and a pending job; the job's lease expires and the next
claim reuses that handle (preparing is idempotent). An unbind or delete in
between gives the held handle back through the release queue, so whatever the
prepare created is removed. An unreachable agent leaves the job to be retried
(up to the bind's attempt limit); a timeout fails the bind and queues a
release, since the host's state is unknown.

No leak (:func:`settle`). A handle is freed without a release only when the
host cannot hold anything for it: the driver refused the *first* prepare of a
handle this very try took (``Ticket.fresh``; a driver's prepare that raises
leaves nothing). A handle held from an earlier try (whose prepare may have
succeeded before a crash) is always given back through the release queue,
whatever this try's answer. And a prepare that succeeded or timed out after
its bind was unbound, deleted or failed is followed by a release
(:func:`acceld.db.handle_releases.reclaim`): the release the unbind queued may
have run on the host before the prepare did.

Fencing. The bind transaction (1) takes the handle's next fencing token and reads the
deployable's (acceld.db.fences); the prepare carries both. A handle with no host step (PCI)
takes the same two transactions while the agent has not been told the deployable's token
(``deployables.fence_told``: a new row, or a program marked it since), the call (2) being
``POST /deployables/fence`` with the deployable's token: the agent then refuses every
program the bind saw as ended or lapsed, of this row and of any earlier row of the same
device (a host retired and registered again), checked right before the device write, so a
stale program never writes the device under the Bound ARQ (acceld.agent.programming); its
answer records the token told. Once told, binds that read the same token are one
transaction with no agent call: the agent already refuses every program up to it. Right
before the call (2) the claim is checked again (the job is still this claim's and its lease
has not run out, the ARQ still holds the handle, no newer token on it); otherwise nothing
is sent. The agent refuses
a token older than one a later claim sent (a release that overtook this stalled prepare, a
later try of the same bind), so a conductor that stalls past its job's lease does not
recreate an mdev that was released meanwhile; and it refuses, from then on, a program of the
deployable whose mark the bind saw lapsed (acceld.agent.fences). A fenced or skipped prepare
did nothing on the host: the bind is left to the claim that overtook it, unless the refusal
shows the database behind the agent (restored from a backup): then the handle's token is
raised to the agent's floor and the bind is tried again at once, the refused try counting
as an attempt, so that a node naming a new floor at every call ends like a failing prepare
(acceld.conductor.fencing.caught_up).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

import orjson
from sqlalchemy import Connection, Row, select, true, update

from acceld.conductor.binding import target as bind_target
from acceld.conductor.binding.attach_client import (AttachClient, AttachError, fence_fields,
                                                  request_body)
from acceld.conductor.fencing import caught_up
from acceld.conductor.programming import local_name
from acceld.db import accelerator_requests as arq_db
from acceld.db import bind_jobs as bind_jobs_db
from acceld.db import claims, fences, handle_releases
from acceld.db.clock import sql_now
from acceld.db.engine import Database
from acceld.db.models import accelerator_requests as arqs
from acceld.db.models import attach_handles, bind_jobs, deployables, utcnow
from acceld.drivers.base import needs_attach_step

LOG = logging.getLogger(__name__)


@dataclass(frozen=True)
class Ticket:
    """A handle held by a BindStarted ARQ, to prepare before the ARQ is Bound."""

    arq_id: int
    arq_uuid: str
    instance_uuid: str
    job_id: int
    handle_id: int
    handle_uuid: str
    hostname: str
    deployable_name: str
    body: dict[str, Any]
    #: Taken by this try (free until now): no earlier try can have prepared it on the host.
    fresh: bool = True
    #: The handle's fencing token this try took, and the job's lease owner then (the claim).
    fence_token: int | None = None
    job_token: str | None = None
    #: PREPARE the handle, or only FENCE its deployable (a handle with no host step).
    step: str = "prepare"
    #: The deployable and its token as the bind read it (a FENCE's answer records it told).
    deployable_id: int | None = None
    deployable_token: int | None = None


PREPARE = "prepare"
FENCE = "fence"


def held_handle(conn: Connection, handle_id: int) -> Row | None:
    """The handle a previous, interrupted try of this bind took (still in use)."""
    return conn.execute(select(
        attach_handles.c.id, attach_handles.c.uuid, attach_handles.c.attach_type,
        attach_handles.c.attach_info).where(attach_handles.c.id == handle_id)).first()


def needs_step(handle: Row) -> bool:
    return needs_attach_step(handle.attach_type, orjson.loads(handle.attach_info))


def hold(conn: Connection, arq: Any, target: Any, job_id: int) -> Ticket | None:
    """Inside the bind transaction, when the host must act before the ARQ is Bound: the ARQ
    keeps the handle while it stays BindStarted, and the job goes back to pending
    (``lock_owned`` moved it to notify) so that a crash before the call finished leaves it to
    be retried. The host acts for a handle with a host step (PREPARE), and for any other
    handle of a deployable whose token *m* the agent has not been told (FENCE: *m* read under
    the bind's shared lock, so that the agent refuses every program up to *m*, of this row
    and of earlier rows of the device, before the ARQ is Bound). None: neither; the caller
    binds at once."""
    handle, dep = target.handle, target.deployable
    owned = conn.execute(select(deployables.c.driver_name, deployables.c.uuid,
                                deployables.c.fence_token, deployables.c.fence_told).where(
        deployables.c.id == dep.id)).one()
    step = PREPARE if needs_step(handle) else FENCE if fences.fence_untold(
        owned.fence_token, owned.fence_told) else None
    if step is None:
        return None
    fresh = arq.attach_handle_id != handle.id  # not held from an interrupted earlier try
    conn.execute(update(arqs).where(arqs.c.id == arq.id).values(
        attach_handle_id=handle.id, deployable_id=dep.id, updated_at=utcnow()))
    conn.execute(update(bind_jobs).where(bind_jobs.c.id == job_id).values(
        phase="pending", updated_at=utcnow()))
    token = fences.take_handle_tokens(conn, [handle.id])[handle.id]
    job_token = conn.execute(select(bind_jobs.c.lease_owner).where(
        bind_jobs.c.id == job_id)).scalar()
    name = local_name(dep.name, dep.hostname)
    if step == PREPARE:
        body = {**request_body(owned.driver_name, name, handle.attach_type,
                               handle.attach_info),
                **fence_fields(handle.uuid, token, owned.uuid, owned.fence_token)}
    else:
        body = {"driver_name": owned.driver_name or "", "deployable_name": name,
                "deployable_uuid": owned.uuid, "deployable_fence": owned.fence_token}
    return Ticket(arq_id=arq.id, arq_uuid=arq.uuid, instance_uuid=arq.instance_uuid,
                  job_id=job_id, handle_id=handle.id, handle_uuid=handle.uuid,
                  hostname=dep.hostname, deployable_name=dep.name, body=body, fresh=fresh,
                  fence_token=token, job_token=job_token, step=step,
                  deployable_id=dep.id, deployable_token=owned.fence_token)


@dataclass(frozen=True)
class Prepared:
    """What the agent said: ``error`` None when the handle is ready. ``again``: refused only
    because the database was behind the agent, now caught up: try the bind again at once."""

    error: AttachError | None = None
    again: bool = False


def still_ours(db: Database, ticket: Ticket) -> bool:
    """Right before the prepare: the job is still this claim's (pending, lease not run out by
    the database's clock), the ARQ still holds the handle, and no later claim took a newer
    token on it. The agent's fence covers a stall after this read."""
    if ticket.job_token is None or ticket.fence_token is None:
        return True
    with db.read() as conn:
        row = conn.execute(select(bind_jobs.c.id).select_from(
            bind_jobs.join(arqs, arqs.c.id == bind_jobs.c.arq_id)
            .join(attach_handles, attach_handles.c.id == arqs.c.attach_handle_id)).where(
            bind_jobs.c.id == ticket.job_id, bind_jobs.c.lease_owner == ticket.job_token,
            bind_jobs.c.phase == bind_jobs_db.PENDING,
            bind_jobs.c.lease_expires_at > sql_now(db.backend),
            arqs.c.id == ticket.arq_id, arqs.c.state == arq_db.BIND_STARTED,
            attach_handles.c.id == ticket.handle_id, attach_handles.c.in_use == true(),
            attach_handles.c.fence_token == ticket.fence_token)).first()
    return row is not None


def prepare(client: AttachClient, ticket: Ticket) -> Prepared:
    """The network call, outside any transaction, if the claim is still ours. AttachError
    503 propagates (retry)."""
    db = getattr(client, "db", None)  # the AttachClient's; a test double may have none
    if db is not None and not still_ours(db, ticket):
        LOG.warning("Prepare of attach handle %s for ARQ %s on %s not sent: this conductor's "
                    "bind claim lapsed before the call", ticket.handle_uuid, ticket.arq_uuid,
                    ticket.hostname)
        return Prepared(AttachError(409, "the bind's claim lapsed before the prepare was "
                                         "sent", fenced=True))
    try:
        if ticket.step == FENCE:
            if client.fence(ticket.hostname, ticket.body) and db is not None:
                _record_told(db, ticket)
        else:
            client.prepare(ticket.hostname, ticket.body)
    except AttachError as exc:
        if exc.status == 503:
            raise
        if exc.fenced and db is not None and caught_up(
                db, attach_handles, ticket.handle_id, exc.message,
                f"attach handle {ticket.handle_uuid}", ticket.hostname):
            return Prepared(exc, again=True)
        if exc.fenced:
            LOG.warning("Prepare of attach handle %s for ARQ %s on %s refused by its agent "
                        "(fenced; left to the newer claim): %s", ticket.handle_uuid,
                        ticket.arq_uuid, ticket.hostname, exc.message)
        return Prepared(exc)
    return Prepared()


def _record_told(db: Database, ticket: Ticket) -> None:
    """The agent refuses programs up to the bind's token now: later binds that read it make
    no call (a transaction of its own, so that the bind's lock order stays as it is; a
    conductor that dies before it only makes the next bind fence again)."""
    if ticket.deployable_id is None or ticket.deployable_token is None:
        return
    with db.write() as conn:
        fences.record_told(conn, ticket.deployable_id, ticket.deployable_token)


def settle(db: Database, ticket: Ticket, job_id: int, token: str,
           error: AttachError | None) -> bool:
    """The second transaction: ``Bound``, or ``BindFailed`` with the handle given back so
    that nothing stays on the host. True when the ARQ resolved (its job awaits notify);
    False when the bind was overtaken (unbound, deleted, failed or re-claimed meanwhile),
    in which case a prepare that may have left something on the host is followed by a
    release unless a user of the handle accounts for it."""
    with db.write() as conn:
        arq = arq_db.lock_one_by_id(conn, ticket.arq_id)
        lost = (arq is None or arq.state != arq_db.BIND_STARTED
                or arq.attach_handle_id != ticket.handle_id
                or (error is not None and error.fenced)  # a newer claim has it: not ours
                or not bind_jobs_db.lock_owned(conn, job_id, token))
        if lost:
            # A fence leaves nothing on the host to undo; a prepare may have.
            if ticket.step == PREPARE and (error is None or error.unknown):
                outcome = handle_releases.reclaim(conn, ticket.handle_id)
                if outcome in ("queued", "rearmed"):
                    LOG.warning("Attach handle %s of %s on %s was prepared after ARQ %s let "
                                "go of it; a release is %s to undo the host step",
                                ticket.handle_uuid, ticket.deployable_name, ticket.hostname,
                                ticket.arq_uuid, outcome)
            return False
        assert arq is not None
        # Disabled (or lost) while the host step ran: not Bound (acceld.conductor.binding.target).
        refusal = None if error is not None else bind_target.device_refusal(
            conn, ticket.handle_id, ticket.hostname)
        if refusal is not None:
            arq_db.release_handles(conn, [ticket.handle_id])  # prepared: undo on the host
            claims.mark_due(conn, [arq.consumer_uuid])  # a standalone claim's allocation
            arq_db.transition(conn, [arq.id], arq_db.BIND_FAILED,
                              bind_failure_reason=refusal[:4000], attach_handle_id=None,
                              deployable_id=None)
            LOG.warning("Bind of ARQ %s (instance %s) failed after its attach handle was "
                        "prepared: %s", arq.uuid, arq.instance_uuid, refusal)
            return True
        if error is None:
            arq_db.transition(conn, [arq.id], arq_db.BOUND, bind_failure_reason=None)
            claims.record_claimed(conn, arq, ticket.handle_id)
            LOG.info("Bound ARQ %s (instance %s) to handle %s of deployable %s on %s, "
                     "%s on the host", arq.uuid, arq.instance_uuid, ticket.handle_uuid,
                     ticket.deployable_name, ticket.hostname,
                     "prepared" if ticket.step == PREPARE else "its programs fenced")
            return True
        doing = (f"preparing attach handle {ticket.handle_uuid}" if ticket.step == PREPARE
                 else "fencing the programs")
        reason = (f"{doing} of deployable {ticket.deployable_name} on {ticket.hostname} "
                  f"failed: {error.message}")
        if ticket.fresh and not error.unknown:
            handle_releases.free_now(conn, [ticket.handle_id])  # the host holds nothing
        else:
            # Unknown outcome, or an earlier try may have prepared it: undo on the host.
            arq_db.release_handles(conn, [ticket.handle_id])
        claims.mark_due(conn, [arq.consumer_uuid])
        arq_db.transition(conn, [arq.id], arq_db.BIND_FAILED,
                          bind_failure_reason=reason[:4000], attach_handle_id=None,
                          deployable_id=None)
        LOG.warning("Bind of ARQ %s (instance %s) failed: %s", arq.uuid, arq.instance_uuid,
                    reason)
        return True
