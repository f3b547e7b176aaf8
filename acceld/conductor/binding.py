"""The conductor's binding component: completes bind jobs, then tells Nova.

Flow (see docs/arqs.md): the API commits ARQs in BindStarted together with a
``pending`` bind job each, then calls ``POST /binds/wake``. Worker threads
claim batches of jobs with a lease, bind each ARQ in its own transaction
(ARQ row locked, job still ours, target checked, one handle taken, ARQ moved
to Bound or BindFailed, job moved to ``notify``), then send Nova one event per
resolved ARQ and drop the jobs. A periodic scan wakes the workers when jobs are
due without a wake call: jobs of a conductor that died (expired leases) and
notifications waiting to be retried.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
import uuid

import falcon
from oslo_config import cfg
from sqlalchemy import delete, select

from acceld.clients import nova
from acceld.conductor import bind_attach, bind_programming, bind_target, placement_checks
from acceld.conductor.attach import AttachClient, AttachError
from acceld.conductor.service import PeriodicTask
from acceld.db import accelerator_requests as arq_db
from acceld.db import bind_jobs
from acceld.db.engine import Database
from acceld.db.models import accelerator_requests as arqs
from acceld.db.models import bind_jobs as jobs_table
from acceld.internal.server import respond

LOG = logging.getLogger(__name__)

BATCH = 16  # jobs per claim: small enough to spread over worker threads
MAX_BIND_ATTEMPTS = 5  # claims of one pending job before its ARQ is failed
MAX_NOTIFY_ATTEMPTS = 10  # claims of one notify job before its event is given up


class _JobLost(Exception):
    """The job or its ARQ changed under us (unbound, deleted, re-claimed): roll back."""


class BindWorker:
    """Claims and completes bind jobs. ``run_once`` is synchronous (tests drive it)."""

    def __init__(self, conf: cfg.ConfigOpts, db: Database,
                 notifier: nova.NovaNotifier | None = None, batch: int = BATCH) -> None:
        self.conf = conf
        self.db = db
        self.batch = batch
        self.notifier = notifier if notifier is not None else nova.NovaNotifier(conf)
        # Placement's view of each target, checked before the transaction (network calls).
        self.placement = placement_checks.BindPlacementCheck(conf)
        # Programming asked by the profile group (accel:bitstream_id / function_id): also
        # before the transaction, then checked inside it.
        self.programming = bind_programming.BindProgramming(conf, db)
        # Handles with a host step (an mdev) are prepared by the node's agent between two
        # transactions (acceld.conductor.bind_attach).
        self.attach = AttachClient(conf, db)
        self.owner = f"{socket.gethostname()[:30]}-{os.getpid()}"
        self.stopping = threading.Event()
        # Tokens of the claims being worked on now; renew_leases keeps them from lapsing.
        self._active: set[str] = set()
        self._active_guard = threading.Lock()

    def _token(self) -> str:
        return f"{self.owner}-{uuid.uuid4().hex[:16]}"[:64]

    def _activate(self, token: str) -> None:
        with self._active_guard:
            self._active.add(token)

    def _deactivate(self, *tokens: str) -> None:
        with self._active_guard:
            self._active.difference_update(tokens)

    def renew_leases(self) -> int:
        """Extend the leases of the claims in progress (a periodic task of this conductor).

        A batch is worked through one job at a time, and one job may wait for Placement,
        a program (``[conductor] program_timeout``) or an attach step: longer than
        ``bind_lease_seconds``. Without renewal the lease lapses, another worker claims
        the same job, programs the device again, and the job's attempts run up until the
        bind is abandoned although no conductor died.
        """
        with self._active_guard:
            tokens = sorted(self._active)
        return bind_jobs.renew(self.db, tokens, self.conf.conductor.bind_lease_seconds)

    def run_once(self) -> int:
        """Claim one batch of binds and one of orphaned notifications; return how many jobs."""
        lease = self.conf.conductor.bind_lease_seconds
        token = self._token()
        self._activate(token)
        try:
            claimed = bind_jobs.claim(self.db, bind_jobs.PENDING, token, self.batch, lease)
            resolved: list[int] = []
            for index, job in enumerate(claimed):
                if self.stopping.is_set():
                    bind_jobs.retry_later(self.db, [j.id for j in claimed[index:]], token, 0)
                    break
                if self._bind(job, token):
                    resolved.append(job.id)
            self._notify(resolved, token)
        finally:
            self._deactivate(token)
        orphan_token = self._token()
        self._activate(orphan_token)
        try:
            orphans = bind_jobs.claim(self.db, bind_jobs.NOTIFY, orphan_token, self.batch, lease)
            self._notify([j.id for j in orphans], orphan_token)
        finally:
            self._deactivate(orphan_token)
        return len(claimed) + len(orphans)

    def _bind(self, job, token: str) -> bool:  # type: ignore[no-untyped-def]
        """One ARQ, one transaction. True when the ARQ resolved and the job awaits notify."""
        delay = self.conf.conductor.bind_delay_for_tests
        if delay:
            time.sleep(delay)
        try:
            verdict = self.placement.before(self.db, job.arq_id)
            programmed = self.programming.before(
                self.db, job.arq_id, placement_refused=bool(verdict and verdict.refusal))
            with self.db.write() as conn:
                arq = arq_db.lock_one_by_id(conn, job.arq_id)
                if arq is None or not bind_jobs.lock_owned(conn, job.id, token):
                    raise _JobLost
                if arq.state != arq_db.BIND_STARTED:
                    # Nothing to bind (changed by hand?): drop the job, keep the ARQ.
                    conn.execute(delete(jobs_table).where(jobs_table.c.id == job.id))
                    LOG.warning("Bind job for ARQ %s found it %s; dropped", arq.uuid, arq.state)
                    return False
                ticket = self._resolve(conn, arq, job, verdict, programmed)
            if ticket is not None:
                return self._finish_prepared(ticket, job, token)
            return True
        except _JobLost:
            LOG.info("Bind job %s for ARQ id %s was unbound, deleted or taken over; skipped",
                     job.id, job.arq_id)
            return False
        except Exception:  # noqa: BLE001 - a bug or a database error: retry this job later
            LOG.exception("Bind job %s for ARQ id %s failed; it will be retried", job.id,
                          job.arq_id)
            bind_jobs.retry_later(self.db, [job.id], token, min(5.0, job.attempts * 1.0))
            return False

    def _resolve(self, conn, arq, job,  # type: ignore[no-untyped-def]
                 verdict: placement_checks.Verdict | None = None,
                 programmed: bind_programming.ProgramVerdict | None = None
                 ) -> bind_attach.Ticket | None:
        """Bound or BindFailed; or, for a handle with a host step, the handle held and a
        ticket to prepare it (the ARQ stays BindStarted)."""
        attempts = job.attempts
        target = bind_target.BindTarget(
            arq_uuid=arq.uuid, hostname=arq.hostname, device_rp_uuid=arq.device_rp_uuid,
            instance_uuid=arq.instance_uuid,
            group=bind_target.group_of(arq.profile_json, arq.device_profile_group_id))
        try:
            if attempts > MAX_BIND_ATTEMPTS:
                raise bind_target.BindRefused(
                    f"the bind was abandoned after {attempts - 1} attempts that did not finish "
                    "(the conductor died or failed each time)")
            self.placement.enforce(verdict, arq)
            self.programming.enforce(programmed, conn, arq)
            held = arq.attach_handle_id and bind_attach.held_handle(conn, arq.attach_handle_id)
            if held:
                # An earlier try took this handle and was interrupted while preparing it.
                for check in bind_target.CHECKS:
                    check(conn, target)
                target.handle = held
            else:
                bind_target.check_and_take(conn, target)
        except bind_target.BindRefused as refused:
            if arq.attach_handle_id:
                arq_db.release_handles(conn, [arq.attach_handle_id])
            moved = arq_db.transition(conn, [arq.id], arq_db.BIND_FAILED,
                                      bind_failure_reason=refused.reason[:4000],
                                      attach_handle_id=None, deployable_id=None)
            LOG.warning("Bind of ARQ %s (instance %s) to provider %s on %s failed: %s",
                        arq.uuid, arq.instance_uuid, arq.device_rp_uuid, arq.hostname,
                        refused.reason)
        else:
            if bind_attach.needs_step(target.handle):
                return bind_attach.hold(conn, arq, target, job.id)
            moved = arq_db.transition(conn, [arq.id], arq_db.BOUND,
                                      attach_handle_id=target.handle.id,
                                      deployable_id=target.deployable.id,
                                      bind_failure_reason=None)
            LOG.info("Bound ARQ %s (instance %s) to handle %s of deployable %s on %s", arq.uuid,
                     arq.instance_uuid, target.handle.uuid, target.deployable.name, arq.hostname)
        if moved != 1:
            raise _JobLost
        return None

    def _finish_prepared(self, ticket: bind_attach.Ticket, job, token: str  # type: ignore[no-untyped-def]
                         ) -> bool:
        """Prepare the held handle on its host (no transaction open), then Bound or
        BindFailed in a second transaction, if the job is still this claim's."""
        try:
            prepared = bind_attach.prepare(self.attach, ticket)
        except AttachError as unreachable:
            if job.attempts < MAX_BIND_ATTEMPTS:
                LOG.warning("Attach handle %s for ARQ %s not prepared (%s); the bind is "
                            "retried", ticket.handle_uuid, ticket.arq_uuid, unreachable.message)
                bind_jobs.retry_later(self.db, [job.id], token, min(5.0, job.attempts * 1.0))
                return False
            prepared = bind_attach.Prepared(unreachable)
        # Bound or BindFailed, never leaving a host step behind (bind_attach.settle).
        if not bind_attach.settle(self.db, ticket, job.id, token, prepared.error):
            raise _JobLost  # unbound or deleted meanwhile: the handle went to the queue
        return True

    def _notify(self, job_ids: list[int], token: str) -> None:
        """One Nova event per resolved ARQ of these jobs (if still ours), then drop the jobs."""
        if not job_ids:
            return
        with self.db.read() as conn:
            rows = conn.execute(select(
                jobs_table.c.id, jobs_table.c.attempts, arqs.c.uuid, arqs.c.state,
                arqs.c.instance_uuid).select_from(
                jobs_table.join(arqs, arqs.c.id == jobs_table.c.arq_id)).where(
                jobs_table.c.id.in_(job_ids), jobs_table.c.lease_owner == token)).all()
        events, silent = [], []
        for row in rows:
            status = {arq_db.BOUND: "completed", arq_db.BIND_FAILED: "failed"}.get(row.state)
            if status is None or not row.instance_uuid:
                silent.append(row.id)
            else:
                events.append((row, nova.Event(row.instance_uuid, row.uuid, status)))
        outcomes = self.notifier.send([e for _, e in events])
        done = list(silent)
        again: list[int] = []
        for row, event in events:
            if outcomes.get(event.arq_uuid) != nova.RETRY:
                done.append(row.id)
            elif row.attempts >= MAX_NOTIFY_ATTEMPTS:
                LOG.error("Giving up the %s event for ARQ %s after %d attempts", nova.EVENT_NAME,
                          row.uuid, row.attempts)
                done.append(row.id)
            else:
                again.append(row.id)
        bind_jobs.finish(self.db, done, token)
        if again:
            tries = max(row.attempts for row, _ in events)
            delay = min(float(self.conf.conductor.bind_lease_seconds),
                        max(1.0, self.conf.nova.retry_initial_delay) * 2 ** min(tries, 6))
            bind_jobs.retry_later(self.db, again, token, delay)


