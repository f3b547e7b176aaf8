"""This conductor's membership of the ring, and which hosts' periodic work it tries.

Each conductor beats its row of the ``conductors`` table every
``[conductor] member_heartbeat_interval`` seconds and, in the same pass, reads the
live members (acceld.db.conductors) and rebuilds its hash ring
(acceld.conductor.fleet.hashring) when they changed. Per-host periodic work (agent
liveness, the Placement sync and audit, the release queue) asks :meth:`owns` and
skips the hosts of other members.

Rebalancing bounds, with I = member_heartbeat_interval and D = member_dead_after:
a conductor that joins or stops cleanly (its row deleted) is seen by every peer
within I; one that dies is dropped within D + I of its last heartbeat. Each task
then takes the moved hosts at its next pass.

The ring decides who *tries*; the database's claims and leases decide who *may*
(bind job and release claims, a lease per host around Placement writes, the
compare-and-set of a liveness mark). While two conductors disagree about the
members (for at most I after a change) both may try a host, and one of them is
refused by the claim; no host is left untried, since each conductor always
counts itself in its ring.
"""

from __future__ import annotations

import logging
import socket
import threading
from typing import Protocol

from oslo_config import cfg
from sqlalchemy import select

from acceld.conductor.fleet.hashring import HashRing
from acceld.db import conductors as conductors_db
from acceld.db.engine import Database
from acceld.db.models import agents

LOG = logging.getLogger(__name__)


class Ownership(Protocol):
    def owns(self, hostname: str) -> bool: ...


class Everything:
    """The ownership of a conductor that shares its work with nobody (a component built
    outside a conductor, as tests do)."""

    def owns(self, hostname: str) -> bool:
        return True


EVERYTHING = Everything()


def member_name(conf: cfg.ConfigOpts) -> str:
    """``[conductor] name``, else ``<hostname>:<port>``: stable across restarts, so that a
    restarted conductor gets its hosts back, and unique per conductor process."""
    return conf.conductor.name or f"{socket.gethostname()}:{conf.conductor.port}"


def dead_after(conf: cfg.ConfigOpts) -> float:
    """The liveness bound, at least two heartbeats (one late beat must not drop a member)."""
    return max(conf.conductor.member_dead_after,
               2 * conf.conductor.member_heartbeat_interval)


class Membership:
    """This conductor's row and its view of the ring (thread-safe reads)."""

    def __init__(self, conf: cfg.ConfigOpts, db: Database, name: str,
                 url: str | None = None) -> None:
        self.conf = conf
        self.db = db
        self.name = name
        self.url = url
        self._ring = HashRing([name])
        self._guard = threading.Lock()
        self._left = False
        self._announced = False  # the first ring line names the members, not "joined"

    @property
    def ring(self) -> HashRing:
        return self._ring

    def owns(self, hostname: str) -> bool:
        return self._ring.owner(hostname) == self.name

    def join(self) -> None:
        """Register and read the ring once, before any periodic task runs."""
        self.beat()
        if not self._announced:  # alone: the ring did not change, say it once anyway
            self._change(self._ring)

    def beat(self) -> None:
        """Heartbeat, then rebuild the ring if the live members changed."""
        with self._guard:
            if self._left:
                return
            conductors_db.beat(self.db, self.name, self.url)
        live = set(conductors_db.live(self.db, dead_after(self.conf)))
        live.add(self.name)  # always: a host must never be left to nobody in our view
        if live != self._ring.members:
            self._change(HashRing(live))

    def _change(self, ring: HashRing) -> None:
        old = self._ring.members
        self._ring = ring
        joined, left = sorted(ring.members - old), sorted(old - ring.members)
        try:
            with self.db.read() as conn:
                hosts = list(conn.scalars(select(agents.c.hostname)))
            owned = sum(1 for host in hosts if ring.owner(host) == self.name)
            share = f"; this conductor now owns {owned} of {len(hosts)} hosts"
        except Exception:  # noqa: BLE001 - the count is for the log line only
            share = ""
        LOG.info("Conductor ring of %s: %d member(s) %s%s%s%s", self.name, len(ring),
                 ", ".join(sorted(ring.members)),
                 f"; joined: {', '.join(joined)}" if joined and self._announced else "",
                 f"; gone: {', '.join(left)}" if left else "", share)
        self._announced = True

    def leave(self) -> None:
        """Clean stop: delete the row, so that peers take this conductor's hosts within one
        of their heartbeats rather than after the liveness bound."""
        with self._guard:
            self._left = True
        try:
            if conductors_db.leave(self.db, self.name):
                LOG.info("Conductor %s left the ring", self.name)
        except Exception as exc:  # noqa: BLE001 - the row goes stale by itself
            LOG.warning("Could not remove conductor %s from the ring (its peers drop it "
                        "after %.0f s): %s", self.name, dead_after(self.conf), exc)
