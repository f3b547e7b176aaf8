"""Each node's key generation: rotating or revoking one node's key without the cloud's.

A node's key is derived from the cloud's secret, its hostname and a generation
(acceld.internal.auth.node_key). ``node_key_generations`` holds a row for each node
whose key was ever rotated or revoked: its current generation, the only one accepted,
and ``revoked`` when not even that one is. A node without a row is at generation 0,
the key of releases before generations, so nothing changes for a node until an
operator rotates or revokes its key (``acceld node-key``), and a row outlives
``acceld host delete``: a retired host's revoked key stays revoked if it comes back.

Conductors check the generation of every node's call and sign their calls to a node
with its current one. They read the whole table (rows of re-keyed nodes only: small)
into :class:`KeyGenerations`, again once it is ``max_age`` old (one credential
lifetime), so a rotation or revocation is effective on every conductor within that
bound, without a query per call.
"""

from __future__ import annotations

import logging
import threading
import time
import weakref
from typing import Callable

from sqlalchemy import Connection, insert, select, update
from sqlalchemy.exc import IntegrityError, SQLAlchemyError

from acceld.db.engine import Database
from acceld.db.models import agents, node_key_generations, utcnow
from acceld.internal.auth import KeyState, KeysUnavailable

LOG = logging.getLogger(__name__)

# While the table cannot be read, how long a conductor keeps its last reading before it
# tries again (each try can wait for the database's connect timeout, holding callers).
RETRY_SECONDS = 5.0


class HostUnknown(Exception):
    """No agent has registered for the host, and its key was never rotated or revoked."""


def read_all(conn: Connection) -> dict[str, KeyState]:
    """Every re-keyed node's state (the others are generation 0)."""
    t = node_key_generations.c
    return {host: KeyState(int(gen), bool(revoked)) for host, gen, revoked in conn.execute(
        select(t.hostname, t.generation, t.revoked)).all()}


def read(conn: Connection, hostname: str) -> KeyState:
    """One node's state, as committed now."""
    t = node_key_generations.c
    row = conn.execute(select(t.generation, t.revoked).where(t.hostname == hostname)).first()
    return KeyState() if row is None else KeyState(int(row[0]), bool(row[1]))


def rotate(db: Database, hostname: str) -> KeyState:
    """Make ``hostname``'s key the next generation (also after a revoke): every earlier
    one is refused. HostUnknown for a host acceld has never heard of."""
    return _change(db, hostname, lambda old: KeyState(old.generation + 1, False))


def revoke(db: Database, hostname: str) -> KeyState:
    """Refuse every key of ``hostname``, its current one too, until a :func:`rotate`."""
    return _change(db, hostname, lambda old: KeyState(old.generation, True))


def _change(db: Database, hostname: str, change: Callable[[KeyState], KeyState]) -> KeyState:
    t = node_key_generations.c
    for attempt in (1, 2):
        try:
            with db.write() as conn:
                row = conn.execute(select(t.generation, t.revoked)
                                   .where(t.hostname == hostname).with_for_update()).first()
                if row is None:
                    registered = conn.execute(select(agents.c.hostname).where(
                        agents.c.hostname == hostname)).first()
                    if registered is None:
                        raise HostUnknown(f"No host {hostname} is known: no agent has "
                                          "registered for it, and its key was never rotated "
                                          "or revoked.")
                    new = change(KeyState())
                    conn.execute(insert(node_key_generations).values(
                        hostname=hostname, generation=new.generation, revoked=new.revoked,
                        changed_at=utcnow()))
                else:
                    new = change(KeyState(int(row[0]), bool(row[1])))
                    conn.execute(update(node_key_generations)
                                 .where(t.hostname == hostname)
                                 .values(generation=new.generation, revoked=new.revoked,
                                         changed_at=utcnow()))
                return new
        except IntegrityError:  # two first changes of one host raced; the row exists now
            if attempt == 2:
                raise
    raise AssertionError("unreachable")


class KeyGenerations:
    """Each node's :class:`KeyState` as this process last read it, at most ``max_age``
    seconds ago (by ``clock``): an acceld.internal.auth.Generations for a conductor.

    The whole table is read again on the first call after ``max_age``; calls meanwhile
    cost a dict lookup. ``refresh`` reads it now (a credential of a newer generation than
    the one read: a node just re-keyed; only a key the cloud's secret derived gets here).

    While the database cannot be read the last reading is kept, the outage logged once,
    and the read tried again every :data:`RETRY_SECONDS`: a conductor that cannot reach
    the database cannot learn of a revocation written there, and refusing every node
    meanwhile would stop the heartbeats it can still answer. With no reading yet, a
    node's call is answered 503 (KeysUnavailable).
    """

    def __init__(self, db: Database, max_age: float,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.db = db
        self.max_age = max_age
        self.clock = clock
        self.reads = 0  # table reads (for tests)
        self._states: dict[str, KeyState] | None = None
        self._next_read = 0.0
        self._lock = threading.Lock()

    def state(self, hostname: str, refresh: bool = False) -> KeyState:
        states = self._states
        if refresh or states is None or self.clock() >= self._next_read:
            states = self._read(force=refresh)
        return states.get(hostname, KeyState())

    def _read(self, force: bool) -> dict[str, KeyState]:
        with self._lock:
            if not force and self._states is not None and self.clock() < self._next_read:
                return self._states  # another thread read it meanwhile
            started = self.clock()
            try:
                with self.db.read() as conn:
                    states = read_all(conn)
            except SQLAlchemyError as exc:
                if self.db.outage.is_outage(exc):
                    self.db.outage.down(exc, "node key revocations written meanwhile take "
                                             "effect once it is back")
                else:
                    LOG.warning("Cannot read the node key generations: %s",
                                exc.__class__.__name__)
                if self._states is None:
                    raise KeysUnavailable("the node key generations cannot be read") \
                        from exc
                self._next_read = started + min(RETRY_SECONDS, self.max_age)
                return self._states
            self.reads += 1
            self._states = states
            # From when the read began: a change committed after it is seen by the next.
            self._next_read = started + self.max_age
            return states

    def signing(self, hostname: str) -> int:
        """The generation to sign a call to ``hostname``'s agent with; KeyRevokedHost if
        the node's key is revoked (the conductor does not call it)."""
        state = self.state(hostname)
        if state.revoked:
            raise KeyRevokedHost(hostname)
        return state.generation


class KeyRevokedHost(Exception):
    """The node's key is revoked: no conductor calls its agent until it is re-keyed."""

    def __init__(self, hostname: str) -> None:
        super().__init__(f"The key of host {hostname} is revoked: the conductor does not "
                         f"call its agent until it is re-keyed (`acceld node-key rotate "
                         f"{hostname}`).")
        self.hostname = hostname


_BY_DATABASE: "weakref.WeakKeyDictionary[Database, KeyGenerations]" = \
    weakref.WeakKeyDictionary()
_REGISTRY_LOCK = threading.Lock()


def generations(db: Database, max_age: float) -> KeyGenerations:
    """This process's one reading of ``db``'s table (shared by the conductor's server and
    its calls to agents), refreshed at least every ``max_age`` seconds."""
    with _REGISTRY_LOCK:
        cache = _BY_DATABASE.get(db)
        if cache is None:
            cache = _BY_DATABASE[db] = KeyGenerations(db, max_age)
        cache.max_age = min(cache.max_age, max_age)
        return cache


def forget(db: Database) -> None:
    """Drop this process's reading of ``db``'s table: the next call reads it anew (tests
    that share one database object between them)."""
    with _REGISTRY_LOCK:
        _BY_DATABASE.pop(db, None)
