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
(up to the bind's attempt limit); a driver failure fails the bind at once and
frees the handle (a driver's prepare that raises must leave nothing behind); a
timeout fails the bind and queues a release, since the host's state is unknown.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import orjson
from sqlalchemy import Connection, Row, select, update

from acceld.conductor.attach import AttachClient, AttachError, request_body
from acceld.conductor.programming import local_name
from acceld.db.models import accelerator_requests as arqs
from acceld.db.models import attach_handles, bind_jobs, deployables, utcnow
from acceld.drivers.base import needs_attach_step


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


def held_handle(conn: Connection, handle_id: int) -> Row | None:
    """The handle a previous, interrupted try of this bind took (still in use)."""
    return conn.execute(select(
        attach_handles.c.id, attach_handles.c.uuid, attach_handles.c.attach_type,
        attach_handles.c.attach_info).where(attach_handles.c.id == handle_id)).first()


def needs_step(handle: Row) -> bool:
    return needs_attach_step(handle.attach_type, orjson.loads(handle.attach_info))


def hold(conn: Connection, arq: Any, target: Any, job_id: int) -> Ticket:
    """Inside the bind transaction: the ARQ keeps the handle while it stays BindStarted, and
    the job goes back to pending (``lock_owned`` moved it to notify) so that a crash before
    the prepare finished leaves it to be retried."""
    handle, dep = target.handle, target.deployable
    conn.execute(update(arqs).where(arqs.c.id == arq.id).values(
        attach_handle_id=handle.id, deployable_id=dep.id, updated_at=utcnow()))
    conn.execute(update(bind_jobs).where(bind_jobs.c.id == job_id).values(
        phase="pending", updated_at=utcnow()))
    driver_name = conn.execute(select(deployables.c.driver_name).where(
        deployables.c.id == dep.id)).scalar()
    name = local_name(dep.name, dep.hostname)
    return Ticket(arq_id=arq.id, arq_uuid=arq.uuid, instance_uuid=arq.instance_uuid,
                  job_id=job_id, handle_id=handle.id, handle_uuid=handle.uuid,
                  hostname=dep.hostname, deployable_name=dep.name,
                  body=request_body(driver_name, name, handle.attach_type, handle.attach_info))


@dataclass(frozen=True)
class Prepared:
    """What the agent said: ``error`` None when the handle is ready."""

    error: AttachError | None = None


def prepare(client: AttachClient, ticket: Ticket) -> Prepared:
    """The network call, outside any transaction. AttachError 503 propagates (retry)."""
    try:
        client.prepare(ticket.hostname, ticket.body)
    except AttachError as exc:
        if exc.status == 503:
            raise
        return Prepared(exc)
    return Prepared()
