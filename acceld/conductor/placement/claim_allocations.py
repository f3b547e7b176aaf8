"""Placement allocations of standalone claims (API 2.8): written by acceld, not by Nova.

:func:`write` makes a consumer's allocation in Placement what the database says it is
(acceld.db.claims.desired): the bind worker calls it before the bind transaction of a
claimed ARQ (so that Placement refuses a provider already full, as it refuses Nova's
scheduler), and :class:`ClaimAllocationWorker` calls it for every consumer marked ``due``
(a bind refused, an ARQ released), until it succeeds: the removal of a released claim's
allocation is a queued row, retried by any conductor, never a best-effort call.

Each write reads the consumer's generation before reading the database and writes with
it: two writers of one consumer (two binds of one workload, a bind and a release) cannot
lose each other's change, the later one re-reads and writes again. A consumer that is not
acceld's (acceld.claim_owner: a Nova instance's, another project's) is never written: the
bind is refused, and a release has nothing to write there.
"""

from __future__ import annotations

import logging
import os
import socket
import uuid

from oslo_config import cfg

from acceld import claim_owner
from acceld.clients import placement as pl
from acceld.conductor.binding.target import BindRefused
from acceld.conductor.service import PeriodicTask
from acceld.db import claims
from acceld.db.engine import Database
from acceld.outages import PLACEMENT, process_log

LOG = logging.getLogger(__name__)

CONSUMER_TYPE = claim_owner.CONSUMER_TYPE
BATCH = 16
LEASE_SECONDS = 120.0
FALLBACK_ID = "acceld"


def write(client: pl.PlacementClient, db: Database, consumer_uuid: str, *,
          fence: bool = False) -> bool:
    """Make the consumer's Placement allocation the database's; True if it was written
    (False: it already was, or it is not acceld's and acceld wants nothing of it).
    BindRefused when Placement refuses it or the consumer is not acceld's;
    PlacementUnavailable: try again later.

    ``fence`` (the drain's writes): write even when Placement already holds it, so that the
    consumer's generation moves and every writer that read it before is refused. A consumer
    Placement does not have (no allocation) has no generation to move: a writer that read
    "no consumer" and the database before a release can still create it, so every writer
    reads both again after its write and writes once more when the database changed
    meanwhile; one that dies between its write and that reading leaves a consumer with no
    row, which :meth:`ClaimAllocationWorker.audit` finds.
    """
    written = False
    for _ in range(pl.CONFLICT_RETRIES):
        held = client.consumer(consumer_uuid)
        with db.read() as conn:
            want = claims.desired(conn, consumer_uuid)
            who = claims.owner(conn, consumer_uuid)
            ours = claims.acceld_providers(conn, held.allocations)
        foreign = sorted(set(held.allocations) - ours)
        refusal = claim_owner.refusal(consumer_uuid, held, foreign,
                                      who.project_id if who else None)
        if refusal is not None:
            if not want:  # nothing of acceld's to write, and not acceld's to empty
                return written
            raise BindRefused(refusal)
        if held.allocations == want and (written or not fence or held.generation is None):
            return written
        project = (who.project_id if who is not None else None) or FALLBACK_ID
        user = (who.user_id if who is not None else None) or FALLBACK_ID
        try:
            client.put_allocations(consumer_uuid, want, project, user, held.generation,
                                   CONSUMER_TYPE)
        except pl.ConsumerConflict:
            LOG.debug("Consumer %s changed in Placement while written; again", consumer_uuid)
            continue
        except pl.PlacementUnavailable:
            raise
        except pl.PlacementError as exc:
            raise BindRefused(f"Placement refused the allocation of consumer {consumer_uuid} "
                              f"({_describe(want)}): {exc}") from exc
        LOG.info("Placement allocation of consumer %s written: %s", consumer_uuid,
                 _describe(want))
        written = True  # read again: the database may have changed since it was read
    raise pl.PlacementUnavailable(f"Placement consumer {consumer_uuid} kept changing; gave up "
                                  f"after {pl.CONFLICT_RETRIES} attempts")


def _describe(allocation: dict[str, dict[str, int]]) -> str:
    if not allocation:
        return "nothing"
    return "; ".join(f"{rp}: " + ", ".join(f"{rc}={n}" for rc, n in sorted(res.items()))
                     for rp, res in sorted(allocation.items()))


