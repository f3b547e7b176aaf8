"""The conductor's pulls of a node's ``GET /hardware``: bounded, one per host, few at once.

A node's key lets whoever holds it make the conductor read an answer from the node's
endpoint, inside the node's hello, on one of the conductor's internal-server threads.
So that a compromised node harms only that node:

- the endpoint is at the address the hello came from (acceld.conductor.fleet.endpoints,
  checked before the hello is recorded);
- a pull takes at most ``[conductor] hardware_pull_timeout`` seconds in all and reads at
  most ``[conductor] max_hardware_report`` bytes, counted as they arrive, and follows no
  redirect (acceld.clients.internal's InternalClient.fetch, held to the total deadline
  by acceld.clients.deadline's watchdog);
- a host has one pull at a time: a hello of the host while its pull runs is answered
  without pulling (``"pulled": false``). The digest is stored only by a pull that
  succeeded, so a later hello pulls again if that one fails;
- at most ``[conductor] hardware_pulls`` pulls run at once, and never more than half of
  ``[internal] server_threads``: a hello that finds them all taken is answered without
  pulling, and the host's next hello tries again. A few bad nodes therefore cannot take
  the threads that other hosts' hellos need;
- the caller is told a fixed reason ("timed out", "answer over N bytes", "status 500"),
  never the peer's words or an exception's. Those go to the log: one WARNING per host when
  its pulls start failing (or fail in another way), one INFO when one succeeds again.
"""

from __future__ import annotations

import contextlib
import http.client
import logging
import threading
from typing import Any, Iterator

import orjson
import requests
from oslo_config import cfg

from acceld.clients.deadline import passed_in
from acceld.clients.internal import AnswerTooLarge, InternalClient, tls_verify
from acceld.internal import auth

LOG = logging.getLogger(__name__)

CONNECT_TIMEOUT = 5.0  # seconds: an agent that does not accept within it is unreachable
_EXCERPT = 200  # bytes of a refused answer quoted in the log (escaped)


class PullFailed(Exception):
    """The hardware could not be read; ``reason`` is fixed wording, safe for the caller."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


def concurrent_pulls(conf: cfg.ConfigOpts) -> int:
    """``[conductor] hardware_pulls``, at most half the internal server's threads."""
    return max(1, min(conf.conductor.hardware_pulls, conf.internal.server_threads // 2))


class Pulls:
    """Who may pull now (one per host, a bounded number in all) and the bounded read."""

    def __init__(self, conf: cfg.ConfigOpts) -> None:
        self.deadline = conf.conductor.hardware_pull_timeout
        self.max_bytes = conf.conductor.max_hardware_report
        self.verify = tls_verify(conf)
        self.limit = concurrent_pulls(conf)
        self._slots = threading.BoundedSemaphore(self.limit)
        self._running: set[str] = set()
        self._failing: dict[str, str] = {}  # host -> reason of its last failed pull
        self._guard = threading.Lock()

    @contextlib.contextmanager
    def turn(self, hostname: str) -> Iterator[bool]:
        """True inside when this thread may pull ``hostname`` now; False when the host's
        pull is running elsewhere or every pull slot is taken (nothing to wait for)."""
        with self._guard:
            if hostname in self._running:
                busy = f"a pull of {hostname} is running"
            elif not self._slots.acquire(blocking=False):
                busy = f"{self.limit} pulls are running"
            else:
                busy = ""
                self._running.add(hostname)
        if busy:
            LOG.debug("Hello of %s answered without a pull: %s", hostname, busy)
            yield False
            return
        try:
            yield True
        finally:
            with self._guard:
                self._running.discard(hostname)
            self._slots.release()

    def read(self, signer: auth.Signer, base_url: str, hostname: str) -> Any:
        """The host's report from its agent at ``base_url``, or PullFailed."""
        client = InternalClient(base_url, signer, verify=self.verify,
                                destination=auth.agent_destination(hostname),
                                timeout=(min(CONNECT_TIMEOUT, self.deadline), self.deadline),
                                deadline=self.deadline)
        try:
            answer, nonce = client.fetch("/hardware", max_bytes=self.max_bytes)
        except requests.RequestException as exc:
            raise self._failed(hostname, base_url, _reason(exc, self.max_bytes),
                               f"{exc.__class__.__name__}: {exc}") from None
        finally:
            client.close()  # a node's endpoint keeps no connection of the conductor's
        if answer.status_code != 200:
            reason = f"status {answer.status_code}"
            if answer.status_code == 401:
                reason += (" (the agent refused the conductor's credential: check its "
                           "[internal] node_key)")
            raise self._failed(hostname, base_url, reason,
                               f"answer {_excerpt(answer.content)}")
        try:
            signer.check_response(nonce, answer.status_code, answer.content,
                                  answer.headers.get(auth.RESPONSE_HEADER))
        except auth.ResponseError as exc:
            raise self._failed(hostname, base_url, "answer not signed by the agent",
                               str(exc)) from None
        try:
            report = orjson.loads(answer.content)
        except orjson.JSONDecodeError as exc:
            raise self._failed(hostname, base_url, "answer not JSON", str(exc)) from None
        with self._guard:
            was = self._failing.pop(hostname, None)
        if was is not None:
            LOG.info("Hardware of %s pulled from %s again (it failed: %s)", hostname,
                     base_url, was)
        return report

    def _failed(self, hostname: str, base_url: str, reason: str, detail: str) -> PullFailed:
        """Logged with its detail at the first failure of the host (or a new reason),
        at DEBUG while it keeps failing so."""
        with self._guard:
            repeated = self._failing.get(hostname) == reason
            self._failing[hostname] = reason
        (LOG.debug if repeated else LOG.warning)(
            "Cannot pull the hardware of %s from %s: %s (%s)", hostname, base_url, reason,
            detail)
        return PullFailed(reason)


def _reason(exc: requests.RequestException, max_bytes: int) -> str:
    """Fixed wording for a pull that brought no whole answer (nothing the peer said)."""
    if isinstance(exc, AnswerTooLarge):
        return f"answer over {max_bytes} bytes"
    if isinstance(exc, requests.Timeout) or passed_in(exc) is not None:
        return "timed out"
    if isinstance(exc, requests.exceptions.SSLError):
        return "TLS failed"
    for cause in _causes(exc):
        if isinstance(cause, ConnectionRefusedError):
            return "connection refused"
        if isinstance(cause, http.client.RemoteDisconnected):
            return "closed without an answer"
        if isinstance(cause, http.client.IncompleteRead):
            return "answer cut short"
        if isinstance(cause, http.client.HTTPException):
            return "not an HTTP answer"
    return "connection failed"


def _causes(exc: BaseException) -> Iterator[BaseException]:
    """``exc`` and what it wraps: requests and urllib3 keep the cause in their args."""
    seen: list[BaseException] = []
    todo = [exc]
    while todo and len(seen) < 20:
        cause = todo.pop()
        if any(cause is s for s in seen):
            continue
        seen.append(cause)
        yield cause
        todo += [a for a in cause.args if isinstance(a, BaseException)]
        todo += [c for c in (cause.__cause__, cause.__context__, getattr(cause, "reason", None))
                 if isinstance(c, BaseException)]


def _excerpt(body: bytes) -> str:
    """The start of a peer's answer for the log, escaped (no line breaks of its own)."""
    text = repr(body[:_EXCERPT])
    return text + (f" ... ({len(body)} bytes)" if len(body) > _EXCERPT else "")
