"""Coalesced heartbeats: an unchanged hello costs the conductor no database write of its own.

A heartbeat that repeats what the database already holds for its host (the
agent is up, same endpoint, interval, hardware digest and discovery count) only
has to move ``last_seen_at``. Doing that in a transaction per hello was most
of a hello's cost (a locked SELECT and an UPDATE; ~1.8 ms of conductor CPU on
SQLite, ~3 ms on PostgreSQL). Instead:

- :meth:`Liveness.unchanged` answers from this conductor's memory of each
  host's row (``Known``) and notes the host as heard;
- every ``[conductor] heartbeat_flush_interval`` seconds :meth:`Liveness.flush`
  stamps every host heard since the last flush in one UPDATE (by the
  database's clock, as before) and reads the rows back in one SELECT, which
  refreshes the memory. Hosts the flush finds marked ``down`` (the liveness
  sweep got there first) are brought back up together, in two statements, with
  their waiting releases made due, and remembered: their next hello is answered
  from memory again. Only a hello received after the down mark brings a host back:
  each host's latest hello is kept with the time it arrived, and the flush turns
  that into the database's clock (the clock its own read returned, less the time
  since the hello, an estimate that errs early) and compares it with the mark's
  time in the UPDATE. A conductor that froze (SIGSTOP, a stalled process) holding
  hellos heard before the agent died does not revive the host its peers marked
  down meanwhile; its next hello, if it is alive, does. A host whose row is gone
  is forgotten.

A host not remembered (this conductor just started, or the host's agent failed
over from a conductor that stopped) is recalled by :meth:`Liveness.recall`: one
read of its row, and when the row repeats the hello it is answered like an
unchanged one. Any difference, or a memory older than ``trust_intervals`` of its
heartbeat interval, sends the hello down the full path
(acceld.conductor.fleet.agents), after which the next flush learns the row.
What this trades: ``last_seen_at`` lags a hello by up to one flush interval,
and a change made to a host's row by someone else (another conductor's pull)
is seen by this conductor's next flush of that host, so one heartbeat may be
answered from the older row; the one after is not. The memory outlives a few
missed heartbeats on purpose: a conductor falling behind (hellos spaced wider
than their interval) must not be pushed further behind by sending every hello
down the full path.

The lag is made visible to the sweep: each flush first records, in this
conductor's row of the ``conductors`` table, that every hello it read before
now is written (``heard_through``). A sweep judges an agent's silence only up
to the oldest such mark among the live conductors (acceld.db.conductors
``furthest_behind``), so a conductor whose flushes run late (a saturated process,
a slow database) does not get the agents it heard marked down; a mark older
than a dead conductor's bound is not waited for.
"""

from __future__ import annotations

import datetime as dt
import logging
import threading
import time
from dataclasses import dataclass
from typing import Any

from acceld.db import agents as agents_db
from acceld.db import conductors as conductors_db
from acceld.db.engine import Database
from acceld.db.retry import retry_on_deadlock

LOG = logging.getLogger(__name__)

# A host's remembered row is trusted for this many of its heartbeat intervals after the
# flush that read it (the conductor passes twice its agents' down window); a host silent
# longer goes through the full path again.
TRUST_INTERVALS = 6.0
_CHUNK = 500  # hosts per statement (bound parameters stay far below every backend's limit)


def _received(rows: list[Any], heard: dict[str, float]) -> dict[str, dt.datetime]:
    """When the latest hello of each host of ``rows`` arrived, by the database's clock:
    the clock the rows were read with, less the time since. Read after the rows, the
    monotonic "now" makes each time early by up to the read's latency, never late: a
    hello heard before a host's down mark is never taken for one after it."""
    now = time.monotonic()
    return {row.hostname: row.db_now - dt.timedelta(seconds=now - heard[row.hostname])
            for row in rows}


@dataclass(frozen=True)
class Known:
    """What the database held for a host at the last flush that read it."""

    endpoint: str
    interval: int
    digest: str | None
    discovery: int | None
    read_at: float  # time.monotonic()