class ClaimAllocationWorker:
    """Writes the due consumers. ``run_once`` is synchronous (tests drive it)."""

    def __init__(self, conf: cfg.ConfigOpts, db: Database,
                 client: pl.PlacementClient | None = None, batch: int = BATCH) -> None:
        self.conf = conf
        self.db = db
        self.client = client if client is not None else pl.from_conf(conf)
        self.batch = batch
        self.owner = f"{socket.gethostname()[:30]}-{os.getpid()}"
        self.outages = process_log()

    def run_once(self) -> int:
        """One claim of due consumers, each written (or put back); how many were taken."""
        token = f"{self.owner}-{uuid.uuid4().hex[:16]}"[:64]
        rows = claims.claim_due(self.db, token, self.batch, LEASE_SECONDS)
        for row in rows:
            consumer = row.consumer_uuid
            try:
                if self.client is not None:
                    write(self.client, self.db, consumer, fence=True)
                    self.outages.up(PLACEMENT, LOG)
            except pl.PlacementUnavailable as exc:
                # An outage: logged once when it starts and once when it ends (binds and
                # the sync share the record), not per consumer and try.
                self.outages.down(PLACEMENT, str(exc), "claims' allocations wait for it",
                                  LOG)
                claims.retry_later(self.db, consumer, token, claims.backoff(row.attempts),
                                   str(exc))
                continue
            except BindRefused as exc:
                delay = claims.backoff(row.attempts)
                LOG.warning("Placement allocation of consumer %s not written (try %d): %s; "
                            "retried in %.0f s", consumer, row.attempts, exc.reason, delay)
                claims.retry_later(self.db, consumer, token, delay, exc.reason)
                continue
            if not claims.finish(self.db, consumer, token):
                LOG.info("Consumer %s changed while its allocation was written; written "
                         "again", consumer)
        return len(rows)

    def drain(self) -> None:
        while self.run_once() >= self.batch:
            pass

    def audit(self) -> list[str]:
        """Find the consumers whose Placement allocation is not what the database says and
        mark them due (the drain then writes them); the consumers marked.

        Every consumer not due is compared (one ``GET /allocations/{consumer}`` each): this
        finds an ARQ deleted by an API replica of the previous release, whose delete does
        not mark the consumer (a rolling upgrade), and an allocation edited by hand. Then
        acceld's providers are read (one ``GET .../allocations`` each) for standalone
        claims' consumers that have no row at all: an allocation created by a writer that
        read before a release and died after its write landed (:func:`write`)."""
        if self.client is None:
            return []
        marked: list[str] = []
        try:
            self._compare_rows(marked)
            self._adopt_strays(marked)
        except pl.PlacementUnavailable as exc:
            # Not the process's outage record: the binds, the sync and the drain keep it
            # (one WARNING when an outage starts and one when it ends); a pass that fails
            # as Placement comes back must not start another.
            LOG.info("Claims' allocation audit stopped, Placement unavailable (%s); the "
                     "next starts in [placement] audit_interval", exc)
        return marked

    def _compare_rows(self, marked: list[str]) -> None:
        assert self.client is not None
        after = None
        while True:
            page = claims.settled(self.db, after, self.batch)
            for consumer in page:
                held = self.client.consumer(consumer).allocations
                if claims.mark_due_if_not(self.db, consumer, held):
                    LOG.info("Placement allocation of consumer %s is not what the database "
                             "says (%s); written again", consumer, _describe(held))
                    marked.append(consumer)
            if len(page) < self.batch:
                return
            after = page[-1]

    def _adopt_strays(self, marked: list[str]) -> None:
        assert self.client is not None
        providers, known = claims.audit_scope(self.db)
        for rp_uuid in providers:
            for consumer in self.client.provider_allocations(rp_uuid):
                if consumer in known:
                    continue
                known.add(consumer)
                held = self.client.consumer(consumer)
                if held.consumer_type != CONSUMER_TYPE:
                    continue  # Nova's (an instance being scheduled), or anyone else's
                if claims.adopt(self.db, consumer, held.project_id, held.user_id):
                    LOG.warning("Placement holds a standalone claim's allocation the "
                                "database has no consumer for (%s: %s); it is written as "
                                "the database says (removed)", consumer,
                                _describe(held.allocations))
                    marked.append(consumer)

    def audit_task(self) -> None:
        self.audit()


class ClaimAllocationComponent:
    """Conductor component: the periodic drain of the consumers marked due (every
    conductor), and the audit (one conductor at a time, every ``[placement]
    audit_interval``)."""

    def __init__(self, conf: cfg.ConfigOpts, db: Database) -> None:
        self.conf = conf
        self.db = db
        self.worker = ClaimAllocationWorker(conf, db)

    def routes(self) -> dict:
        return {}

    def periodic_tasks(self) -> list[PeriodicTask]:
        return [PeriodicTask("claim-allocations", self.conf.conductor.bind_poll_interval,
                             self.worker.drain),
                PeriodicTask("claim-allocation-audit", self.conf.placement.audit_interval,
                             self.worker.audit_task, exclusive=True)]

    def start(self) -> None:
        pass

    def stop(self) -> None:
        pass
