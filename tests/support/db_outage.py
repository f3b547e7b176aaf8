"""Make a test's database unreachable and reachable again, at the engine level.

While the outage lasts every new connection fails the way a stopped server's
does (the driver's own ``OperationalError``, raised where SQLAlchemy connects),
and the idle pooled connections are dropped, so the next unit of work has to
connect. Deterministic: no server is stopped, no timing is involved.
"""

from __future__ import annotations

import contextlib
from typing import Any, Iterator

from sqlalchemy import event

from acceld.db.engine import Database


class Outage:
    def __init__(self, db: Database) -> None:
        self.db = db
        self.active = False
        self.refused = 0  # connection attempts refused so far
        event.listen(db.engine, "do_connect", self._connect)

    def _connect(self, dialect: Any, conn_rec: Any, cargs: Any, cparams: Any) -> None:
        if self.active:
            self.refused += 1
            error = dialect.loaded_dbapi.OperationalError
            if self.db.backend == "mysql":
                raise error(2003, "Can't connect to MySQL server on '127.0.0.1' (111)")
            raise error("connection refused: the database is down (test outage)")
        return None  # connect as usual

    def start(self) -> None:
        self.active = True
        self.db.engine.dispose()  # idle connections die with the server

    def stop(self) -> None:
        self.active = False

    def close(self) -> None:
        self.stop()
        event.remove(self.db.engine, "do_connect", self._connect)


@contextlib.contextmanager
def outage(db: Database) -> Iterator[Outage]:
    """An outage controller for ``db``; the database is reachable again on exit."""
    control = Outage(db)
    try:
        yield control
    finally:
        control.close()
