"""The conductor's binding component: completes bind jobs, then tells Nova.

Flow (see docs/arqs.md): the API commits ARQs in BindStarted together with a
``pending`` bind job each, then calls ``POST /binds/wake``. Worker threads each
claim the due jobs of one instance with a lease (concurrent claims skip each
other's rows), bind each ARQ in its own transaction (ARQ row locked, job still
ours, target checked, one handle taken, ARQ moved to Bound or BindFailed, job
moved to ``notify``), then send Nova that instance's events and drop the jobs,
so one instance's slow program or prepare never holds up another's events. A
periodic scan wakes the workers when jobs are due without a wake call: jobs of
a conductor that died (expired leases) and notifications waiting to be retried.

Outages (Placement, an agent, the image service, the database) are waited out,
not counted as failed tries (acceld.conductor.binding.outages): one WARNING when
one starts and one when it ends, no traceback per retry.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import functools
import logging
import os
import random
import socket
import threading
import time
import uuid
from dataclasses import dataclass
from typing import Any, Callable

import falcon
from oslo_config import cfg
from sqlalchemy import Select, bindparam, delete, select

from acceld import fastcheck, request_ids
from acceld.clients import deadline as deadlines
from acceld.clients import nova
from acceld.clients.conductor import MOST_ARQS_WAITED_FOR
from acceld.conductor.binding import attach as bind_attach
from acceld.conductor.binding import outages as bind_outages
from acceld.conductor.binding import programming as bind_programming
from acceld.conductor.binding import target as bind_target
from acceld.conductor.binding.attach_client import AttachClient, AttachError
from acceld.conductor.binding.wakes import ResolvedWatch, WakeCalls
from acceld.conductor.placement import checks as placement_checks
from acceld.conductor.service import PeriodicTask
from acceld.db import accelerator_requests as arq_db
from acceld.db import bind_jobs, claims
from acceld.db.clock import db_now, sql_now
from acceld.db.engine import Database
from acceld.db.retry import is_deadlock
from acceld.db.models import accelerator_requests as arqs
from acceld.db.models import bind_jobs as jobs_table
from acceld.internal.server import json_body, respond
from acceld.jsonschemas import strict_validator
from acceld.metrics import record as metrics
from acceld.outages import process_log

LOG = logging.getLogger(__name__)

BATCH = 16  # the most jobs of one instance per claim
MAX_BIND_ATTEMPTS = 5  # claims of one pending job before its ARQ is failed
MAX_NOTIFY_ATTEMPTS = 10  # claims of one notify job before its event is given up
REASON_LENGTH = 4000  # the most of a refusal's reason kept as bind_failure_reason
# Seconds a worker may be past the deadline of the call it is in before its claim stops
# being renewed (the call was not cut: the watchdog cannot end a name lookup).
RENEW_GRACE = 1.0
# Seconds of a claim's lease (by the database's clock) a Nova call leaves unused: what a
# clock running slightly faster here, and the check's own round trip, may take.
LEASE_MARGIN = 1.0


class _JobLost(Exception):
    """The job or its ARQ changed under us (unbound, deleted, re-claimed): roll back."""


class _DatabaseAway(Exception):
    """The database could not be reached in the middle of a claim's work."""


