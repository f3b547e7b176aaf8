"""The conductor's client for the agents' attach-handle steps (acceld.agent.attach).

Finds the node's agent in the database (a read transaction that ends before
the call: no write transaction is ever held across the network), signs the
call, and turns every failure into :class:`AttachError` with a status the
caller acts on: 503 the agent is down, unknown or unreachable, or the driver
is not loaded there (nothing ran: retry later); 400 and 502 the driver refused
or failed; ``unknown`` when the call timed out and the host's state cannot be
known.
"""

from __future__ import annotations

from typing import Any

import orjson
import requests
from oslo_config import cfg
from sqlalchemy import select

from acceld.clients.internal import InternalClient, InternalError, scheme, tls_verify
from acceld.db.engine import Database
from acceld.db.models import agents
from acceld.services.secrets import internal_secret


class AttachError(Exception):
    """A prepare or release did not succeed; ``status`` says how (see the module)."""

    def __init__(self, status: int, message: str, unknown: bool = False) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.unknown = unknown


def request_body(driver_name: str | None, deployable_name: str, attach_type: str,
                 attach_info: str | dict[str, str]) -> dict[str, Any]:
    info = orjson.loads(attach_info) if isinstance(attach_info, str) else attach_info
    return {"driver_name": driver_name or "", "deployable_name": deployable_name,
            "attach_type": attach_type, "attach_info": info}


class AttachClient:
    """Prepare and release attach handles on their nodes; safe to share between threads."""

    def __init__(self, conf: cfg.ConfigOpts, db: Database, secret: bytes | None = None) -> None:
        self.conf = conf
        self.db = db
        self._secret = secret

    @property
    def secret(self) -> bytes:
        if self._secret is None:
            self._secret = internal_secret(self.conf)
        return self._secret

    def prepare(self, hostname: str, body: dict[str, Any]) -> dict[str, Any]:
        answer = self._call(hostname, "/attach-handles/prepare", body, "prepare")
        if not isinstance(answer, dict) or not isinstance(answer.get("attach_info"), dict):
            raise AttachError(502, f"The agent of host {hostname} answered a prepare without "
                                   "the attach handle.")
        return answer

    def release(self, hostname: str, body: dict[str, Any]) -> None:
        self._call(hostname, "/attach-handles/release", body, "release")

    def _endpoint(self, hostname: str) -> str:
        with self.db.read() as conn:
            agent = conn.execute(select(agents.c.endpoint, agents.c.state).where(
                agents.c.hostname == hostname)).first()
        if agent is None:
            raise AttachError(503, f"No agent has registered for host {hostname}.")
        if agent.state != "up":
            raise AttachError(503, f"The agent of host {hostname} is down.")
        endpoint = agent.endpoint
        return endpoint if "://" in endpoint else f"{scheme(self.conf)}://{endpoint}"

    def _call(self, hostname: str, path: str, body: dict[str, Any], step: str) -> Any:
        url = self._endpoint(hostname)
        timeout = float(self.conf.conductor.attach_timeout)
        client = InternalClient(url, self.secret, timeout=timeout, verify=tls_verify(self.conf))
        try:
            return client.call("POST", path, body, timeout=timeout)
        except InternalError as exc:
            if exc.status == 401:
                raise AttachError(502, f"The agent of host {hostname} refused the conductor's "
                                       "internal credential; check [internal] shared_secret."
                                  ) from None
            status = exc.status if exc.status in (400, 502, 503) else 502
            raise AttachError(status, _message(exc)) from None
        except requests.Timeout:
            raise AttachError(502, f"The agent of host {hostname} did not {step} the attach "
                                   f"handle within {timeout:.0f} s ([conductor] "
                                   "attach_timeout); its state on the host is unknown.",
                              unknown=True) from None
        except requests.RequestException as exc:
            raise AttachError(503, f"The agent of host {hostname} could not be reached: "
                                   f"{exc.__class__.__name__}.") from None
        finally:
            client.close()


def _message(exc: InternalError) -> str:
    try:
        return str(orjson.loads(exc.message)["error"])
    except (orjson.JSONDecodeError, KeyError, TypeError):
        return exc.message
