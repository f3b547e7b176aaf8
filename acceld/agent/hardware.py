"""What agents and driver processes share: the hardware list, its digest, the hello loop.

The digest is a SHA-256 over the node's records in a canonical order and key
order, so the same hardware always gives the same digest whatever order the
drivers listed it in. Health counters are left out of it: a counter that ticks
is no change (only a device's health state or reason is). Agents send it to the conductor and driver processes
send it to their agent in every ``POST /hello``; the receiver pulls ``GET
/hardware`` only when it changed.
"""

from __future__ import annotations

import hashlib
import logging
import threading
from typing import Any, Callable

import orjson
import requests

from acceld.clients.internal import InternalClient, InternalError, tls_verify
from acceld.internal import versions
from acceld.internal.auth import Signer

LOG = logging.getLogger(__name__)

# A hello to a peer: seconds to connect, and the most one hello may take in all.
HELLO_CONNECT_TIMEOUT = 5.0
HELLO_DEADLINE = 60.0


def _sort_key(record: Any) -> bytes:
    return orjson.dumps(record, option=orjson.OPT_SORT_KEYS)


def canonical(records: list[Any]) -> list[Any]:
    return sorted(records, key=_sort_key)


def without_counters(record: Any) -> Any:
    """The record as far as "changed" goes: its health's counters left out.

    Counters (AER error counts, ECC errors) may tick at every discovery; only a health
    state or reason that changes makes the node's report a new one (acceld.drivers.health).
    """
    if not isinstance(record, dict):
        return record
    health = record.get("health")
    if not isinstance(health, dict) or "counters" not in health:
        return record
    return {**record, "health": {k: v for k, v in health.items() if k != "counters"}}


def digest(records: list[Any]) -> str:
    """SHA-256 hex of the records, independent of their order, blind to health counters:
    the receiver pulls only when it changes."""
    return hashlib.sha256(orjson.dumps(canonical([without_counters(r) for r in records]),
                                       option=orjson.OPT_SORT_KEYS)).hexdigest()


class HelloLoop:
    """Says hello to an upstream peer every ``interval`` seconds, or at once when woken.

    ``body()`` builds each hello (it carries the current digest). Failures are
    logged once per change of outcome, not at every beat, and retried at the next.
    """

    def __init__(self, client: InternalClient, interval: float, body: Callable[[], dict],
                 peer: str) -> None:
        self.client = client
        self.interval = interval
        self.body = body
        self.peer = peer
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._last_error: str | None = None
        self._thread = threading.Thread(target=self._run, name=f"hello-{peer}", daemon=True)
        self.beats = 0
        # The internal API version: offered in each hello, left out for a peer of the
        # previous release that refuses it (acceld.internal.versions).
        self.speaker = versions.Speaker(peer)

    @classmethod
    def to_peer(cls, conf, signer: Signer | bytes, url: str,  # type: ignore[no-untyped-def]
                body: Callable[[], dict], peer: str, destination: str) -> "HelloLoop":
        """A loop (not started) to the internal server at ``url`` (named ``destination``,
        see acceld.internal.auth), every heartbeat interval. Each hello ends within
        HELLO_DEADLINE s however the peer answers (a driver process's agent, stalled)."""
        return cls(InternalClient(url, signer, timeout=(HELLO_CONNECT_TIMEOUT, HELLO_DEADLINE),
                                  verify=tls_verify(conf), destination=destination,
                                  deadline=HELLO_DEADLINE),
                   conf.agent.heartbeat_interval, body, peer)

    def start(self) -> None:
        self._thread.start()

    def wake(self) -> None:
        self._wake.set()

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()
        self._thread.join(timeout=5)

    def once(self) -> bool:
        """One hello now; True if the peer accepted it."""
        body = self.speaker.body(self.body())
        try:
            answer = self.client.call("POST", "/hello", body)
        except InternalError as exc:
            if self.speaker.refused(exc.status, exc.message, body):
                return self.once()  # now without the version field
            self._report(f"{self.peer} answered {exc.status}: {exc.message}")
            return exc.status < 500  # a 4xx hello was still heard (a refused record)
        except requests.RequestException as exc:
            self._report(f"{self.peer} unreachable: {exc.__class__.__name__}: {exc}")
            return False
        self.speaker.answered(body, answer)
        if self._last_error is not None:
            LOG.info("Hello to %s accepted again", self.peer)
        self._last_error = None
        self.beats += 1
        return True

    def _report(self, message: str) -> None:
        if message != self._last_error:
            LOG.warning("Hello to %s failed: %s", self.peer, message)
        self._last_error = message

    def _run(self) -> None:
        while not self._stop.is_set():
            self._wake.clear()
            try:
                self.once()
            except Exception as exc:  # noqa: BLE001 - a dead loop would leave the node "down"
                LOG.exception("Hello to %s failed unexpectedly; retried at the next beat",
                              self.peer)
                self._last_error = f"{exc.__class__.__name__}: {exc}"
            self._wake.wait(self.interval)