class BindingComponent:
    """Conductor component: the wake route, worker threads, and the safety-net scan."""

    def __init__(self, conf: cfg.ConfigOpts, db: Database) -> None:
        self.conf = conf
        self.db = db
        self.worker = BindWorker(conf, db)
        self._wake = threading.Event()
        self._threads: list[threading.Thread] = []

    def routes(self) -> dict:
        return {"/binds/wake": {"POST": self.on_wake}}

    def on_wake(self, req: falcon.Request, resp: falcon.Response) -> None:
        self._wake.set()
        respond(resp, {"status": "woken"}, status=202)

    def periodic_tasks(self) -> list[PeriodicTask]:
        renew_every = max(1.0, self.conf.conductor.bind_lease_seconds / 3)
        return [PeriodicTask("bind-scan", self.conf.conductor.bind_poll_interval, self.scan),
                PeriodicTask("bind-lease-renew", renew_every, self.worker.renew_leases)]

    def scan(self) -> None:
        """Wake the workers when a job is due that no wake call announced."""
        if bind_jobs.any_due(self.db):
            self._wake.set()

    def start(self) -> None:
        if not self.worker.notifier.configured:
            LOG.warning("[nova] is not configured: binds complete, but Nova gets no "
                        "%s events", nova.EVENT_NAME)
        for index in range(self.conf.conductor.bind_workers):
            thread = threading.Thread(target=self._loop, name=f"bind-worker-{index}",
                                      daemon=True)
            thread.start()
            self._threads.append(thread)
        self._wake.set()  # jobs left by a previous run

    def _loop(self) -> None:
        while not self.worker.stopping.is_set():
            self._wake.wait()
            if self.worker.stopping.is_set():
                return
            self._wake.clear()
            try:
                while not self.worker.stopping.is_set() and self.worker.run_once():
                    pass
            except Exception:  # noqa: BLE001 - e.g. the database is away; the scan retries
                LOG.exception("Bind worker pass failed")

    def stop(self) -> None:
        self.worker.stopping.set()
        self._wake.set()
        for thread in self._threads:
            thread.join(timeout=10)
