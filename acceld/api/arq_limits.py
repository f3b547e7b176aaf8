"""How many ARQs a project may hold: the check a create makes before it inserts.

The limit comes from ``[quota] driver``:

* ``local``: ``[quota] arqs_per_project`` (-1: unlimited).
* ``unified_limits``: Keystone's unified limits through oslo.limit (resource
  :data:`RESOURCE` of the service ``[oslo_limit]`` names): a project limit wins over the
  registered default; no registered limit at all means 0, and -1 unlimited, as oslo.limit
  decides (``Enforcer.get_project_limits``).

The limit is read first, before any transaction: Keystone's with the worker's serving
slot given up meanwhile (acceld.serving.serving_slot), so neither a write transaction (on
SQLite, the database's one write lock) nor the worker waits on Keystone. Then the count and
the insert run in one transaction that first writes the project's lock row
(acceld.db.project_lock), so two creates for one project cannot both pass on the same
count, also with writers on two nodes of a Galera cluster (the loser is rolled back at
commit and the create runs again from its start: acceld.db.retry). A limit changed in
Keystone between the read and the commit applies from the next create on. Over the limit
is a 403 that names the limit, the project's usage and the request.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from dataclasses import dataclass
from typing import Any, Callable, Collection, Iterator

from sqlalchemy import Connection

from acceld.serving import serving_slot
from acceld.api import errors
from acceld.db import accelerator_requests as db
from acceld.db import project_lock

LOG = logging.getLogger(__name__)
RESOURCE = "accelerator_requests"

_enforcer: Any = None
_enforcer_lock = threading.Lock()


@dataclass(frozen=True)
class Limit:
    """A project's ARQ limit (negative: unlimited) and where it comes from, for messages."""

    value: int
    source: str


def project_limit(conf, project_id: str | None) -> Limit:  # type: ignore[no-untyped-def]
    """The project's limit, read now; call before any transaction (503 when Keystone
    cannot say)."""
    quota = conf.quota
    if quota.driver != "unified_limits":
        return Limit(quota.arqs_per_project, "[quota] arqs_per_project")
    return Limit(_keystone_limit(project_id), f"Keystone unified limit on {RESOURCE}")


@dataclass
class Quota:
    """The create's write transaction (``conn``) and the limit read before it began."""

    conn: Connection
    limit: Limit
    project_id: str | None

    def check(self, delta: int) -> None:
        """403 unless the project may hold ``delta`` more ARQs (counted in ``conn``)."""
        reason = _refusal(self.limit, self.conn, self.project_id, delta)
        if reason is not None:
            raise errors.Forbidden(reason)


@contextlib.contextmanager
def write(api, project_id: str | None) -> Iterator[Quota]:  # type: ignore[no-untyped-def]
    """The project's limit, then the create's write transaction: under the project's
    lock when a limit applies."""
    limit = project_limit(api.conf, project_id)
    if limit.value < 0:
        with api.db.write() as conn:
            yield Quota(conn, limit, project_id)
        return
    with project_lock.write(api.db, project_id or "") as conn:
        yield Quota(conn, limit, project_id)


def refuser(conf, project_id: str) -> Callable[[Connection, int], str | None]:  # type: ignore[no-untyped-def]
    """For explain, which asks without creating: a function telling why ``project_id``
    could not create so many more ARQs now (the create's own check, in its words), or
    None when it could. The limit is read here, before explain's transaction."""
    try:
        limit = project_limit(conf, project_id)
    except errors.ServiceUnavailable as exc:
        message = exc.message
        return lambda _conn, _delta: message
    return lambda conn, delta: _refusal(limit, conn, project_id, delta)


def _refusal(limit: Limit, conn: Connection, project_id: str | None,
             delta: int) -> str | None:
    if delta <= 0 or limit.value < 0:
        return None
    usage = db.count_for_project(conn, project_id)
    if usage + delta <= limit.value:
        return None
    return (f"Quota exceeded for {RESOURCE}: project {project_id} may hold {limit.value} "
            f"({limit.source}), holds {usage} and asked for {delta} more.")


# ---------------------------------------------------------------------------- unified limits

def _no_usage(project_id: str | None, resource_names: Collection[str]) -> dict[str, int]:
    """oslo.limit's usage callback, never called: acceld asks only for limits and counts
    the usage itself, inside its create's transaction."""
    raise AssertionError("acceld reads limits only; it counts usage in the create")


def _get_enforcer():  # type: ignore[no-untyped-def]
    """One Enforcer per process: it finds the enforcement model and the service's endpoint
    once; limits are read from Keystone on every check (cache=False), so a changed limit
    applies at once."""
    global _enforcer
    with _enforcer_lock:
        if _enforcer is None:
            from oslo_limit import limit

            _enforcer = limit.Enforcer(_no_usage, cache=False)
        return _enforcer


def _keystone_limit(project_id: str | None) -> int:
    """The project's limit from Keystone, outside the serving slot (a wait on Keystone)."""
    from keystoneauth1 import exceptions as ksa_exceptions
    from openstack import exceptions as sdk_exceptions
    from oslo_limit import exception as limit_exceptions

    try:
        with serving_slot.stepped_out():
            limits = dict(_get_enforcer().get_project_limits(project_id, [RESOURCE]))
    except (limit_exceptions.SessionInitError, ksa_exceptions.ClientException,
            sdk_exceptions.SDKException, ValueError) as exc:
        LOG.error("Could not read the %s limit of project %s from Keystone: %s", RESOURCE,
                  project_id, exc)
        raise errors.ServiceUnavailable(
            f"The {RESOURCE} limit of project {project_id} could not be read from Keystone; "
            "retry later.") from None
    return int(limits[RESOURCE])
