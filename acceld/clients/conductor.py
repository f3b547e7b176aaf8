"""Calls to the conductors: the agents' hellos and reports, the API workers' wakes and
synchronous calls, over ``[conductor] url`` (one URL, a load balancer's, or a list).

Every conductor serves any agent and any call (they share the database), so a
client may use any of them. :class:`FailoverClient` keeps one signed, keep-alive
client per URL and:

- spreads clients over the list: each starts at a position picked by a stable hash
  of its key (an agent's hostname, an API worker's pid), so agents configured with
  the same list do not all land on the first conductor;
- fails over to the next URL when one does not answer (no connection within
  ``[conductor] connect_timeout``; for calls that may be repeated, also a connection
  lost, an answer not given within the call's timeout, or a 503: a conductor that
  lost its database), and sticks with the one that answered;
- probes its preferred URL again ``[conductor] failback_interval`` after failing over,
  so load spreads back once a conductor returns: a repeatable call is sent there once
  more from a thread of its own while the call itself goes where calls go now, and
  calls move back only once the probe was answered (a hung preferred conductor never
  delays an agent's heartbeats to the one that answers);
- logs each conductor's outage once when it starts and once when it ends, not per
  call: in the process's outage log (acceld.outages.process_log), so an agent's
  several clients (hellos, host-step reports) log it once between them.

A call that must not run twice (a synchronous program) is only retried elsewhere
when it surely never reached the first conductor (no connection was made).
"""

from __future__ import annotations

import hashlib
import logging
import os
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import requests
from oslo_config import cfg
from urllib3.exceptions import ConnectTimeoutError, NewConnectionError

from acceld.clients.internal import InternalClient, InternalError, scheme, tls_verify
from acceld.internal import auth
from acceld.internal.auth import CONDUCTOR
from acceld.outages import OutageLog, process_log
from acceld.runtime.secrets import SECRET_FILE, internal_secret
from acceld.serving import serving_slot

LOG = logging.getLogger(__name__)

# Most ARQ ids one POST /binds/wake may name to wait for (the conductor refuses more).
MOST_ARQS_WAITED_FOR = 10000


def conductor_urls(conf: cfg.ConfigOpts) -> list[str]:
    """``[conductor] url`` as a list, else the local conductor's own address."""
    urls = [u.strip() for u in (conf.conductor.url or []) if u and u.strip()]
    return urls or [f"{scheme(conf)}://{conf.conductor.host_ip}:{conf.conductor.port}"]


def conductor_url(conf: cfg.ConfigOpts) -> str:
    """The first of :func:`conductor_urls`, for a caller that talks to one conductor."""
    return conductor_urls(conf)[0]


def never_sent(exc: requests.RequestException) -> bool:
    """True when the call surely did not reach the server: no connection was made."""
    if isinstance(exc, requests.ConnectTimeout):
        return True
    if isinstance(exc, requests.ConnectionError):
        reason = getattr(exc.args[0], "reason", None) if exc.args else None
        return isinstance(reason, (NewConnectionError, ConnectTimeoutError))
    return False


def _start_index(key: str, count: int) -> int:
    if count <= 1 or not key:
        return 0
    return int.from_bytes(hashlib.sha256(key.encode()).digest()[:4], "big") % count


