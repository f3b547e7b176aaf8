"""Run a write transaction again when the database chose it as a deadlock victim.

PostgreSQL (SQLSTATE 40P01 deadlock_detected, 40001 serialization_failure) and
MariaDB/MySQL (error 1213) roll a victim transaction back whole, and ask the client
to run it again. On a MariaDB Galera cluster the same error 1213 ("WSREP detected
deadlock/conflict and aborted the transaction. Try restarting the transaction") is
how a certification failure reaches a writer: another node committed a conflicting
write first. Either way nothing of the transaction was kept, so running it again
is safe, and the right thing, for a function whose every write is in that one
transaction (or in transactions each safe to repeat).

:func:`retry_on_deadlock` wraps such functions: a bounded number of attempts with a
jittered exponential backoff (capped), one INFO line per retry and a WARNING when the
attempts run out (then the error propagates as before), never a traceback: with writers
on several Galera nodes a lost certification is a normal outcome, not a fault.
"""

from __future__ import annotations

import functools
import logging
import random
import time
from typing import Callable, TypeVar

from sqlalchemy.exc import DBAPIError

LOG = logging.getLogger(__name__)

ATTEMPTS = 8  # with writers on two Galera nodes, 20 racing creates lose up to a few times
_FIRST_DELAY = 0.01  # seconds; doubled per retry, jittered
_MAX_DELAY = 0.5
_MYSQL_DEADLOCK = 1213  # ER_LOCK_DEADLOCK, also Galera's certification failure
_PG_CODES = ("40P01", "40001")

F = TypeVar("F", bound=Callable)


def is_deadlock(exc: BaseException) -> bool:
    """True when the database rolled the transaction back to break a deadlock or a
    write conflict (Galera certification), and asks for it to be run again."""
    if not isinstance(exc, DBAPIError) or exc.orig is None:
        return False
    orig = exc.orig
    if getattr(orig, "sqlstate", None) in _PG_CODES:  # psycopg 3
        return True
    args = getattr(orig, "args", ())
    return bool(args) and args[0] == _MYSQL_DEADLOCK  # pymysql, mysqlclient


def retry_on_deadlock(fn: F) -> F:
    """Run ``fn`` again (up to ATTEMPTS in all) while it fails with :func:`is_deadlock`.

    Only for functions whose writes are safe to repeat after a rollback: each attempt
    must open its own transaction(s), as ``db.write()`` blocks inside ``fn`` do.
    """

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):  # type: ignore[no-untyped-def]
        delay = _FIRST_DELAY
        for attempt in range(1, ATTEMPTS + 1):
            try:
                return fn(*args, **kwargs)
            except DBAPIError as exc:
                if not is_deadlock(exc):
                    raise
                if attempt == ATTEMPTS:
                    LOG.warning("%s: still a deadlock or write conflict after %d attempts: "
                                "%s", fn.__qualname__, ATTEMPTS, exc.orig)
                    raise
                LOG.info("%s: deadlock or write conflict (attempt %d), running it again: "
                          "%s", fn.__qualname__, attempt, exc.orig)
            time.sleep(delay * (0.5 + random.random()))
            delay = min(delay * 2, _MAX_DELAY)
        raise AssertionError("unreachable")

    return wrapper  # type: ignore[return-value]
