"""The schema check a service passes before it serves: the API (``acceld api`` and the
WSGI application) refuses a database behind this code's schema, as the conductor does,
since it would misread the tables."""

from __future__ import annotations

import logging

from oslo_config import cfg

LOG = logging.getLogger(__name__)


def check_schema(conf: cfg.ConfigOpts) -> None:
    """SchemaNotCurrent unless the database is at this code's schema. A database that
    cannot be reached now is no reason to refuse: the API answers 503 until it is back
    (acceld.db.outage), and checks nothing more then."""
    from sqlalchemy.exc import DBAPIError

    from acceld.db import migrate
    from acceld.db.engine import from_config

    db = from_config(conf)
    try:
        migrate.check_current(db)
    except DBAPIError as exc:
        LOG.warning("The database cannot be reached (%s): the schema is not checked; the "
                    "API answers 503 until the database is back", exc.orig or exc)
    finally:
        db.dispose()
