"""The conductor's release component: drains the attach-handle release queue.

Every ``[conductor] bind_poll_interval`` seconds each conductor claims due rows
of ``handle_releases`` on the hosts the ring gives it (acceld.conductor.fleet.membership;
a lease per claim, so a release two conductors reach during a rebalance runs
once), asks each handle's agent to release it (acceld.agent.attach) and, on
success, frees the handle and deletes the row in one transaction. An agent
that is down, unreachable or failing leaves the row to be retried with
exponential backoff (2 s doubling up to 5 minutes); the handle stays
``in_use`` meanwhile, so no bind can take it while the host may still hold the
old VM's mdev. ``last_error`` on the row says why it is still waiting.

Fencing. The claim takes the handle's next fencing token (acceld.db.fences) and the release
is sent with it; right before the call the worker checks that the claim is still its own
(lease not run out, no newer token on the handle) and otherwise does not call. A conductor
that stalls after that check (GC pause, SIGSTOP) while another released the handle and a new
bind prepared it again is refused by the agent, which has seen the newer tokens (409,
acceld.agent.fences): the worker then does nothing for that row and logs it once. A
refusal that shows the database behind the agent (restored from a backup) raises the
handle's token to the agent's floor and makes the row due again at once the first time, then
after the usual backoff (a node naming a new floor at every call is not retried in a loop;
acceld.conductor.fencing.caught_up).

Orphans. Each agent reports, at start and every ``[agent] discovery_interval``,
the host-step resources acceld made on its node that exist now
(``POST /attach-handles/host-steps``, signed with the node's key, which
names the host). The conductor decides against the database
(:func:`acceld.db.handle_releases.queue_orphans`): a resource whose handle is
free is an orphan, and its release is queued like an unbind's.
"""

from __future__ import annotations

import logging
import os
import socket
import uuid

import falcon
from oslo_config import cfg

from acceld.conductor.binding.attach_client import (AttachClient, AttachError, fence_fields,
                                                  request_body)
from acceld.conductor.fencing import caught_up
from acceld.conductor.fleet.membership import EVERYTHING, Ownership
from acceld.conductor.programming import local_name
from acceld.conductor.service import PeriodicTask
from acceld.db import handle_releases
from acceld.db.engine import Database
from acceld.db.models import attach_handles
from acceld.drivers.base import ATTACH_TYPES
from acceld.internal.server import caller_node, json_body, respond
from acceld.jsonschemas import strict_validator

LOG = logging.getLogger(__name__)

BATCH = 8
HOST_STEPS_PATH = "/attach-handles/host-steps"
MAX_HOST_STEPS = 4096  # resources in one report: far above any node's vGPU count

HOST_STEPS = strict_validator({
    "type": "object",
    "required": ["host_steps"],
    "additionalProperties": False,
    "properties": {"host_steps": {"type": "array", "maxItems": MAX_HOST_STEPS, "items": {
        "type": "object",
        "required": ["driver_name", "attach_type", "attach_info"],
        "additionalProperties": False,
        "properties": {
            "driver_name": {"type": "string", "minLength": 1, "maxLength": 255},
            "attach_type": {"enum": list(ATTACH_TYPES)},
            "attach_info": {"type": "object", "minProperties": 1, "maxProperties": 32,
                            "additionalProperties": {"type": "string", "maxLength": 255}},
        }}}},
})


