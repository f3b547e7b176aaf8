"""``/healthcheck`` on every acceld server, with oslo.middleware's Healthcheck.

Load balancers and orchestrators (kolla, Kubernetes probes) poll it without
credentials, so it sits in front of authentication and says no more than
oslo.middleware says: 200 ``OK`` or 503 with each check's short reason; details
(exception texts) only with ``[healthcheck] detailed = true``. Operators add
oslo's backends in ``[healthcheck] backends`` (``disable_by_file`` to take a
node out of a pool before maintenance); a service with a database always runs
acceld's own ``acceld_database`` backend (an entry point of
``oslo.middleware.healthcheck``) first.
"""

from __future__ import annotations

from typing import Any, Callable, Iterable

from oslo_config import cfg
from oslo_middleware.healthcheck import Healthcheck
from oslo_middleware.healthcheck.pluginbase import HealthcheckBaseExtension, HealthcheckResult
from sqlalchemy import text

PATH = "/healthcheck"
DATABASE_BACKEND = "acceld_database"

WSGIApp = Callable[[dict, Callable], Iterable[bytes]]

# Where the backend finds the service's database in the middleware's conf dict (its
# second constructor argument): it reuses the service's pool.
DATABASE_KEY = "acceld.database"


class DatabaseHealthcheck(HealthcheckBaseExtension):
    """Available while a trivial query on acceld's database succeeds."""

    def __init__(self, oslo_conf: cfg.ConfigOpts, conf: dict[str, Any]) -> None:
        super().__init__(oslo_conf, conf)
        database = conf.get(DATABASE_KEY)
        if database is None:  # enabled by an operator where acceld gave it no database
            from acceld.db.engine import from_config

            database = from_config(oslo_conf)
        self.database = database

    def healthcheck(self, server_port: int) -> HealthcheckResult:
        try:
            with self.database.connect() as conn:
                conn.execute(text("SELECT 1"))
        except Exception as exc:  # noqa: BLE001 - any failure is "unavailable"
            return HealthcheckResult(available=False, reason="database unavailable",
                                     details=f"{type(exc).__name__}: {exc}")
        return HealthcheckResult(available=True, reason="database OK")


class _ServiceHealthcheck(Healthcheck):
    """oslo's Healthcheck with the service's own backends ahead of the configured ones."""

    def __init__(self, conf: cfg.ConfigOpts, builtin: tuple[str, ...],
                 database: Any = None) -> None:
        self._builtin = builtin
        self._database = database
        super().__init__(None, conf)

    # The conf dict oslo hands every backend: acceld's database rides in it.
    @property
    def conf(self) -> dict[str, Any]:
        return self._plugin_conf

    @conf.setter
    def conf(self, value: dict[str, Any]) -> None:
        self._plugin_conf = {**value, DATABASE_KEY: self._database}

    def _conf_get(self, key: str, group: str = "healthcheck") -> Any:
        value = super()._conf_get(key, group)
        if key == "backends" and group == "healthcheck":
            value = list(self._builtin) + [b for b in value if b not in self._builtin]
        return value


def mount(app: WSGIApp, conf: cfg.ConfigOpts, database: Any = None) -> WSGIApp:
    """``app`` with ``/healthcheck`` answered in front of it (no authentication); with
    ``database``, the check includes it."""
    builtin: tuple[str, ...] = ()
    if database is not None:
        builtin = (DATABASE_BACKEND,)
    check = _ServiceHealthcheck(conf, builtin, database)

    def dispatch(environ: dict, start_response: Callable) -> Iterable[bytes]:
        if environ.get("PATH_INFO", "").rstrip("/") == PATH:
            return check(environ, start_response)
        return app(environ, start_response)

    dispatch.healthcheck = check  # type: ignore[attr-defined]
    return dispatch