class BindWorker:
    """Claims and completes bind jobs. ``run_once`` is synchronous (tests drive it)."""

    def __init__(self, conf: cfg.ConfigOpts, db: Database,
                 notifier: nova.NovaNotifier | None = None, batch: int = BATCH,
                 clock: Callable[[], dt.datetime] | None = None) -> None:
        self.conf = conf
        self.db = db
        self.batch = batch
        # Judges [conductor] bind_timeout against the jobs' created_at (tests move it). By
        # default the database's clock, which also stamped created_at: a conductor whose own
        # clock is off neither fails a bind early nor lets it wait past its deadline.
        self.clock = clock or self._db_now
        # Shared with the other components (acceld.outages.process_log): one WARNING each
        # way per outage per process, whichever path meets it.
        self.outages = process_log()
        # Claims whose work the database's going away interrupted: {token: job ids}. Given
        # back (without using an attempt) as soon as the database answers again, so that
        # they are not left to wait out their lease.
        self._stranded: dict[str, list[int]] = {}
        self._stranded_guard = threading.Lock()
        # Called after a claim that left jobs due: the component wakes another worker, so a
        # single wake-up spreads over as many workers as there are instances due.
        self.on_claimed: Callable[[], None] = lambda: None
        # Job id -> the outage its program step waited on (the agent or the image service).
        self._program_blocked: dict[int, str] = {}
        # Job id -> the agent it waited for because the agent was marked down.
        self._agent_blocked: dict[int, str] = {}
        self.notifier = notifier if notifier is not None else nova.NovaNotifier(conf)
        # Placement's view of each target, checked before the transaction (network calls).
        self.placement = placement_checks.BindPlacementCheck(conf)
        # Programming asked by the profile group (accel:bitstream_id / function_id): also
        # before the transaction, then checked inside it.
        self.programming = bind_programming.BindProgramming(conf, db)
        # Handles with a host step (an mdev) are prepared by the node's agent between two
        # transactions (acceld.conductor.binding.attach).
        self.attach = AttachClient(conf, db)
        self.owner = f"{socket.gethostname()[:30]}-{os.getpid()}"
        self.stopping = threading.Event()
        # Wake calls waiting for the ARQs this process's workers resolve (bind_wakes).
        self.resolved = ResolvedWatch()
        # Tokens of the claims being worked on now, with the thread working on each;
        # renew_leases keeps them from lapsing, unless that thread is stuck in a call.
        self._active: dict[str, int] = {}
        self._active_guard = threading.Lock()
        self._stuck: set[str] = set()  # tokens no longer renewed (logged once each)
        # Tests: called with the job ids once _notify has read its jobs, before Nova.
        self.on_notify_read: Callable[[list[int]], None] = lambda job_ids: None
        # Tests: called with the lease left, right after _still_ours read it, before Nova.
        self.on_lease_read: Callable[[float], None] = lambda lease_left: None

    def _token(self) -> str:
        return f"{self.owner}-{uuid.uuid4().hex[:16]}"[:64]

    def _activate(self, token: str) -> None:
        with self._active_guard:
            self._active[token] = threading.get_ident()

    def _deactivate(self, *tokens: str) -> None:
        with self._active_guard:
            for token in tokens:
                self._active.pop(token, None)
                self._stuck.discard(token)

    def renew_leases(self) -> int:
        """Extend the leases of the claims in progress (a periodic task of this conductor).

        A batch is worked through one job at a time, and one job may wait for Placement,
        a program (``[conductor] program_timeout``) or an attach step: longer than
        ``bind_lease_seconds``. Without renewal the lease lapses, another worker claims
        the same job, programs the device again, and the job's attempts run up until the
        bind is abandoned although no conductor died.

        A claim whose worker is in a peer call past that call's deadline (one the watchdog
        could not cut, acceld.clients.deadline) is not renewed: it lapses, and another
        worker or conductor takes its jobs up, instead of a stuck call holding them forever.
        """
        with self._active_guard:
            active = sorted(self._active.items())
        tokens = []
        for token, thread in active:
            stuck = deadlines.overdue(thread, RENEW_GRACE)
            if stuck is None:
                tokens.append(token)
                continue
            with self._active_guard:
                first = token in self._active and token not in self._stuck
                self._stuck.add(token)
            if first:
                LOG.error("A bind worker is still in a call past its %g s deadline (%s); "
                          "its claim %s is no longer renewed and lapses, so that its jobs "
                          "are taken up again", stuck.seconds, stuck.what, token)
        return bind_jobs.renew(self.db, tokens, self.conf.conductor.bind_lease_seconds)

    def run_once(self) -> int:
        """Claim and complete the due binds of one instance, then one batch of orphaned
        notifications; return how many jobs were claimed (0 while the database is away)."""
        return self.run_pass()[0]

    def run_pass(self) -> tuple[int, bool]:
        """:meth:`run_once`, and whether its claims saw more jobs due than they took (another
        instance's, or a full batch): only then is another pass worth its claims. Jobs that
        fall due later come with their own wake (a PATCH's) or the periodic scan's."""
        if not self.resume_stranded():
            return 0, False
        lease = self.conf.conductor.bind_lease_seconds
        count = 0
        left_due = False
        for phase, work in ((bind_jobs.PENDING, self._bind_claimed),
                            (bind_jobs.NOTIFY, self._notify_claimed)):
            token = self._token()
            self._activate(token)
            claimed = []
            try:
                claimed, more = bind_jobs.claim_and_peek(self.db, phase, token, self.batch,
                                                         lease)
                if more:  # another instance is due (or this one has more): another worker
                    self.on_claimed()
                    left_due = True
                work(claimed, token)
            except Exception as exc:  # noqa: BLE001 - sorted below
                if not (isinstance(exc, _DatabaseAway) or self.db.outage.is_outage(exc)):
                    raise
                self._database_away(exc, token, [job.id for job in claimed])
                return 0, False
            finally:
                self._deactivate(token)
            count += len(claimed)
        return count, left_due

    def _bind_claimed(self, claimed: list, token: str) -> None:
        resolved: list[int] = []
        committed: dict[int, tuple[Any, _Outcome]] = {}
        started = time.monotonic()
        for index, job in enumerate(claimed):
            if self.stopping.is_set():
                bind_jobs.retry_later(self.db, [j.id for j in claimed[index:]], token, 0,
                                      refund=True)
                break
            # The job's lines (and its calls to Placement, the agent, Nova) name the
            # request that started the bind.
            with request_ids.bound(job.global_request_id), \
                    self._within_bind_timeout(job, started):
                if self._bind(job, token, committed):
                    resolved.append(job.id)
                    self.resolved.announce(job.arq_id)
        known = {job.id: _notify_row(job, *committed[job.id], started)
                 for job in claimed if job.id in committed}
        self._notify(resolved, token, known)

    def _within_bind_timeout(self, job, claimed: float  # type: ignore[no-untyped-def]
                             ) -> contextlib.AbstractContextManager:
        """Hold the bind's peer calls (Placement, the agent) to what is left of ``[conductor]
        bind_timeout``, by the database's clock at the claim: a peer that stalls ends the
        call there, and the bind then fails naming it, instead of resolving after Nova gave
        up. A bind already past it (its conductor was down) is not held beyond each call's
        own deadline: an outage then fails it at once (``_wait_out``)."""
        at = getattr(job, "claimed_at", None)
        if job.created_at is None or at is None:
            return contextlib.nullcontext()
        left = self._deadline(job).remaining(at) - (time.monotonic() - claimed)
        if left <= 0:
            return contextlib.nullcontext()
        return deadlines.bounded(left, "the bind ([conductor] bind_timeout)")

    def _notify_claimed(self, claimed: list, token: str) -> None:
        self._notify([job.id for job in claimed], token)

    def _database_away(self, exc: BaseException, token: str, job_ids: list[int]) -> None:
        cause = exc.__cause__ if isinstance(exc, _DatabaseAway) and exc.__cause__ else exc
        self.db.outage.down(cause, "binds resume as soon as it is back")
        if job_ids:
            with self._stranded_guard:
                self._stranded[token] = job_ids

    def has_stranded(self) -> bool:
        return bool(self._stranded)

    def resume_stranded(self) -> bool:
        """Give back the claims the database's outage interrupted, so that any worker takes
        them up now. False while the database is still away."""
        with self._stranded_guard:
            stranded = list(self._stranded.items())
        for token, job_ids in stranded:
            try:
                bind_jobs.retry_later(self.db, job_ids, token, 0, refund=True)
            except Exception as exc:  # noqa: BLE001 - sorted below
                if not self.db.outage.is_outage(exc):
                    raise
                self.db.outage.down(exc, "binds resume as soon as it is back")
                return False
            with self._stranded_guard:
                self._stranded.pop(token, None)
            LOG.info("Bind jobs %s interrupted by the database outage are due again",
                     ", ".join(map(str, job_ids)))
        return True

    def _bind(self, job, token: str,  # type: ignore[no-untyped-def]
              committed: dict[int, tuple[Any, _Outcome]] | None = None) -> bool:
        """One ARQ, one transaction. True when the ARQ resolved and the job awaits notify.
        ``committed``: gets ``{job id: (ARQ row, outcome)}`` when the outcome was committed
        by this call's one transaction (not after a host step), for :meth:`_notify`."""
        delay = self.conf.conductor.bind_delay_for_tests
        if delay:
            time.sleep(delay)
        try:
            verdict = self.placement.before(self.db, job.arq_id)
            if self.placement.client is not None:
                self.outages.up(bind_outages.PLACEMENT, LOG)
            programmed = self.programming.before(
                self.db, job.arq_id, placement_refused=bool(verdict and verdict.refusal),
                group=_claimed_group(job))
            blocked = self._program_blocked.pop(job.id, None)
            if blocked is not None:  # the step this job waited on went through
                self.outages.up(blocked, LOG)
            with self.db.write() as conn:
                arq = self._lock_own_arq(conn, job, token)
                if arq is None:
                    return False
                ticket = self._resolve(conn, arq, job, verdict, programmed)
            if isinstance(ticket, bind_attach.Ticket):
                return self._finish_prepared(ticket, job, token)
            if committed is not None:
                committed[job.id] = (arq, ticket)
            return True
        except _JobLost:
            LOG.info("Bind job %s for ARQ id %s was unbound, deleted or taken over; skipped",
                     job.id, job.arq_id)
            return False
        except Exception as exc:  # noqa: BLE001 - an outage, or a bug: sorted here
            outage = bind_outages.classify(exc)
            if outage is not None:
                if isinstance(exc, bind_programming.ProgrammingUnavailable):
                    # Only a try that programs again tells that this one is back: most
                    # binds never reach the agent or the image service for a program.
                    self._program_blocked[job.id] = outage.what
                elif isinstance(exc, bind_target.AgentDown):
                    # Ends (in the log) when a try of this job finds the agent up.
                    self._agent_blocked[job.id] = outage.what
                return self._wait_out(job, token, outage)
            if self.db.outage.is_outage(exc):
                raise _DatabaseAway from exc
            if is_deadlock(exc):
                # A deadlock victim, or a commit another Galera node's won: the bind's
                # transaction was rolled back whole (nothing after it ran), so the job is
                # tried again from its start soon, not counted as a try.
                LOG.warning("Bind job %s for ARQ id %s lost a write conflict (deadlock or "
                            "Galera certification); it will be run again: %s", job.id,
                            job.arq_id, getattr(exc, "orig", exc))
                bind_jobs.retry_later(self.db, [job.id], token, 0.05 + random.random() / 10,
                                      refund=True)
                return False
            LOG.exception("Bind job %s for ARQ id %s failed; it will be retried", job.id,
                          job.arq_id)
            bind_jobs.retry_later(self.db, [job.id], token, min(5.0, job.attempts * 1.0))
            return False

    def _db_now(self) -> dt.datetime:
        """The database's clock (one query, on the outage path only)."""
        with self.db.read() as conn:
            return db_now(conn)

    def _deadline(self, job) -> bind_outages.Deadline:  # type: ignore[no-untyped-def]
        return bind_outages.Deadline(job.created_at, float(self.conf.conductor.bind_timeout))

    def _wait_out(self, job, token: str, outage: bind_outages.Unavailable) -> bool:  # type: ignore[no-untyped-def]
        """Try again later without using an attempt; past the deadline, BindFailed."""
        timeout = self.conf.conductor.bind_timeout
        self.outages.down(outage.what, outage.detail,
                          f"binds wait for it, each up to [conductor] bind_timeout ({timeout} s)",
                          logger=LOG)
        deadline, now = self._deadline(job), self.clock()
        if not deadline.passed(now):
            bind_jobs.retry_later(self.db, [job.id], token, deadline.backoff(now), refund=True)
            return False
        self._program_blocked.pop(job.id, None)
        self._agent_blocked.pop(job.id, None)
        return self._fail(job, token, bind_outages.reason(outage, timeout))

    def _fail(self, job, token: str, reason: str) -> bool:  # type: ignore[no-untyped-def]
        """BindFailed with ``reason`` in one transaction, if the job is still ours."""
        try:
            with self.db.write() as conn:
                arq = self._lock_own_arq(conn, job, token)
                if arq is None:
                    return False
                self._refuse(conn, arq, reason)
            return True
        except _JobLost:
            return False

    @staticmethod
    def _lock_own_arq(conn, job, token: str):  # type: ignore[no-untyped-def]
        """The job's ARQ, locked, while the job is still ours (else _JobLost) and the ARQ
        still binding; an ARQ moved on (changed by hand?) has its job dropped: None."""
        arq = arq_db.lock_one_by_id(conn, job.arq_id)
        if arq is None or not bind_jobs.lock_owned(conn, job.id, token):
            raise _JobLost
        if arq.state != arq_db.BIND_STARTED:
            conn.execute(delete(jobs_table).where(jobs_table.c.id == job.id))
            LOG.warning("Bind job for ARQ %s found it %s; dropped", arq.uuid, arq.state)
            return None
        return arq

    def _resolve(self, conn, arq, job,  # type: ignore[no-untyped-def]
                 verdict: placement_checks.Verdict | None = None,
                 programmed: bind_programming.ProgramVerdict | None = None
                 ) -> bind_attach.Ticket | _Outcome:
        """Bound or BindFailed (what was committed); or, for a handle with a host step, the
        handle held and a ticket to prepare it (the ARQ stays BindStarted)."""
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
            self._agent_back(job, target)
            moved = self._refuse(conn, arq, refused.reason)
            outcome = _Outcome(arq_db.BIND_FAILED, refused.reason[:REASON_LENGTH])
        else:
            self._agent_back(job, target)
            ticket = bind_attach.hold(conn, arq, target, job.id)
            if ticket is not None:  # the host acts first (a prepare, or a fence)
                return ticket
            moved = arq_db.transition(conn, [arq.id], arq_db.BOUND,
                                      attach_handle_id=target.handle.id,
                                      deployable_id=target.deployable.id,
                                      bind_failure_reason=None)
            claims.record_claimed(conn, arq, target.handle.id)
            LOG.info("Bound ARQ %s (instance %s) to handle %s of deployable %s on %s", arq.uuid,
                     arq.instance_uuid, target.handle.uuid, target.deployable.name, arq.hostname)
            outcome = _Outcome(arq_db.BOUND, None)
        if moved != 1:
            raise _JobLost
        return outcome

    def _agent_back(self, job, target: bind_target.BindTarget) -> None:  # type: ignore[no-untyped-def]
        """End (in the log) the agent outage this job waited for, once a try saw it up."""
        if target.agent_up and (waited := self._agent_blocked.pop(job.id, None)):
            self.outages.up(waited, LOG)

    @staticmethod
    def _refuse(conn, arq, reason: str) -> int:  # type: ignore[no-untyped-def]
        """Inside the bind transaction: BindFailed with ``reason``, a held handle given back."""
        if arq.attach_handle_id:
            arq_db.release_handles(conn, [arq.attach_handle_id])
        # A standalone claim's allocation may have been written: written again without it.
        claims.mark_due(conn, [getattr(arq, "consumer_uuid", None)])
        moved = arq_db.transition(conn, [arq.id], arq_db.BIND_FAILED,
                                  bind_failure_reason=reason[:REASON_LENGTH],
                                  attach_handle_id=None, deployable_id=None)
        LOG.warning("Bind of ARQ %s (instance %s) to provider %s on %s failed: %s",
                    arq.uuid, arq.instance_uuid, arq.device_rp_uuid, arq.hostname, reason)
        return moved

    def _finish_prepared(self, ticket: bind_attach.Ticket, job, token: str  # type: ignore[no-untyped-def]
                         ) -> bool:
        """Prepare the held handle on its host (no transaction open), then Bound or
        BindFailed in a second transaction, if the job is still this claim's."""
        what = bind_outages.agent(ticket.hostname)
        try:
            prepared = bind_attach.prepare(self.attach, ticket)
        except AttachError as unreachable:  # 503: nothing ran on the host
            outage = bind_outages.Unavailable(what, unreachable.message)
            if not self._deadline(job).passed(self.clock()):
                return self._wait_out(job, token, outage)  # the handle stays held
            self.outages.down(what, unreachable.message, logger=LOG)
            prepared = bind_attach.Prepared(AttachError(
                503, bind_outages.reason(outage, self.conf.conductor.bind_timeout)))
        else:
            self.outages.up(what, LOG)
        if prepared.again:  # the database was behind the agent, caught up: a new token now
            if job.attempts < MAX_BIND_ATTEMPTS:
                # Due at once, but a try all the same: a restore needs one catch-up per row,
                # and a node naming a new floor at every call ends like any failing prepare.
                bind_jobs.retry_later(self.db, [job.id], token, 0.0)
                return False
            assert prepared.error is not None
            prepared = bind_attach.Prepared(AttachError(409, (
                f"the agent of host {ticket.hostname} refused the host step as fenced at each "
                f"of {job.attempts} tries, each time naming a floor above the token it was "
                f"sent (raised to it each time): {prepared.error.message}")))
        # Bound or BindFailed, never leaving a host step behind (bind_attach.settle).
        if not bind_attach.settle(self.db, ticket, job.id, token, prepared.error):
            raise _JobLost  # unbound or deleted meanwhile: the handle went to the queue
        return True

    def _notify(self, job_ids: list[int], token: str,
                known: dict[int, Any] | None = None) -> None:
        """One Nova event per resolved ARQ of these jobs (if still ours), then drop the jobs.

        ``known``: rows of jobs whose outcome this claim just committed (what
        :func:`_notify_query` would read), so the event leaves without that read; whether
        each job is still this claim's is checked right before Nova all the same
        (:meth:`_still_ours`)."""
        if not job_ids:
            return
        known = known or {}
        rows = [known[job_id] for job_id in job_ids if job_id in known]
        unknown = [job_id for job_id in job_ids if job_id not in known]
        if unknown:
            with self.db.read() as conn:
                rows += conn.execute(_notify_query(conn.dialect.name),
                                     {"job_ids": unknown, "token": token}).all()
        self.on_notify_read([row.id for row in rows])
        metrics.binds_resolved(rows)  # outcome and PATCH-to-outcome time, once per job
        events, silent = [], []
        for row in rows:
            status = {arq_db.BOUND: "completed", arq_db.BIND_FAILED: "failed"}.get(row.state)
            if status is None or not row.instance_uuid:
                silent.append(row.id)
            else:
                events.append((row, nova.Event(row.instance_uuid, row.uuid, status)))
        # One batch per request that started the binds (usually one), sent under its id.
        by_request: dict[str | None, list[nova.Event]] = {}
        for row, event in events:
            by_request.setdefault(row.global_request_id, []).append(event)
        outcomes: dict[str, str] = {}
        job_of = {event.arq_uuid: row.id for row, event in events}
        lost: set[int] = set()  # claims that lapsed: their events are another's to send
        for global_request_id, batch in by_request.items():
            read_at = deadlines.now()  # the lease's clock starts at its read, not the send
            batch, lease_left = self._still_ours(batch, job_of, token, lost)
            if not batch:
                continue
            self.on_lease_read(lease_left)
            with request_ids.bound(global_request_id), \
                    deadlines.bounded(lease_left - LEASE_MARGIN, "the bind jobs' lease",
                                      since=read_at):
                outcomes.update(metrics.nova_events(self.notifier.send(batch)))
        done = list(silent)
        again: list[int] = []
        for row, event in events:
            if row.id in lost:
                continue
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

    def _still_ours(self, batch: list[nova.Event], job_of: dict[str, int], token: str,
                    lost: set[int]) -> tuple[list[nova.Event], float]:
        """The events of ``batch`` whose jobs this claim still holds, by the database, right
        before Nova is called (the others go into ``lost``), and the seconds the claim has
        left, which bound the call counted from a monotonic reading taken before this read
        (a worker frozen anywhere after it, before or inside the bounded block, finds its
        deadline passed when it resumes: the watched session refuses to start a request
        past it, and nothing is sent).

        The fence for a stalled conductor: one whose lease lapsed while it was frozen
        (SIGSTOP, a pause) does not send an event that the conductor which claimed the job
        next has sent. A conductor that dies after Nova took an event and before the job
        is dropped still has it sent again by the next claim: at least once (docs/arqs.md).
        """
        if not self.notifier.configured:  # nothing is sent: no query to spend on a fence
            return batch, float(self.conf.conductor.bind_lease_seconds)
        held = bind_jobs.held(self.db, [job_of[e.arq_uuid] for e in batch], token)
        ours = [e for e in batch if job_of[e.arq_uuid] in held]
        gone = [e for e in batch if job_of[e.arq_uuid] not in held]
        if gone:
            lost.update(job_of[e.arq_uuid] for e in gone)
            LOG.info("The claim on the bind jobs of ARQs %s lapsed before their %s events "
                     "were sent: left to the conductor that holds them now", ", ".join(
                         e.arq_uuid for e in gone), nova.EVENT_NAME)
        return ours, min(held.values(), default=0.0)


