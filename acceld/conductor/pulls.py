"""The conductor's pulls of a node's ``GET /hardware``: bounded, one per host, few at once.

A node's key lets whoever holds it make the conductor read an answer from the node's
endpoint, inside the node's hello, on one of the conductor's internal-server threads.
So that a compromised node harms only that node:

- the endpoint is at the address the hello came from (acceld.conductor.endpoints,
  checked before the hello is recorded);
- a pull takes at most ``[conductor] hardware_pull_timeout`` seconds in all and reads at
  most ``[conductor] max_hardware_report`` bytes, counted as they arrive, and follows no
  redirect (acceld.clients.bounded);
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
import logging
import threading
from typing import Any, Iterator

import orjson
from oslo_config import cfg

from acceld import request_ids
from acceld.clients import bounded
from acceld.clients.internal import tls_verify
from acceld.internal import auth

LOG = logging.getLogger(__name__)

CONNECT_TIMEOUT = 5.0  # seconds: an agent that does not accept within it is unreachable
_EXCERPT = 200  # bytes of a refused answer quoted in the log (escaped)


class PullFailed(Exception):
    """The hardware could not be read; ``reason`` is fixed wording, safe for the caller."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


def pull_bounds(conf: cfg.ConfigOpts) -> bounded.Bounds:
    total = conf.conductor.hardware_pull_timeout
    return bounded.Bounds(connect=min(CONNECT_TIMEOUT, total), read=total, total=total,
                          max_bytes=conf.conductor.max_hardware_report)


def concurrent_pulls(conf: cfg.ConfigOpts) -> int:
    """``[conductor] hardware_pulls``, at most half the internal server's threads."""
    return max(1, min(conf.conductor.hardware_pulls, conf.internal.server_threads // 2))


class Pulls:
    """Who may pull now (one per host, a bounded number in all) and the bounded read."""

    def __init__(self, conf: cfg.ConfigOpts) -> None:
        self.bounds = pull_bounds(conf)
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
        path = "/hardware"
        headers, nonce = signer.headers("GET", path, b"",
                                        destination=auth.agent_destination(hostname))
        headers.update(request_ids.outgoing_headers())
        headers["Connection"] = "close"
        try:
            answer = bounded.get(base_url.rstrip("/") + path, headers, self.bounds,
                                 verify=self.verify)
        except bounded.ReadFailed as exc:
            raise self._failed(hostname, base_url, exc.reason,
                               f"{exc.detail}; {exc.received} bytes read") from None
        if answer.status != 200:
            reason = f"status {answer.status}"
            if answer.status == 401:
                reason += (" (the agent refused the conductor's credential: check its "
                           "[internal] node_key)")
            raise self._failed(hostname, base_url, reason,
                               f"answer {_excerpt(answer.body)}")
        try:
            signer.check_response(nonce, answer.status, answer.body,
                                  answer.headers.get(auth.RESPONSE_HEADER))
        except auth.ResponseError as exc:
            raise self._failed(hostname, base_url, "answer not signed by the agent",
                               str(exc)) from None
        try:
            report = orjson.loads(answer.body)
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


def _excerpt(body: bytes) -> str:
    """The start of a peer's answer for the log, escaped (no line breaks of its own)."""
    text = repr(body[:_EXCERPT])
    return text + (f" ... ({len(body)} bytes)" if len(body) > _EXCERPT else "")
