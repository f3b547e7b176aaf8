"""Telling "the database cannot be reached" from every other database error.

An unreachable database (refused or dropped connections, a server restarting,
SQLite's file that cannot be opened or stays locked) is an outage: the API
answers 503 with ``Retry-After``, periodic tasks and bind workers log it once
and carry on when it is back. Any other database error is a bug and keeps its
traceback. :func:`watch` hooks an engine's ``handle_error`` event, where
SQLAlchemy still knows whether the failure happened while connecting or was a
disconnect, and marks such exceptions; each successful commit ends an outage.
"""

from __future__ import annotations

import logging
from typing import Any

from sqlalchemy import Engine, event
from sqlalchemy.exc import DBAPIError

from acceld.outages import OutageLog

LOG = logging.getLogger(__name__)

NAME = "The database"
_MARK = "acceld_database_unavailable"
# Transient errors of a connection that is up: SQLite's busy timeout ran out.
_TRANSIENT = ("database is locked",)


class DatabaseOutage:
    """The outage log of one engine, and the test of whether an exception is an outage."""

    def __init__(self, log: OutageLog | None = None) -> None:
        self.log = log if log is not None else OutageLog(LOG)

    def is_outage(self, exc: BaseException) -> bool:
        return is_unavailable(exc)

    def down(self, exc: BaseException, consequence: str = "") -> None:
        self.log.down(NAME, _short(exc), consequence)

    def up(self) -> None:
        self.log.up(NAME)

    @property
    def is_down(self) -> bool:
        return self.log.is_down(NAME)


def is_unavailable(exc: BaseException) -> bool:
    """True when ``exc`` (or what it was raised from) says the database cannot be reached."""
    seen = 0
    current: BaseException | None = exc
    while current is not None and seen < 5:
        if getattr(current, _MARK, False):
            return True
        if isinstance(current, DBAPIError) and (
                current.connection_invalidated
                or any(text in str(current.orig) for text in _TRANSIENT)):
            return True
        # The driver's own error, unwrapped: SQLite's BEGIN IMMEDIATE is issued straight to
        # the driver (acceld.db.engine), so its "database is locked" arrives as it is.
        if (type(current).__name__ == "OperationalError" and not isinstance(current, DBAPIError)
                and any(text in str(current) for text in _TRANSIENT)):
            return True
        current = current.__cause__ or current.__context__
        seen += 1
    return False


def _short(exc: BaseException) -> str:
    """One line about the failure, without the SQL statement SQLAlchemy appends."""
    orig = getattr(exc, "orig", None) or exc
    text = str(orig).strip().splitlines()
    return f"{orig.__class__.__name__}: {text[0] if text else ''}"[:300]


def watch(engine: Engine) -> DatabaseOutage:
    """Mark outage exceptions raised through ``engine``; a commit that succeeds ends one."""
    outage = DatabaseOutage()

    @event.listens_for(engine, "handle_error")
    def _classify(ctx: Any) -> None:
        if ctx.connection is None or ctx.is_disconnect:  # connecting failed, or disconnected
            for exc in (ctx.sqlalchemy_exception, ctx.original_exception):
                if exc is not None:
                    try:
                        setattr(exc, _MARK, True)
                    except AttributeError:  # a C extension exception without a __dict__
                        pass

    @event.listens_for(engine, "commit")
    def _committed(conn: Any) -> None:
        if outage.is_down:
            outage.up()

    return outage