class FailoverClient:
    """Signed calls to the first answering conductor of a list (see the module's doc)."""

    def __init__(self, urls: Sequence[str], secret: bytes | auth.Signer, *,
                 timeout: float = 30.0, verify: str | bool = True,
                 connect_timeout: float = 3.0, failback_interval: float = 60.0,
                 prefer: str = "", destination: str = CONDUCTOR,
                 clock: Callable[[], float] = time.monotonic,
                 outages: OutageLog | None = None) -> None:
        if not urls:
            raise ValueError("no conductor URL")
        start = _start_index(prefer, len(urls))
        ordered = list(urls[start:]) + list(urls[:start])
        # Each URL's client learns the name of the conductor process answering there, and
        # signs for it (its nonces then stay in that process's memory: acceld.clients.internal).
        self._clients = [InternalClient(url, secret, timeout=timeout, verify=verify,
                                        destination=destination,
                                        learn_destination=destination == CONDUCTOR)
                         for url in ordered]
        self._timeout = timeout
        self._connect_timeout = connect_timeout
        self._failback_interval = failback_interval
        self._clock = clock
        self._current = 0  # index in self._clients of the one that answered last
        self._failed_over_at: float | None = None
        self._switches = 0  # how often calls moved to another URL
        self._probe: threading.Thread | None = None  # the failback probe running now
        self._guard = threading.Lock()
        self.outages = outages if outages is not None else process_log()

    @property
    def urls(self) -> list[str]:
        """The URLs in the order this client prefers them."""
        return [c.base_url for c in self._clients]

    @property
    def base_url(self) -> str:
        """The URL calls go to now."""
        return self._clients[self._current].base_url

    @base_url.setter
    def base_url(self, url: str) -> None:  # tests point a client elsewhere
        self._clients[self._current].base_url = url.rstrip("/")

    def _order(self) -> list[int]:
        """The URLs from the current one on."""
        with self._guard:
            current = self._current
        return [(current + i) % len(self._clients) for i in range(len(self._clients))]

    def _failback_due(self) -> bool:
        """True once per ``failback_interval`` after failing over, when no probe runs."""
        with self._guard:
            due = (self._failed_over_at is not None and self._probe is None and
                   self._clock() - self._failed_over_at >= self._failback_interval)
            if due:
                self._failed_over_at = self._clock()  # one probe per interval
            return due

    def call(self, method: str, path: str, body: Any = None, *, timeout: float | None = None,
             signer: auth.Signer | None = None, repeatable: bool = True) -> Any:
        """Like :meth:`InternalClient.call`, on the first conductor that answers.

        ``repeatable``: the call may run twice harmlessly (hello, wake, reports), so it
        moves on after any failure to get an answer and after a 503 (that conductor
        cannot serve it: its database is away), and may be sent to the preferred
        conductor as a failback probe; else it moves on only after no connection.
        Raises the last error when no conductor answered.
        """
        if repeatable and self._failback_due():
            self._start_probe(method, path, body, timeout, signer)
        with self._guard:
            switches = self._switches
        last: Exception | None = None
        for index in self._order():
            try:
                answer = self._call_one(index, method, path, body, timeout, signer, repeatable)
            except requests.RequestException as exc:
                if not (repeatable or never_sent(exc)):
                    raise
                last = exc
                continue
            except InternalError as exc:
                if repeatable and exc.status == 503:
                    last = exc
                    continue
                self._answered(index, switches)  # it answered (with an error): it is up
                raise
            self._answered(index, switches)
            return answer
        assert last is not None
        raise last

    def _call_one(self, index: int, method: str, path: str, body: Any, timeout: float | None,
                  signer: auth.Signer | None, repeatable: bool) -> Any:
        """The call at one URL; a failure to get an answer (or a 503, for a repeatable
        call) is noted as that conductor's outage and raised."""
        client = self._clients[index]
        what = f"Conductor {client.base_url}"
        consequence = ("calls go to the next conductor" if len(self._clients) > 1
                       else "calls are retried")
        try:
            answer = client.call(method, path, body, signer=signer,
                                 timeout=(self._connect_timeout,  # type: ignore[arg-type]
                                          timeout or self._timeout))
        except requests.RequestException as exc:
            self.outages.down(what, f"{exc.__class__.__name__}: {exc}", consequence, logger=LOG)
            raise
        except InternalError as exc:
            if exc.status == 503 and repeatable:
                self.outages.down(what, f"answered 503: {exc.message[:200]}", consequence,
                                  logger=LOG)
                raise
            self.outages.up(what, LOG)  # it answered (with an error of the call): it is up
            raise
        self.outages.up(what, LOG)
        return answer

    def _start_probe(self, method: str, path: str, body: Any, timeout: float | None,
                     signer: auth.Signer | None) -> None:
        """Send the call to the preferred conductor from a thread of its own; calls go
        there once it answered (see :meth:`_answered`)."""
        def probe() -> None:
            with self._guard:
                switches = self._switches
            try:
                self._call_one(0, method, path, body, timeout, signer, True)
            except (requests.RequestException, InternalError) as exc:
                if isinstance(exc, requests.RequestException) or exc.status == 503:
                    return  # still away: the next probe is due a failback_interval later
            except Exception:  # noqa: BLE001 - a bug must not end the client's failback
                LOG.exception("Probing conductor %s failed", self._clients[0].base_url)
                return
            finally:
                with self._guard:
                    self._probe = None
            self._answered(0, switches)

        thread = threading.Thread(target=probe, daemon=True,
                                  name=f"probe-{self._clients[0].base_url}")
        with self._guard:
            self._probe = thread
        thread.start()

    def join_probe(self, timeout: float | None = None) -> None:
        """Wait for the failback probe running now, if any (tests, stopping)."""
        with self._guard:
            thread = self._probe
        if thread is not None:
            thread.join(timeout)

    def _answered(self, index: int, switches: int) -> None:
        """Calls go to ``index`` from now on, unless calls moved elsewhere since the call
        that got this answer began (a probe's answer moved them back meanwhile)."""
        with self._guard:
            if self._switches != switches:
                return
            if index != self._current:
                LOG.info("Calls to the conductors now go to %s", self._clients[index].base_url)
                self._current = index
                self._switches += 1
            if index == 0:
                self._failed_over_at = None
            elif self._failed_over_at is None:
                self._failed_over_at = self._clock()

    def close(self) -> None:
        for client in self._clients:
            client.close()


