"""The conductor's signed calls to a node's agent, with one way of reporting failures.

The agent is found in the ``agents`` table by hostname (a read transaction that
ends before the call: no write transaction is ever held across the network).
Every failure becomes :class:`AgentCallError` with the status the conductor acts
on: 503 the agent is unknown, down or unreachable (nothing ran: retry later);
502 it refused the credential, failed, or did not answer in time
(``timed_out``: what it did on the host is unknown); the agent's own 4xx
otherwise. Callers translate it into their own error type and wording.
"""

from __future__ import annotations

from typing import Any

import orjson
import requests
from oslo_config import cfg
from sqlalchemy import Connection

from acceld.clients import deadline as deadlines
from acceld.clients.internal import InternalClient, InternalError, internal_url, tls_verify
from acceld.db import agents as agents_db
from acceld.db import node_keys
from acceld.db.engine import Database
from acceld.internal.auth import Signer, agent_destination, node_key
from acceld.runtime.secrets import internal_secret



# Seconds to wait for an agent's connection: a node that does not accept is unreachable.
CONNECT_TIMEOUT = 5.0


def agent_client(conf: cfg.ConfigOpts, secret: bytes, url: str, hostname: str, *,
                 generation: int, timeout: float = 10.0,
                 deadline: float | None = None) -> InternalClient:
    """A client of ``hostname``'s agent, signing with that host's own key at its current
    ``generation`` (acceld.db.node_keys): only that host's agent accepts its calls.
    ``timeout``: each read (connecting: at most CONNECT_TIMEOUT); ``deadline``: a whole
    call, however the agent answers (acceld.clients.deadline)."""
    return InternalClient(url, Signer(node_key(secret, hostname, generation), hostname,
                                      generation),
                          timeout=(min(CONNECT_TIMEOUT, timeout), timeout),
                          verify=tls_verify(conf), destination=agent_destination(hostname),
                          deadline=deadline)

class AgentCallError(Exception):
    """A call to an agent did not succeed; ``status`` and ``message`` say how."""

    def __init__(self, status: int, message: str, timed_out: bool = False) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.timed_out = timed_out


class AgentUnavailable(AgentCallError):
    """The host has no agent (``registered`` False) or its agent is marked down: 503."""

    def __init__(self, hostname: str, registered: bool) -> None:
        super().__init__(503, f"The agent of host {hostname} is down." if registered
                         else f"No agent has registered for host {hostname}.")
        self.registered = registered


def error_message(exc: InternalError) -> str:
    """The ``error`` of an internal server's JSON error body, else the raw text."""
    try:
        return str(orjson.loads(exc.message)["error"])
    except (orjson.JSONDecodeError, KeyError, TypeError):
        return exc.message


class AgentCaller:
    """Signed POSTs to the agents of nodes; safe to share between threads."""

    def __init__(self, conf: cfg.ConfigOpts, db: Database, secret: bytes | None = None) -> None:
        self.conf = conf
        self.db = db
        self._secret = secret

    @property
    def secret(self) -> bytes:
        if self._secret is None:
            self._secret = internal_secret(self.conf)
        return self._secret

    def locate(self, hostname: str, conn: Connection | None = None) -> str:
        """The URL of the host's agent if it is up; AgentUnavailable otherwise.

        ``conn`` reads inside the caller's transaction; without it a read of its own.
        """
        if conn is None:
            with self.db.read() as own:
                agent = agents_db.reachability(own, hostname)
        else:
            agent = agents_db.reachability(conn, hostname)
        if agent is None:
            raise AgentUnavailable(hostname, registered=False)
        if agent.state != "up":
            raise AgentUnavailable(hostname, registered=True)
        return internal_url(self.conf, agent.endpoint)

    def post(self, url: str, hostname: str, path: str, body: Any, *, timeout: float,
             timeout_message: str) -> Any:
        """POST ``body`` to the agent at ``url``; its answer, or AgentCallError.

        ``timeout_message`` is the message when the agent did not answer in time.
        """
        try:
            generation = node_keys.generations(
                self.db, self.conf.internal.credential_ttl).signing(hostname)
        except node_keys.KeyRevokedHost as exc:
            raise AgentCallError(503, str(exc)) from None
        client = agent_client(self.conf, self.secret, url, hostname, generation=generation,
                              timeout=timeout, deadline=timeout)
        try:
            return client.call("POST", path, body)
        except InternalError as exc:
            if exc.status == 401:
                raise AgentCallError(502, f"The agent of host {hostname} refused the "
                                          "conductor's internal credential; check that its "
                                          "[internal] node_key is the one `acceld internal "
                                          f"node-key {hostname}` prints from the conductor's "
                                          "[internal] shared_secret (at the node's current "
                                          "key generation).") from None
            status = exc.status
            if status >= 500 and status not in (502, 503):
                status = 502
            raise AgentCallError(status, error_message(exc)) from None
        except (requests.Timeout, deadlines.DeadlinePassed):
            # ``timeout`` bounds the whole call: connect, reads, a trickling answer.
            raise AgentCallError(502, timeout_message, timed_out=True) from None
        except requests.RequestException as exc:
            raise AgentCallError(503, f"The agent of host {hostname} could not be reached: "
                                      f"{exc.__class__.__name__}.") from None
        finally:
            client.close()