class ReleaseWorker:
    """Claims and runs releases. ``run_once`` is synchronous (tests drive it)."""

    def __init__(self, conf: cfg.ConfigOpts, db: Database, client: AttachClient | None = None,
                 batch: int = BATCH) -> None:
        self.conf = conf
        self.db = db
        self.client = client if client is not None else AttachClient(conf, db)
        self.batch = batch
        self.owner = f"{socket.gethostname()[:30]}-{os.getpid()}"
        self.ownership: Ownership = EVERYTHING

    def run_once(self) -> int:
        """One claim; returns how many releases it took (done or put back)."""
        token = f"{self.owner}-{uuid.uuid4().hex[:16]}"[:64]
        # A claim outlives every call in it, so that no other conductor retakes a row in use.
        lease = float(self.conf.conductor.attach_timeout) * (self.batch + 1) + 10
        rows = handle_releases.claim(
            self.db, token, self.batch, lease,
            None if self.ownership is EVERYTHING else self.ownership.owns)
        for row in rows:
            body = {**request_body(row.driver_name,
                                   local_name(row.deployable_name, row.hostname),
                                   row.attach_type, row.attach_info),
                    **fence_fields(row.handle_uuid, row.fence_token)}
            if not handle_releases.still_ours(self.db, row.id, token, row.attach_handle_id,
                                              row.fence_token):
                LOG.warning("Release of attach handle %s on %s not sent: this conductor's "
                            "claim lapsed before the call (another claim took it over)",
                            row.handle_uuid, row.hostname)
                continue
            try:
                self.client.release(row.hostname, body)
            except AttachError as exc:
                if exc.fenced and caught_up(self.db, attach_handles, row.attach_handle_id,
                                            exc.message, f"attach handle {row.handle_uuid}",
                                            row.hostname):
                    # The database was behind the agent (a restore): due again now, under a
                    # newer token than the agent's floor; once only (a node naming a new
                    # floor at every call is backed off like any failing release).
                    handle_releases.retry_later(
                        self.db, row.id, token,
                        0.0 if row.attempts <= 1 else handle_releases.backoff(row.attempts),
                        exc.message)
                    continue
                if exc.fenced:
                    # A newer claim acted on the handle: nothing was done here, nothing to
                    # free or retry (the lease, if still ours, lapses and the row is retaken
                    # with a newer token).
                    LOG.warning("Release of attach handle %s on %s refused by its agent "
                                "(fenced; left to the newer claim): %s", row.handle_uuid,
                                row.hostname, exc.message)
                    continue
                delay = handle_releases.backoff(row.attempts)
                LOG.warning("Attach handle %s on %s not released (try %d): %s; retried in "
                            "%.0f s, the handle stays in use", row.handle_uuid, row.hostname,
                            row.attempts, exc.message, delay)
                handle_releases.retry_later(self.db, row.id, token, delay, exc.message)
                continue
            if handle_releases.finish(self.db, row.id, row.attach_handle_id, token):
                LOG.info("Released attach handle %s of %s on %s", row.handle_uuid,
                         row.deployable_name, row.hostname)
        return len(rows)

    def drain(self) -> None:
        while self.run_once() >= self.batch:
            pass


class HandleReleaseComponent:
    """Conductor component: the periodic drain of the release queue, and the agents'
    reports of the host steps on their nodes (orphans are queued)."""

    def __init__(self, conf: cfg.ConfigOpts, db: Database) -> None:
        self.conf = conf
        self.db = db
        self.worker = ReleaseWorker(conf, db)

    def routes(self) -> dict:
        return {HOST_STEPS_PATH: {"POST": self.on_host_steps}}

    def use_ownership(self, ownership: Ownership) -> None:
        """Drain only the releases of the hosts the ring gives this conductor."""
        self.worker.ownership = ownership

    def node_paths(self) -> list[str]:
        """A node's key may report its own host steps (and no other host's)."""
        return [HOST_STEPS_PATH]

    def on_host_steps(self, req: falcon.Request, resp: falcon.Response) -> None:
        hostname = caller_node(req)
        if hostname is None:
            raise falcon.HTTPError(400, description="A host-step report must be signed with "
                                                    "the key of the node it is about.")
        body = json_body(req)
        error = next(iter(HOST_STEPS.iter_errors(body)), None)
        if error is not None:
            where = "/".join(str(p) for p in error.absolute_path)
            raise falcon.HTTPBadRequest(description=f"Invalid host-step report"
                                                    f"{f' at {where!r}' if where else ''}: "
                                                    f"{error.message}")
        steps = [(s["driver_name"], s["attach_type"], s["attach_info"])
                 for s in body["host_steps"]]
        outcome = handle_releases.queue_orphans(self.db, hostname, steps)
        if outcome["queued"]:
            LOG.warning("Host %s has %d orphaned attach handle(s) (prepared there, held by no "
                        "ARQ): %s; their release is queued", hostname, len(outcome["queued"]),
                        ", ".join(outcome["queued"]))
        if outcome["unknown"]:
            LOG.info("Host %s reported %d prepared attach handle(s) the inventory does not "
                     "name; left alone: %s", hostname, len(outcome["unknown"]),
                     ", ".join(outcome["unknown"][:10]))
        respond(resp, {"queued": outcome["queued"], "in_use": len(outcome["in_use"]),
                       "unknown": len(outcome["unknown"])})

    def periodic_tasks(self) -> list[PeriodicTask]:
        return [PeriodicTask("handle-release", self.conf.conductor.bind_poll_interval,
                             self.worker.drain)]

    def start(self) -> None:
        pass

    def stop(self) -> None:
        pass
