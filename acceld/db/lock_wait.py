"""A bound on how long one statement waits for a lock another transaction holds, on the
server databases, and how to recognise a statement that ran out of it.

PostgreSQL waits for a lock as long as its holder keeps it (``lock_timeout`` 0), and
MariaDB for a table's metadata lock up to ``lock_wait_timeout`` (a year) and for a row
up to ``innodb_lock_wait_timeout`` (50 s). A migration run under live services (the
documented upgrade) or a long transaction elsewhere then holds the waiting request's
thread that long. The API's connections set a session bound at connect
(``[api] database_lock_timeout``): the statement fails, the request's transaction is
rolled back, and the client gets 503 with ``Retry-After`` (acceld.api.errors). The
worker itself never waits meanwhile: a statement that blocks loses the serving slot
(acceld.serving.serving_slot). SQLite's write lock has its own bound,
``[database] sqlite_busy_timeout``.
"""

from __future__ import annotations

import math
from typing import Any

from sqlalchemy.exc import DBAPIError

_PG_LOCK_NOT_AVAILABLE = "55P03"  # SQLSTATE lock_not_available (lock_timeout)
_MYSQL_LOCK_WAIT_TIMEOUT = 1205  # ER_LOCK_WAIT_TIMEOUT: a row's or a metadata lock's wait


def connect_args(backend: str, seconds: float) -> dict[str, Any]:
    """The driver's connect arguments that set the bound for each new session (none for
    SQLite, or with ``seconds`` 0: the server's own settings)."""
    if seconds <= 0:
        return {}
    if backend == "postgresql":
        return {"options": f"-c lock_timeout={max(1, round(seconds * 1000))}"}
    if backend == "mysql":
        whole = max(1, math.ceil(seconds))  # whole seconds only
        return {"init_command": f"SET SESSION innodb_lock_wait_timeout = {whole}, "
                                f"lock_wait_timeout = {whole}"}
    return {}


def is_lock_timeout(exc: BaseException) -> bool:
    """True when a statement gave up waiting for a lock another transaction held."""
    if not isinstance(exc, DBAPIError) or exc.orig is None:
        return False
    orig = exc.orig
    if getattr(orig, "sqlstate", None) == _PG_LOCK_NOT_AVAILABLE:  # psycopg 3
        return True
    args = getattr(orig, "args", ())
    return bool(args) and args[0] == _MYSQL_LOCK_WAIT_TIMEOUT  # pymysql
