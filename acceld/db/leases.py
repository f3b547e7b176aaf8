"""Named leases in the database, so one conductor among several runs each exclusive task.

Expiry is judged by the database's clock (acceld.db.clock), read in the same
transaction as the take or renewal: conductors' own clocks never decide who holds
a lease, so a skewed one neither steals a live lease nor holds one past its time.
"""

from __future__ import annotations

import contextlib
import logging
from typing import Iterator

from sqlalchemy import delete, insert, or_, update
from sqlalchemy.exc import IntegrityError

from acceld.db.clock import sql_now
from acceld.db.engine import Database
from acceld.db.retry import retry_on_deadlock
from acceld.db.models import leases

LOG = logging.getLogger(__name__)


@retry_on_deadlock
def acquire(db: Database, name: str, owner: str, seconds: float) -> bool:
    """Take or renew lease ``name`` for ``owner``; False if another owner holds it."""
    with db.write() as conn:
        taken = conn.execute(update(leases).where(
            leases.c.name == name,
            or_(leases.c.owner == owner, leases.c.expires_at < sql_now(db.backend)),
        ).values(owner=owner, expires_at=sql_now(db.backend, seconds))).rowcount
        if taken:
            return True
    try:
        with db.write() as conn:
            conn.execute(insert(leases).values(
                name=name, owner=owner, expires_at=sql_now(db.backend, seconds)))
        return True
    except IntegrityError:
        return False


@retry_on_deadlock
def release(db: Database, name: str, owner: str) -> bool:
    """Give lease ``name`` back if ``owner`` still holds it; False if it had lapsed or moved."""
    with db.write() as conn:
        return bool(conn.execute(delete(leases).where(
            leases.c.name == name, leases.c.owner == owner)).rowcount)


@contextlib.contextmanager
def held(db: Database, name: str, owner: str, seconds: float) -> Iterator[bool]:
    """Hold lease ``name`` around a unit of work: yields False (and holds nothing) when
    another owner holds it; gives it back afterwards (if that fails it lapses by itself)."""
    mine = acquire(db, name, owner, seconds)
    try:
        yield mine
    finally:
        if mine:
            try:
                release(db, name, owner)
            except Exception as exc:  # noqa: BLE001 - it lapses after ``seconds``
                LOG.warning("Could not give back lease %s (it lapses in %.0f s): %s", name,
                            seconds, exc)