@functools.lru_cache(maxsize=4)
def _notify_query(dialect: str) -> Select:
    """What :meth:`BindWorker._notify` reads of its jobs and their ARQs, built once per
    dialect (it runs after every bind; building it cost more than running it)."""
    return select(
        jobs_table.c.id, jobs_table.c.attempts, jobs_table.c.global_request_id,
        arqs.c.uuid, arqs.c.state, arqs.c.instance_uuid, jobs_table.c.created_at,
        arqs.c.bind_failure_reason, sql_now(dialect).label("db_now")).select_from(
        jobs_table.join(arqs, arqs.c.id == jobs_table.c.arq_id)).where(
        jobs_table.c.id.in_(bindparam("job_ids", expanding=True)),
        jobs_table.c.lease_owner == bindparam("token"))


@dataclass(frozen=True)
class _Outcome:
    """What a bind transaction committed for its ARQ."""

    state: str  # Bound or BindFailed
    reason: str | None  # bind_failure_reason


@dataclass(frozen=True)
class _NotifyRow:
    """A row of :func:`_notify_query`, from what the bind transaction committed."""

    id: int
    attempts: int
    global_request_id: str | None
    uuid: str
    state: str
    instance_uuid: str | None
    created_at: dt.datetime
    bind_failure_reason: str | None
    db_now: dt.datetime


