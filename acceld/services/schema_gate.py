"""The schema check a service passes before it serves: the API (``acceld api`` and the
WSGI application) and the conductor refuse a database behind this code's schema, which
they would misread, and one a newer release contracted; they run, with a WARNING, on one
a newer release only expanded (the rolling-upgrade window: docs/upgrades.md)."""

from __future__ import annotations

import logging
import os
import pickle
import traceback

from oslo_config import cfg

LOG = logging.getLogger(__name__)


def check_schema(conf: cfg.ConfigOpts) -> None:
    """SchemaNotCurrent unless the database is at this code's schema or ahead of it by
    expand migrations only (acceld.db.migrate.check_current). A database that
    cannot be reached now is no reason to refuse: the API answers 503 until it is back
    (acceld.db.outage), and checks nothing more then."""
    from sqlalchemy.exc import DBAPIError

    from acceld.db import migrate
    from acceld.db.engine import from_config

    db = from_config(conf)
    try:
        newer = migrate.check_current(db)
        if newer:
            LOG.warning("%s", migrate.ahead_warning(newer))
    except DBAPIError as exc:
        LOG.warning("The database cannot be reached (%s): the schema is not checked; the "
                    "API answers 503 until the database is back", exc.orig or exc)
    finally:
        db.dispose()


def check_schema_in_child(conf: cfg.ConfigOpts) -> None:
    """:func:`check_schema` in a forked child process, for a parent that forks its serving
    processes afterwards (``acceld api``'s gunicorn master): what the check imports
    (alembic and mako, ~10 MB) then stays out of the parent, and so out of every worker,
    whose RSS counts each page it still shares with the parent. Logs as the parent would;
    the check's exception (SchemaNotCurrent, a missing driver, ...) is raised here, the
    child's traceback as a note."""
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child; its outcome is checked in the parent
        status = 1
        try:
            os.close(read_end)
            with os.fdopen(write_end, "wb") as pipe:
                pipe.write(_outcome(conf))
            status = 0
        finally:
            os._exit(status)  # no atexit handlers, no flush of the parent's buffers
    os.close(write_end)
    with os.fdopen(read_end, "rb") as pipe:
        outcome = pipe.read()
    _, status = os.waitpid(pid, 0)
    if outcome:
        raise pickle.loads(outcome)
    if status != 0:
        raise RuntimeError(f"The schema check's process ended with wait status {status}")


def _outcome(conf: cfg.ConfigOpts) -> bytes:
    """b"" when the check passed, else its exception pickled (a RuntimeError naming it
    when it does not survive pickling)."""
    try:
        check_schema(conf)
        return b""
    except Exception as exc:  # noqa: BLE001 - every failure goes to the parent
        exc.add_note("In the schema check's process:\n"
                     + "".join(traceback.format_exception(exc)).rstrip())
        try:
            pickled = pickle.dumps(exc)
            pickle.loads(pickled)
        except Exception:  # noqa: BLE001 - an exception that does not round-trip
            return pickle.dumps(RuntimeError(f"{type(exc).__name__}: {exc}"))
        return pickled
