"""The conductor's client for the agents' attach-handle steps (acceld.agent.attach).

Calls the node's agent through :class:`acceld.clients.agent.AgentCaller` and
turns every failure into :class:`AttachError` with a status the
caller acts on: 503 the agent is down, unknown or unreachable, or the driver
is not loaded there (nothing ran: retry later); 400 and 502 the driver refused
or failed; ``unknown`` when the call timed out and the host's state cannot be
known; 409 ``fenced`` when the agent refused the claim's fencing token (a newer claim acted
on the handle: nothing was done; acceld.conductor.fencing).
"""

from __future__ import annotations

import logging
from typing import Any

import orjson
from oslo_config import cfg

from acceld.clients.agent import AgentCallError, AgentCaller
from acceld.conductor.fencing import SkewMemory, is_fenced, post_fenced
from acceld.db.engine import Database

LOG = logging.getLogger(__name__)
FENCE_PATH = "/deployables/fence"
SKEW = SkewMemory()  # hosts whose agents lack FENCE_PATH (for logging once per spell)


class AttachError(Exception):
    """A prepare or release did not succeed; ``status`` says how (see the module)."""

    def __init__(self, status: int, message: str, unknown: bool = False,
                 fenced: bool = False) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.unknown = unknown
        self.fenced = fenced


def request_body(driver_name: str | None, deployable_name: str, attach_type: str,
                 attach_info: str | dict[str, str]) -> dict[str, Any]:
    info = orjson.loads(attach_info) if isinstance(attach_info, str) else attach_info
    return {"driver_name": driver_name or "", "deployable_name": deployable_name,
            "attach_type": attach_type, "attach_info": info}


FENCE_FIELDS = ("handle_uuid", "fence_token", "deployable_uuid", "deployable_fence")


def fence_fields(handle_uuid: str, token: int, deployable_uuid: str | None = None,
                 deployable_token: int | None = None) -> dict[str, Any]:
    """A claim's fencing fields for a prepare or release body (acceld.agent.attach)."""
    fields: dict[str, Any] = {"handle_uuid": handle_uuid, "fence_token": token}
    if deployable_uuid is not None and deployable_token is not None:
        fields.update(deployable_uuid=deployable_uuid, deployable_fence=deployable_token)
    return fields


class AttachClient:
    """Prepare and release attach handles on their nodes; safe to share between threads."""

    def __init__(self, conf: cfg.ConfigOpts, db: Database, secret: bytes | None = None) -> None:
        self.conf = conf
        self.db = db
        self.agents = AgentCaller(conf, db, secret)

    def prepare(self, hostname: str, body: dict[str, Any]) -> dict[str, Any]:
        answer = self._call(hostname, "/attach-handles/prepare", body, "prepare")
        if not isinstance(answer, dict) or not isinstance(answer.get("attach_info"), dict):
            raise AttachError(502, f"The agent of host {hostname} answered a prepare without "
                                   "the attach handle.")
        return answer

    def release(self, hostname: str, body: dict[str, Any]) -> None:
        self._call(hostname, "/attach-handles/release", body, "release")

    def fence(self, hostname: str, body: dict[str, Any]) -> bool:
        """A bind's fence of a deployable's programs (``POST /deployables/fence``): True when
        the agent fenced them by the device too (``by_device``), so that the row counts as
        told. An agent from before this route answers 404 or 405: False, the bind goes on
        unfenced there, as it did before (one WARNING per host); one from before device
        floors answers without ``by_device``: False, the row's next bind tells it again."""
        timeout = float(self.conf.conductor.attach_timeout)
        try:
            url = self.agents.locate(hostname)
            answer = self.agents.post(
                url, hostname, FENCE_PATH, body, timeout=timeout,
                timeout_message=f"The agent of host {hostname} did not fence the programs of "
                                f"{body.get('deployable_name')} within {timeout:.0f} s "
                                "([conductor] attach_timeout).")
        except AgentCallError as exc:
            if exc.status in (404, 405):
                if SKEW.remember(hostname):
                    LOG.warning("The agent of host %s has no %s (a previous release): binds "
                                "of its handles without a host step are not fenced against "
                                "a stale program until it is upgraded", hostname, FENCE_PATH)
                return False
            status = exc.status if exc.status in (400, 502, 503) else 502
            raise AttachError(status, exc.message, unknown=exc.timed_out) from None
        return isinstance(answer, dict) and answer.get("by_device") is True

    def _call(self, hostname: str, path: str, body: dict[str, Any], step: str) -> Any:
        """``body`` may carry the claim's fencing fields (:func:`fence_fields`); they are
        left out for an agent from before fencing (acceld.conductor.fencing)."""
        timeout = float(self.conf.conductor.attach_timeout)
        fence = {k: v for k, v in body.items() if k in FENCE_FIELDS}
        body = {k: v for k, v in body.items() if k not in FENCE_FIELDS}
        try:
            url = self.agents.locate(hostname)
            return post_fenced(lambda sent: self.agents.post(
                url, hostname, path, sent, timeout=timeout,
                timeout_message=f"The agent of host {hostname} did not {step} the attach "
                                f"handle within {timeout:.0f} s ([conductor] attach_timeout); "
                                "its state on the host is unknown."), hostname, body,
                fence)
        except AgentCallError as exc:
            if is_fenced(exc.status, exc.message):
                raise AttachError(409, exc.message, fenced=True) from None
            status = exc.status if exc.status in (400, 502, 503) else 502
            raise AttachError(status, exc.message, unknown=exc.timed_out) from None