def _notify_row(job, arq, outcome: _Outcome, claimed: float) -> _NotifyRow:  # type: ignore[no-untyped-def]
    """``job``'s notify row from its claim (by the database's clock at the claim, plus the
    time since: the metrics' bind duration) and its bind's committed outcome."""
    return _NotifyRow(
        id=job.id, attempts=job.attempts, global_request_id=job.global_request_id,
        uuid=arq.uuid, state=outcome.state, instance_uuid=arq.instance_uuid,
        created_at=job.created_at, bind_failure_reason=outcome.reason,
        db_now=job.claimed_at + dt.timedelta(seconds=time.monotonic() - claimed))


def _claimed_group(job) -> dict[str, str] | None:  # type: ignore[no-untyped-def]
    """The profile group of the job's ARQ as its claim read it (bind_jobs.claim_and_peek);
    None when the ARQ was gone by then."""
    if job.profile_json is None:
        return None
    return bind_target.group_of(job.profile_json, job.device_profile_group_id)


# What an API worker may send to POST /binds/wake: nothing, or the ARQs its PATCH bound
# and how long to wait for them (acceld.clients.conductor.ConductorClient.wait_for_binds).
WAKE_SCHEMA = strict_validator({
    "type": "object",
    "additionalProperties": False,
    "properties": {
        "arq_ids": {"type": "array", "maxItems": MOST_ARQS_WAITED_FOR,
                    "items": {"type": "integer", "minimum": 1}},
        "wait": {"type": "number", "minimum": 0, "maximum": 10},
    },
})


