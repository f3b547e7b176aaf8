"""The agents part of ``acceld-status upgrade check``: every agent that is up runs an
acceld at least as new as this installation (the conductor's, on a controller).

Upgrade controllers first; an agent older than its conductor may not understand what
the conductor asks of it. Each up agent is asked ``GET /version`` (signed with its
node's key, derived from the cloud's secret), a few at a time, briefly."""

from __future__ import annotations

import concurrent.futures
from typing import Any

import requests
from oslo_config import cfg
from oslo_upgradecheck.upgradecheck import Code, Result

from acceld.version import VERSION, is_older

TIMEOUT = 5.0
AT_ONCE = 16


def _ask(conf: cfg.ConfigOpts, secret: bytes, row: Any,
         keys: dict | None = None) -> tuple[str, str | None, str]:
    """(hostname, version or None, why not); ``keys``: the re-keyed nodes' KeyStates."""
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
        return row.hostname, str(answer["version"]), ""
    except InternalError as exc:
        # An agent from before GET /version answers 404: it is older than this one.
        if exc.status == 404:
            return row.hostname, "(before GET /version)", ""
        return row.hostname, None, f"answered {exc.status}"
    except (requests.RequestException, KeyError, TypeError) as exc:
        return row.hostname, None, type(exc).__name__
    finally:
        client.close()


def check_agents(conf: cfg.ConfigOpts) -> Result:
    from sqlalchemy.exc import DBAPIError

    from acceld.db import agents as agents_db
    from acceld.db import node_keys
    from acceld.db.engine import from_config
    from acceld.services.secrets import internal_secret

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
    older = [f"{host} ({version})" for host, version, _ in answers
             if version is not None and is_older(version, VERSION)]
    silent = [f"{host} ({why})" for host, version, why in answers if version is None]
    down = [r.hostname for r in rows if r.state != "up"]
    if older:
        return Result(Code.FAILURE, f"Agents older than this acceld {VERSION}: "
                                    f"{', '.join(older)}. Upgrade them (controllers first, "
                                    "then agents) before relying on the new release.")
    notes = []
    if silent:
        notes.append(f"not answering: {', '.join(silent)}")
    if down:
        notes.append(f"down (not asked): {', '.join(down)}")
    if notes:
        return Result(Code.WARNING, f"{len(up) - len(silent)} agent(s) at {VERSION} or "
                                    f"newer; " + "; ".join(notes) + ".")
    return Result(Code.SUCCESS, f"All {len(up)} agent(s) run acceld {VERSION} or newer.")