class Liveness:
    """This conductor's memory of its agents' rows and the hosts heard since the last flush."""

    def __init__(self, db: Database, flush_interval: float,
                 trust_intervals: float = TRUST_INTERVALS) -> None:
        self.db = db
        self.flush_interval = flush_interval
        self.trust_intervals = trust_intervals
        # This conductor's name in the conductors table: each flush marks it current there.
        self.member: str | None = None
        self._known: dict[str, Known] = {}
        # Hosts heard since the last flush -> when their latest hello arrived (monotonic).
        self._heard: dict[str, float] = {}
        # Full hellos per host: a flush that read a row before a full hello changed it
        # must not remember that older row.
        self._learned: dict[str, int] = {}
        self._lock = threading.Lock()

    @property
    def enabled(self) -> bool:
        return self.flush_interval > 0

    def unchanged(self, hostname: str, endpoint: str, interval: int, digest: str | None,
                  discovery: int | None) -> bool:
        """True (and the host noted for the next flush) when the hello repeats the row."""
        if not self.enabled or digest is None:
            return False
        known = self._known.get(hostname)
        now = time.monotonic()
        if (known is None or known.endpoint != endpoint or known.interval != interval
                or known.digest != digest or known.discovery != discovery
                or now - known.read_at > known.interval * self.trust_intervals):
            return False
        with self._lock:
            self._heard[hostname] = now
        return True

    def recall(self, hostname: str, endpoint: str, interval: int, digest: str | None,
               discovery: int | None) -> bool:
        """For a hello :meth:`unchanged` could not answer because this conductor does not
        remember the host (it just started, or the host's agents failed over to it from a
        conductor that stopped): True, and the host remembered and noted as heard, when
        its row repeats the hello. One indexed read instead of the full path's locked
        read, write and commit: after a conductor dies, its peers take its agents' hellos
        at the cost of a read each."""
        if not self.enabled or digest is None:
            return False
        received = time.monotonic()
        with self._lock:
            if hostname in self._known:
                return False  # remembered and different: the full path
            learned = self._learned.get(hostname)
        with self.db.read() as conn:
            row = agents_db.get_agent(conn, hostname)
        if (row is None or row.state != "up" or row.endpoint != endpoint
                or row.heartbeat_interval != interval or row.hardware_digest != digest
                or row.last_discovery != discovery):
            return False
        with self._lock:
            if self._learned.get(hostname) != learned or hostname in self._known:
                return False  # a full hello or a flush meanwhile: theirs is newer
            self._known[hostname] = Known(endpoint, interval, digest, discovery,
                                          time.monotonic())
            self._heard[hostname] = received
        return True

    def learn(self, hostname: str, received: float | None = None) -> None:
        """After a full hello (that arrived at ``received``, monotonic; None: now): read
        the host's row at the next flush (and stamp it again, which is harmless: it was
        just heard)."""
        if self.enabled:
            at = time.monotonic() if received is None else received
            with self._lock:
                self._known.pop(hostname, None)
                self._learned[hostname] = self._learned.get(hostname, 0) + 1
                self._heard[hostname] = max(at, self._heard.get(hostname, at))

    def forget(self, hostname: str) -> None:
        with self._lock:
            self._known.pop(hostname, None)

    @retry_on_deadlock  # another conductor's flush or sweep locked some of the same rows
    def flush(self) -> int:
        """Stamp every host heard since the last flush; refresh their remembered rows.
        Returns how many hosts were stamped."""
        if self.member is None and not self._heard:
            return 0
        heard: dict[str, float] = {}
        try:
            with self.db.write() as conn:
                if self.member is not None:  # before taking the hosts: never ahead of them
                    conductors_db.record_heard(conn, self.member)
                with self._lock:
                    heard, self._heard = self._heard, {}
                    learned = {host: self._learned.get(host) for host in heard}
                hosts = sorted(heard)  # a fixed lock order against concurrent flushes
                rows = []
                back_up: set[str] = set()
                for start in range(0, len(hosts), _CHUNK):
                    chunk = hosts[start:start + _CHUNK]
                    agents_db.touch_up(conn, chunk)
                    read = agents_db.rows_of(conn, chunk)
                    # Marked down by a sweep before this flush: back up, all of them at
                    # once, those heard after their mark.
                    back_up.update(agents_db.bring_up(conn, _received(
                        [row for row in read if row.state != "up"], heard)))
                    rows += read
                back = [row for row in rows if row.hostname in back_up]
        except Exception:
            with self._lock:  # stamped at the next flush instead
                for host, at in heard.items():
                    self._heard[host] = max(at, self._heard.get(host, at))
            raise
        read_at = time.monotonic()
        found = {row.hostname for row in rows}
        with self._lock:
            for row in rows:
                if self._learned.get(row.hostname) != learned[row.hostname]:
                    continue  # a full hello since our read: the next flush reads it again
                # Up, brought up above, or left down (heard before its mark: a hello
                # answered from this memory comes after it, and the next flush brings
                # the host up): endpoint, interval, digest are as read.
                self._known[row.hostname] = Known(row.endpoint, row.heartbeat_interval,
                                                  row.hardware_digest, row.last_discovery,
                                                  read_at)
            for gone in heard.keys() - found:  # retired meanwhile: its next hello says what to do
                self._known.pop(gone, None)
        for row in back:
            LOG.info("Agent of host %s is back (last contact before this: %s UTC)",
                     row.hostname, row.last_seen_at)
        return len(hosts)