class BindingComponent:
    """Conductor component: the wake route, worker threads, and the safety-net scan."""

    def __init__(self, conf: cfg.ConfigOpts, db: Database) -> None:
        self.conf = conf
        self.db = db
        self.worker = BindWorker(conf, db)
        self.wakes = WakeCalls(conf.conductor.bind_workers)
        self.worker.on_claimed = self.wakes.wake
        self._threads: list[threading.Thread] = []

    def routes(self) -> dict:
        return {"/binds/wake": {"POST": self.on_wake}}

    def on_wake(self, req: falcon.Request, resp: falcon.Response) -> None:
        """Let a worker look for due jobs now. With ``{"arq_ids": [...], "wait": s}`` (an API
        worker's PATCH), answer once this conductor resolved those ARQs, or after ``s``."""
        body = json_body(req) if req.content_length else {}
        error = fastcheck.first_error(WAKE_SCHEMA, body)
        if error is not None:
            raise falcon.HTTPBadRequest(description=f"Invalid wake: {error.message}")
        if not body.get("wait") or not body.get("arq_ids"):
            self.wakes.wake()
            respond(resp, {"status": "woken"}, status=202)
            return
        resolved = self.worker.resolved.wait(body["arq_ids"], body["wait"], self.wakes.wake)
        respond(resp, {"status": "woken", "resolved": resolved}, status=202)

    def periodic_tasks(self) -> list[PeriodicTask]:
        renew_every = max(1.0, self.conf.conductor.bind_lease_seconds / 3)
        return [PeriodicTask("bind-scan", self.conf.conductor.bind_poll_interval, self.scan),
                PeriodicTask("bind-lease-renew", renew_every, self.worker.renew_leases)]

    def scan(self) -> None:
        """Wake the workers when a job is due that no wake call announced, or when claims
        a database outage interrupted wait to be given back."""
        if self.worker.has_stranded() or bind_jobs.any_due(self.db):
            self.wakes.wake()

    def start(self) -> None:
        if not self.worker.notifier.configured:
            LOG.warning("[nova] is not configured: binds complete, but Nova gets no "
                        "%s events", nova.EVENT_NAME)
        for index in range(self.conf.conductor.bind_workers):
            thread = threading.Thread(target=self._loop, name=f"bind-worker-{index}",
                                      daemon=True)
            thread.start()
            self._threads.append(thread)
        self.wakes.wake()  # jobs left by a previous run

    def _loop(self) -> None:
        while not self.worker.stopping.is_set():
            if not self.wakes.wait() or self.worker.stopping.is_set():
                return
            try:
                # Passes while claims leave jobs due. Not one more pass after the last: it
                # was two empty claims (reads) per bind, while the jobs due later wake a
                # worker themselves (a wake kept while every worker is busy is not lost).
                while not self.worker.stopping.is_set():
                    claimed, left_due = self.worker.run_pass()
                    if not (claimed and left_due):
                        break
            except Exception as exc:  # noqa: BLE001 - the scan wakes the workers again
                if self.db.outage.is_outage(exc):
                    self.db.outage.down(exc, "binds resume as soon as it is back")
                else:
                    LOG.exception("Bind worker pass failed")

    def stop(self) -> None:
        self.worker.stopping.set()
        self.wakes.close()
        for thread in self._threads:
            thread.join(timeout=10)
