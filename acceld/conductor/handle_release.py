"""The conductor's release component: drains the attach-handle release queue.

Every ``[conductor] bind_poll_interval`` seconds each conductor claims due rows
of ``handle_releases`` (a lease per claim, so several conductors share the
queue), asks each handle's agent to release it (acceld.agent.attach) and, on
success, frees the handle and deletes the row in one transaction. An agent
that is down, unreachable or failing leaves the row to be retried with
exponential backoff (2 s doubling up to 5 minutes); the handle stays
``in_use`` meanwhile, so no bind can take it while the host may still hold the
old VM's mdev. ``last_error`` on the row says why it is still waiting.
"""

from __future__ import annotations

import logging
import os
import socket
import uuid

from oslo_config import cfg

from acceld.conductor.attach import AttachClient, AttachError, request_body
from acceld.conductor.programming import local_name
from acceld.conductor.service import PeriodicTask
from acceld.db import handle_releases
from acceld.db.engine import Database

LOG = logging.getLogger(__name__)

BATCH = 8


class ReleaseWorker:
    """Claims and runs releases. ``run_once`` is synchronous (tests drive it)."""

    def __init__(self, conf: cfg.ConfigOpts, db: Database, client: AttachClient | None = None,
                 batch: int = BATCH) -> None:
        self.conf = conf
        self.db = db
        self.client = client if client is not None else AttachClient(conf, db)
        self.batch = batch
        self.owner = f"{socket.gethostname()[:30]}-{os.getpid()}"

    def run_once(self) -> int:
        """One claim; returns how many releases it took (done or put back)."""
        token = f"{self.owner}-{uuid.uuid4().hex[:16]}"[:64]
        # A claim outlives every call in it, so that no other conductor retakes a row in use.
        lease = float(self.conf.conductor.attach_timeout) * (self.batch + 1) + 10
        rows = handle_releases.claim(self.db, token, self.batch, lease)
        for row in rows:
            body = request_body(row.driver_name, local_name(row.deployable_name, row.hostname),
                                row.attach_type, row.attach_info)
            try:
                self.client.release(row.hostname, body)
            except AttachError as exc:
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
    """Conductor component: the periodic drain of the release queue."""

    def __init__(self, conf: cfg.ConfigOpts, db: Database) -> None:
        self.conf = conf
        self.worker = ReleaseWorker(conf, db)

    def routes(self) -> dict:
        return {}

    def periodic_tasks(self) -> list[PeriodicTask]:
        return [PeriodicTask("handle-release", self.conf.conductor.bind_poll_interval,
                             self.worker.drain)]

    def start(self) -> None:
        pass

    def stop(self) -> None:
        pass
