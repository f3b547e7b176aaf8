"""How many ARQs a project may hold: the check a create makes before it inserts.

The limit comes from ``[quota] driver``:

* ``local``: ``[quota] arqs_per_project`` (-1: unlimited).
* ``unified_limits``: Keystone's unified limits through oslo.limit (resource
  :data:`RESOURCE` of the service ``[oslo_limit]`` names): an ``oslo_limit.limit.Enforcer``
  whose usage callback counts the project's ARQs in SQL. A project limit wins over the
  registered default; no registered limit at all means 0, as oslo.limit decides.

The count and the insert run in one transaction that first writes the project's lock row
(acceld.db.project_lock), so two creates for one project cannot both pass on the same
count, also with writers on two nodes of a Galera cluster (the loser is rolled back at
commit and the create runs again from its start: acceld.db.retry). Over the limit is a 403 that names the limit, the project's usage and the request.
"""

from __future__ import annotations

import contextlib
import contextvars
import logging
import threading
from typing import Any, Collection, Iterator

from sqlalchemy import Connection

from acceld.api import errors
from acceld.db import accelerator_requests as db
from acceld.db import project_lock

LOG = logging.getLogger(__name__)
RESOURCE = "accelerator_requests"

# The create's transaction, for the Enforcer's usage callback (which gets only the project).
_CONN: contextvars.ContextVar[Connection] = contextvars.ContextVar("acceld_arq_limit_conn")
_enforcer: Any = None
_enforcer_lock = threading.Lock()


def _settings(conf) -> tuple[bool, int]:  # type: ignore[no-untyped-def]
    """(unified limits?, the local limit); read once per call: option lookups are not free."""
    quota = conf.quota
    return quota.driver == "unified_limits", quota.arqs_per_project


@contextlib.contextmanager
def write(api, project_id: str | None) -> Iterator[Connection]:  # type: ignore[no-untyped-def]
    """The create's write transaction; under the project's lock when a limit applies."""
    unified, local_limit = _settings(api.conf)
    if not unified and local_limit < 0:
        with api.db.write() as conn:
            yield conn
        return
    with project_lock.write(api.db, project_id or "") as conn:
        yield conn


def check(api, conn: Connection, project_id: str | None, delta: int) -> None:  # type: ignore[no-untyped-def]
    """403 unless ``project_id`` may hold ``delta`` more ARQs; call inside :func:`write`."""
    _check(api.conf, conn, project_id, delta)


def _check(conf, conn: Connection, project_id: str | None, delta: int) -> None:  # type: ignore[no-untyped-def]
    if delta <= 0:
        return
    unified, local_limit = _settings(conf)
    if unified:
        _check_unified(conn, project_id, delta)
        return
    if local_limit < 0:
        return
    usage = db.count_for_project(conn, project_id)
    if usage + delta > local_limit:
        raise _over(project_id, local_limit, usage, delta, "[quota] arqs_per_project")


def _over(project_id: str | None, limit: int, usage: int, delta: int,
          source: str) -> errors.Forbidden:
    return errors.Forbidden(
        f"Quota exceeded for {RESOURCE}: project {project_id} may hold {limit} ({source}), "
        f"holds {usage} and asked for {delta} more.")


# ---------------------------------------------------------------------------- unified limits

def _usage(project_id: str | None, resource_names: Collection[str]) -> dict[str, int]:
    """oslo.limit's usage callback: the project's ARQs, counted in the create's transaction."""
    return {name: db.count_for_project(_CONN.get(), project_id) for name in resource_names}


def _get_enforcer():  # type: ignore[no-untyped-def]
    """One Enforcer per process: it finds the enforcement model and the service's endpoint
    once; limits are read from Keystone on every check (cache=False), so a changed limit
    applies at once."""
    global _enforcer
    with _enforcer_lock:
        if _enforcer is None:
            from oslo_limit import limit

            _enforcer = limit.Enforcer(_usage, cache=False)
        return _enforcer


def _check_unified(conn: Connection, project_id: str | None, delta: int) -> None:
    from keystoneauth1 import exceptions as ksa_exceptions
    from openstack import exceptions as sdk_exceptions
    from oslo_limit import exception as limit_exceptions

    token = _CONN.set(conn)
    try:
        _get_enforcer().enforce(project_id, {RESOURCE: delta})
    except limit_exceptions.ProjectOverLimit as exc:
        info = next(i for i in exc.over_limit_info_list if i.resource_name == RESOURCE)
        raise _over(project_id, info.limit, info.current_usage, info.delta,
                    f"Keystone unified limit on {RESOURCE}") from None
    except (limit_exceptions.SessionInitError, ksa_exceptions.ClientException,
            sdk_exceptions.SDKException, ValueError) as exc:
        LOG.error("Could not check the %s limit of project %s with Keystone: %s", RESOURCE,
                  project_id, exc)
        raise errors.ServiceUnavailable(
            f"The {RESOURCE} limit of project {project_id} could not be read from Keystone; "
            "retry later.") from None
    finally:
        _CONN.reset(token)


def refusal(conf, conn: Connection, project_id: str, delta: int) -> str | None:  # type: ignore[no-untyped-def]
    """Why ``project_id`` could not create ``delta`` more ARQs now (the create's own check,
    in its words), or None when it could: for explain, which asks without creating."""
    try:
        _check(conf, conn, project_id, delta)
    except (errors.Forbidden, errors.ServiceUnavailable) as exc:
        return exc.message
    return None
