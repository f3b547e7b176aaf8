"""The schema check a service passes before it serves: the API (``acceld api`` and the
WSGI application) and the conductor refuse a database behind this code's schema, which
they would misread, and one a newer release contracted; they run, with a WARNING, on one
a newer release only expanded (the rolling-upgrade window: docs/upgrades.md)."""

from __future__ import annotations

import logging

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
