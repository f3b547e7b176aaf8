"""Binding waits out outages instead of counting them as failed tries.

Placement, a node's agent (unreachable, or marked down by the liveness sweep) or
the image service being unavailable says nothing
about the bind itself, so a bind that meets one gives its claim back without
using an attempt (``bind_jobs.retry_later(refund=True)``) and is tried again
after a capped backoff, until ``[conductor] bind_timeout`` seconds after it was
asked for (the job's ``created_at``); a bind still blocked then ends
``BindFailed`` with a reason naming what was unavailable, and Nova hears it.
The default (240 s) is below Nova's ``arq_binding_timeout`` (300 s), so Nova
hears the outcome before it gives up on the instance.

This module decides what counts as an outage and computes the deadline, the
backoff and the reason; the worker (acceld.conductor.binding.worker) acts on them.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass

from acceld.clients import placement as pl
from acceld.conductor.binding.programming import ProgrammingUnavailable
from acceld.conductor.binding.target import AgentDown
from acceld.outages import PLACEMENT

IMAGE_SERVICE = "The image service"
BACKOFF_MIN = 1.0  # seconds before the first retry
BACKOFF_CAP = 10.0  # the longest wait between tries: an outage's end is noticed this fast
# What an agent relays with a 503 when the image source, not the agent, is away.
_IMAGE_WORDS = ("glance", "image", "bitstream directory")


def agent(hostname: str) -> str:
    return f"The agent of host {hostname}"


class Unavailable(Exception):
    """A dependency of a bind could not be reached; ``what`` names it for logs and reasons."""

    def __init__(self, what: str, detail: str) -> None:
        super().__init__(f"{what}: {detail}")
        self.what = what
        self.detail = detail


def classify(exc: BaseException, hostname: str | None = None) -> Unavailable | None:
    """The outage ``exc`` reports, or None when it is not one."""
    if isinstance(exc, Unavailable):
        return exc
    if isinstance(exc, AgentDown):
        return Unavailable(agent(exc.hostname), exc.detail)
    if isinstance(exc, pl.PlacementUnavailable):
        return Unavailable(PLACEMENT, str(exc))
    if isinstance(exc, ProgrammingUnavailable):
        message = str(exc)
        host = getattr(exc, "hostname", None) or hostname or "?"
        if any(word in message.lower() for word in _IMAGE_WORDS):
            return Unavailable(IMAGE_SERVICE, message)
        return Unavailable(agent(host), message)
    return None


@dataclass(frozen=True)
class Deadline:
    """``timeout`` seconds after ``asked`` (when the API accepted the bind)."""

    asked: dt.datetime | None
    timeout: float

    def remaining(self, now: dt.datetime) -> float:
        if self.asked is None:  # a job without its creation time: no wait to grant
            return 0.0
        return (self.asked + dt.timedelta(seconds=self.timeout) - now).total_seconds()

    def passed(self, now: dt.datetime) -> bool:
        return self.remaining(now) <= 0

    def backoff(self, now: dt.datetime) -> float:
        """Seconds until the next try: a quarter of the bind's age, 1 s to 10 s, and never
        past the deadline (the last try is made at it)."""
        age = 0.0 if self.asked is None else max(0.0, (now - self.asked).total_seconds())
        delay = min(BACKOFF_CAP, max(BACKOFF_MIN, age / 4))
        return max(0.0, min(delay, self.remaining(now)))


def reason(outage: Unavailable, timeout: float) -> str:
    """The BindFailed reason once the deadline passed."""
    return (f"{outage.what} was unavailable and the bind could not complete within "
            f"[conductor] bind_timeout ({timeout:.0f} s): {outage.detail}")