def failover_client(conf: cfg.ConfigOpts, secret: bytes | auth.Signer, *, prefer: str,
                    timeout: float, connect_timeout: float | None = None) -> FailoverClient:
    """A client of the configured conductors (agents: ``prefer`` = their hostname)."""
    return FailoverClient(conductor_urls(conf), secret, timeout=timeout,
                          verify=tls_verify(conf),
                          connect_timeout=(conf.conductor.connect_timeout
                                           if connect_timeout is None else connect_timeout),
                          failback_interval=conf.conductor.failback_interval, prefer=prefer)


# What a hello that makes the conductor pull the agent's hardware may take beyond one that
# does not, besides the pull itself ([conductor] hardware_pull_timeout; acceld.conductor.
# pulls): the reconcile of what it read.
RECONCILE_ALLOWANCE = 10.0


@dataclass(frozen=True)
class HelloTimeouts:
    """How long an agent waits for a conductor to take its hello (seconds)."""

    connect: float  # for a connection
    answer: float  # for the answer to a hello announcing hardware a conductor already took
    pull: float  # for the answer to one announcing hardware not yet taken (it may pull)


def hello_timeouts(conf: cfg.ConfigOpts) -> HelloTimeouts:
    """Timeouts that let a hello a conductor does not take reach the next one within the
    agent's down window (``agent_down_intervals`` heartbeats), so that a hung conductor
    (connections accepted, never answered) does not get its agents marked down.

    The next hello after one that was recorded leaves one interval later; a conductor
    gets half of what the window has left after that interval, and the next conductor the
    other half. A conductor records a hello before it pulls the agent's hardware, so a hello
    that may carry a pull can wait for the pull as well without the agent falling silent,
    unless that conductor hangs just then: the agent may then be marked down, and is up
    again at its next hello to the next conductor.
    """
    interval = conf.agent.heartbeat_interval
    answer = interval * (conf.conductor.agent_down_intervals - 1) / 2
    return HelloTimeouts(connect=min(conf.conductor.connect_timeout, answer), answer=answer,
                         pull=answer + conf.conductor.hardware_pull_timeout
                         + RECONCILE_ALLOWANCE)


