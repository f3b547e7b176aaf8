"""One DEBUG line per database call (what a ``debug = true`` API writes): the statement's
first words and how long the call took, so a slow request can be traced to its query.

The statement is logged without its parameters (they hold tenants' values) and cut to
one short line. The API installs it when ``debug`` is on (acceld.api.app.wsgi_app: `acceld
api`'s workers are started again by a SIGHUP, and build their app with the new value);
nothing is measured or written while the logger is not enabled for DEBUG."""

from __future__ import annotations

import logging
import time
from typing import Any

from sqlalchemy import Engine, event

LOG = logging.getLogger("acceld.db.calls")
_STARTED = "acceld_call_started"
MAX_STATEMENT = 120


def _short(statement: str) -> str:
    text = " ".join(statement.split())
    return text if len(text) <= MAX_STATEMENT else text[:MAX_STATEMENT] + "..."


def install(engine: Engine) -> None:
    """Log each call on ``engine`` at DEBUG, with its time in milliseconds."""

    @event.listens_for(engine, "before_cursor_execute")
    def _before(conn: Any, cursor: Any, statement: str, parameters: Any, context: Any,
                executemany: bool) -> None:
        if context is not None and LOG.isEnabledFor(logging.DEBUG):
            context.__dict__[_STARTED] = time.perf_counter()

    @event.listens_for(engine, "after_cursor_execute")
    def _after(conn: Any, cursor: Any, statement: str, parameters: Any, context: Any,
               executemany: bool) -> None:
        started = context.__dict__.pop(_STARTED, None) if context is not None else None
        if started is not None:
            LOG.debug("database call took %.1f ms: %s",
                      (time.perf_counter() - started) * 1000, _short(statement))
