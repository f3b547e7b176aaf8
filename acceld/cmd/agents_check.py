"""The agents part of ``acceld-status upgrade check``: every agent that is up speaks an
internal API this installation (the conductor's, on a controller) serves.

Upgrade controllers first. An agent of the previous release is served (its internal API
version is at least acceld.internal.versions.OLDEST): that is the rolling-upgrade window,
a warning naming the agents still to upgrade. An agent older than that, or one from
before ``GET /version``, may not understand what the conductor asks of it: a failure.
Each up agent is asked ``GET /version`` (signed with its node's key, derived from the
cloud's secret), a few at a time, briefly; an answer without ``api_version`` is 1.0's."""

from __future__ import annotations

import concurrent.futures
from typing import Any

import requests
from oslo_config import cfg
from oslo_upgradecheck.upgradecheck import Code, Result

from acceld.internal import versions
from acceld.version import VERSION, is_older

BEFORE_VERSION_ROUTE = "(before GET /version)"


def _standing(version: str) -> str:
    """'current', 'previous' (served: the window) or 'unserved', from _ask's version."""
    if version == BEFORE_VERSION_ROUTE:
        return "unserved"
    release, _, api = version.partition(" (internal API ")
    try:
        speaks = versions.parse(api.rstrip(")"))
    except versions.Unsupported:
        return "unserved"
    if speaks[0] != versions.CURRENT[0] or speaks < versions.OLDEST:
        return "unserved"
    if speaks < versions.CURRENT or is_older(release, VERSION):
        return "previous"
    return "current"

TIMEOUT = 5.0
AT_ONCE = 16


def _ask(conf: cfg.ConfigOpts, secret: bytes, row: Any,
         keys: dict | None = None) -> tuple[str, str | None, str]:
    """(hostname, version or None, why not); ``keys``: the re-keyed nodes' KeyStates. The
    version is ``<release> (internal API <M.m>)``, or ``(before GET /version)``."""
    from acceld.clients.agent import agent_client
    from acceld.clients.internal import InternalError, internal_url
    from acceld.internal.auth import KeyState

    state = (keys or {}).get(row.hostname, KeyState())
    if state.revoked:
        return row.hostname, None, "its key is revoked"
    client = agent_client(conf, secret, internal_url(conf, row.endpoint), row.hostname,
                          generation=state.generation, timeout=TIMEOUT)
    try:
        answer = client.call("GET", "/version")
        api = answer.get(versions.FIELD, versions.text(versions.UNVERSIONED))
        return row.hostname, f"{answer['version']} (internal API {api})", ""
    except InternalError as exc:
        # An agent from before GET /version answers 404: it is older than this one.
        if exc.status == 404:
            return row.hostname, BEFORE_VERSION_ROUTE, ""
        return row.hostname, None, f"answered {exc.status}"
    except (requests.RequestException, KeyError, TypeError, AttributeError) as exc:
        return row.hostname, None, type(exc).__name__
    finally:
        client.close()


def check_agents(conf: cfg.ConfigOpts) -> Result:
    from sqlalchemy.exc import DBAPIError

    from acceld.db import agents as agents_db
    from acceld.db import node_keys
    from acceld.db.engine import from_config
    from acceld.runtime.secrets import internal_secret

    from acceld.db import migrate

    db = from_config(conf)
    try:
        migrate.check_current(db)
        with db.read() as conn:
            rows = agents_db.list_agents(conn)
            keys = node_keys.read_all(conn)
    except migrate.SchemaNotCurrent:
        return Result(Code.WARNING, "Not checked: the database schema is not current.")
    except DBAPIError as exc:
        return Result(Code.FAILURE, f"The database cannot be reached: {exc.orig or exc}")
    finally:
        db.dispose()
    up = [r for r in rows if r.state == "up"]
    if not up:
        return Result(Code.SUCCESS, "No agent is up to ask." if rows else
                      "No agent has registered yet.")
    try:
        secret = internal_secret(conf)
    except Exception as exc:  # noqa: BLE001 - no secret here: cannot ask, say why
        return Result(Code.WARNING, f"Cannot ask the agents (run this on a controller "
                                    f"holding the cloud's internal secret): {exc}")
    with concurrent.futures.ThreadPoolExecutor(min(AT_ONCE, len(up))) as pool:
        answers = list(pool.map(lambda row: _ask(conf, secret, row, keys), up))
    standing = {host: _standing(version) for host, version, _ in answers
                if version is not None}
    unserved = [f"{host} ({version})" for host, version, _ in answers
                if version is not None and standing[host] == "unserved"]
    previous = [f"{host} ({version})" for host, version, _ in answers
                if version is not None and standing[host] == "previous"]
    silent = [f"{host} ({why})" for host, version, why in answers if version is None]
    down = [r.hostname for r in rows if r.state != "up"]
    if unserved:
        return Result(Code.FAILURE, (
            f"Agents older than the previous release, which this acceld {VERSION} "
            f"(internal API {versions.text(versions.OLDEST)} to "
            f"{versions.text(versions.CURRENT)}) does not serve: {', '.join(unserved)}. "
            "Upgrade them through every release (controllers first, then agents)."))
    notes = []
    if silent:
        notes.append(f"not answering: {', '.join(silent)}")
    if down:
        notes.append(f"down (not asked): {', '.join(down)}")
    if previous:
        notes.insert(0, (
            f"still at the previous release, served during the rolling upgrade: "
            f"{', '.join(previous)}; what remains: upgrade acceld-agent and the "
            "node's acceld-driver@ units there, then `acceld db upgrade --contract` if "
            "`acceld db version` lists contract migrations (docs/upgrades.md)"))
    if notes:
        return Result(Code.WARNING, f"{len(up) - len(silent) - len(previous)} agent(s) at "
                                    f"{VERSION} or newer; " + "; ".join(notes) + ".")
    return Result(Code.SUCCESS, f"All {len(up)} agent(s) run acceld {VERSION} or newer.")