class ConductorClient:
    """What API workers ask of the conductors."""

    def __init__(self, urls: str | Sequence[str], secret: bytes, verify: str | bool = True,
                 connect_timeout: float = 3.0, failback_interval: float = 60.0) -> None:
        self._client = FailoverClient([urls] if isinstance(urls, str) else urls, secret,
                                      timeout=30.0, verify=verify,
                                      connect_timeout=connect_timeout,
                                      failback_interval=failback_interval,
                                      prefer=str(os.getpid()))
        self._wake = threading.Condition()
        self._wake_wanted = False
        self._waker: threading.Thread | None = None

    def wake_binds(self) -> None:
        """Ask a conductor to look for bind jobs now, without waiting for its answer.

        The request that committed the jobs answers at once (the conductor binds while
        it does; waiting for the wake's round trip made a PATCH slower than the bind
        itself), and wakes asked while one is being sent go out as one call. Best
        effort: conductors also poll ([conductor] bind_poll_interval)."""
        with self._wake:
            self._wake_wanted = True
            if self._waker is None or not self._waker.is_alive():  # first use, or forked
                self._waker = threading.Thread(target=self._send_wakes, daemon=True,
                                               name="conductor-wake")
                self._waker.start()
            self._wake.notify()

    def wait_for_binds(self, arq_ids: list[int], seconds: float) -> int:
        """Wake a conductor and wait, at most ``seconds``, until it resolved the binds of
        ``arq_ids`` (acceld.conductor.binding.wakes); return how many it resolved. More ARQs
        than a wake may name, or any failure, fall back to :meth:`wake_binds`: the jobs are
        committed, and a worker takes them whenever it is woken or its scan finds them."""
        if len(arq_ids) > MOST_ARQS_WAITED_FOR:
            self.wake_binds()
            return 0
        try:
            # Not repeated at another conductor after a timeout (a saturated conductor
            # answering late): the PATCH would wait a bind_wait per conductor. Only a
            # conductor that surely never got the call is replaced by the next.
            with serving_slot.stepped_out():  # the worker serves others meanwhile
                answer = self._client.call("POST", "/binds/wake",
                                           {"arq_ids": arq_ids, "wait": seconds},
                                           timeout=seconds + 0.5, repeatable=False)
            return int((answer or {}).get("resolved", 0))
        except (requests.RequestException, InternalError) as exc:
            LOG.debug("Could not wait for the binds at a conductor: %s", exc)
        except Exception:  # noqa: BLE001 - a bug: the PATCH still answers
            LOG.exception("Waiting for the binds at a conductor failed")
        self.wake_binds()
        return 0

    def _send_wakes(self) -> None:
        while True:
            with self._wake:
                while not self._wake_wanted:
                    self._wake.wait()
                self._wake_wanted = False
            try:
                self._client.call("POST", "/binds/wake", {}, timeout=2.0)
            except (requests.RequestException, InternalError) as exc:
                LOG.debug("Could not wake a conductor (they poll): %s", exc)
            except Exception:  # noqa: BLE001 - a bug; the next wake tries again
                LOG.exception("Waking a conductor failed")

    def call(self, method: str, path: str, body: Any = None, timeout: float | None = None) -> Any:
        """A synchronous call (programming, ...); errors propagate to the caller. Moved to
        another conductor only when it surely never reached the first. In an API worker,
        the next request is served while the conductor works."""
        with serving_slot.stepped_out():
            return self._client.call(method, path, body, timeout=timeout, repeatable=False)


def client_from_config(conf: cfg.ConfigOpts) -> ConductorClient | None:
    """The conductor client, or None when no internal secret is available to sign with."""
    if not conf.internal.shared_secret and not os.path.exists(
            os.path.join(conf.state_path, SECRET_FILE)):
        LOG.warning("No internal secret: the API will not call the conductor directly.")
        return None
    return ConductorClient(conductor_urls(conf), internal_secret(conf),
                           verify=tls_verify(conf),
                           connect_timeout=conf.conductor.connect_timeout,
                           failback_interval=conf.conductor.failback_interval)
