"""What the services' code calls to count its work: each call site is one line.

Decorators for whole functions (a reconcile, a heartbeat, a program, a Placement
pass) and plain calls where the outcome is data (Nova's answers, resolved binds).
Nothing here can raise into the caller's work: counting is not worth failing a
bind for.
"""

from __future__ import annotations

import functools
import logging
import re
import threading
import time
from collections import OrderedDict
from typing import Any, Callable, Iterable, TypeVar

from acceld.metrics import families as m

LOG = logging.getLogger(__name__)

F = TypeVar("F", bound=Callable[..., Any])

# The classes of a BindFailed reason, first match wins; anything else is "other". The
# reasons themselves are sentences naming devices and hosts (unbounded), so only the class
# becomes a label.
FAILURE_REASONS: tuple[tuple[str, re.Pattern[str]], ...] = tuple(
    (name, re.compile(pattern, re.IGNORECASE)) for name, pattern in (
        ("unavailable", r"was unavailable and the bind could not complete"),
        ("device_unhealthy", r"quarantined for its health|\bunhealthy\b"),
        ("device_disabled", r"is disabled \(status|is not ready \(acc_status"),
        ("device_gone", r"no longer reported|was removed|not the resource provider of any"),
        ("no_free_handle", r"no free attach handle"),
        ("attach_failed", r"preparing attach handle"),
        ("programming", r"program|bitstream|function_id"),
        ("placement", r"placement|allocation"),
        ("profile_mismatch", r"profile group|trait|offers"),
        ("wrong_host", r"is on host .*, not on"),
        ("abandoned", r"the bind was abandoned"),
    ))
OTHER = "other"
PROGRAM_KINDS = ("bitstream", "firmware")


def failure_reason(text: str | None) -> str:
    """The class of a BindFailed reason (a bounded label value)."""
    for name, pattern in FAILURE_REASONS:
        if text and pattern.search(text):
            return name
    return OTHER


def _safely(what: str, count: Callable[[], None]) -> None:
    try:
        count()
    except Exception:  # noqa: BLE001 - never let counting fail the work it counts
        LOG.exception("Counting %s for metrics failed", what)


# -- binds ---------------------------------------------------------------------------------

class _Seen:
    """Recently counted bind jobs, so that a notify retried (Nova away) is not a second
    outcome. Keyed by (job id, created_at): SQLite may give a new job a deleted one's id."""

    def __init__(self, size: int = 65536) -> None:
        self._keys: OrderedDict[tuple[Any, Any], None] = OrderedDict()
        self._size = size
        self._guard = threading.Lock()

    def first(self, key: tuple[Any, Any]) -> bool:
        with self._guard:
            if key in self._keys:
                return False
            self._keys[key] = None
            if len(self._keys) > self._size:
                self._keys.popitem(last=False)
            return True


_BINDS_SEEN = _Seen()


def binds_resolved(rows: Iterable[Any]) -> None:
    """Resolved bind jobs about to be announced to Nova (acceld.conductor.binding.worker._notify):
    each row has ``id``, ``created_at`` (when the PATCH made the job), ``state``,
    ``bind_failure_reason`` and ``db_now`` (the database's clock, which stamped
    ``created_at``)."""
    def count() -> None:
        for row in rows:
            outcome = {"Bound": "bound", "BindFailed": "failed"}.get(row.state)
            if outcome is None or not _BINDS_SEEN.first((row.id, row.created_at)):
                continue
            m.BINDS.labels(outcome).inc()
            seconds = max(0.0, (row.db_now - row.created_at).total_seconds())
            m.BIND_DURATION.labels(outcome).observe(seconds)
            if outcome == "failed":
                m.BIND_FAILURES.labels(failure_reason(row.bind_failure_reason)).inc()
    _safely("resolved binds", count)


# -- Nova, Placement -----------------------------------------------------------------------

def nova_events(outcomes: dict[str, str]) -> dict[str, str]:
    """Count Nova's answer per event (delivered, dropped, retry); returns ``outcomes``."""
    def count() -> None:
        for result in outcomes.values():
            m.NOVA_EVENTS.labels(result).inc()
    _safely("Nova events", count)
    return outcomes


def _unreachable(exc: BaseException) -> bool:
    from acceld.clients.placement import PlacementUnavailable

    return isinstance(exc, PlacementUnavailable)


def _placement_work(what: str, count: Callable[[Any], None]) -> Callable[[F], F]:
    """A decorator for a pass over Placement: an unreachable Placement is counted (and the
    gauge set down) from the exception; what the pass did is counted from its result."""
    def decorate(func: F) -> F:
        @functools.wraps(func)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            try:
                result = func(*args, **kwargs)
            except Exception as exc:
                if _unreachable(exc):
                    m.PLACEMENT_ERRORS.labels("unreachable").inc()
                    m.PLACEMENT_UP.set(0)
                raise
            _safely(what, lambda: count(result))
            return result
        return wrapper  # type: ignore[return-value]
    return decorate


def _count_pass(result: Any) -> None:
    m.PLACEMENT_UP.set(1)
    m.PLACEMENT_WRITES.labels("write").inc(len(result.written))
    m.PLACEMENT_WRITES.labels("delete").inc(len(result.deleted))
    m.PLACEMENT_ERRORS.labels("refused").inc(len(result.failed))


def _count_audit(result: Any) -> None:
    if result is not None:
        m.PLACEMENT_DRIFT_REPAIRS.inc(sum(len(v) for v in result.repaired.values()))
        m.PLACEMENT_ERRORS.labels("refused").inc(len(result.failed))


# For PlacementSync.sync_once: providers written, deleted and refused; whether Placement
# answered.
placement_pass = _placement_work("a Placement pass", _count_pass)
# For PlacementSync._audit_step: each difference repaired is one drift repair.
placement_audit = _placement_work("a Placement audit", _count_audit)


# -- conductor work ------------------------------------------------------------------------

def reconcile(func: F) -> F:
    """For reconcile.apply_report: duration and outcome of one node's report."""
    @functools.wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        started = time.perf_counter()
        outcome = "error"
        try:
            result = func(*args, **kwargs)
            outcome = "refused_records" if getattr(result, "problems", None) else "ok"
            return result
        finally:
            m.RECONCILES.labels(outcome).inc()
            m.RECONCILE_DURATION.observe(time.perf_counter() - started)
    return wrapper  # type: ignore[return-value]


def heartbeat(func: F) -> F:
    """For the conductor's heartbeat recording: one count per heartbeat recorded."""
    @functools.wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        result = func(*args, **kwargs)
        m.HEARTBEATS.inc()
        return result
    return wrapper  # type: ignore[return-value]


def program(func: F) -> F:
    """For Programmer.program(deployable_uuid, kind, ...): duration and outcome."""
    @functools.wraps(func)
    def wrapper(self: Any, deployable_uuid: str, kind: str, *args: Any, **kwargs: Any) -> Any:
        label = kind if kind in PROGRAM_KINDS else OTHER
        started = time.perf_counter()
        outcome = "failed"
        try:
            result = func(self, deployable_uuid, kind, *args, **kwargs)
            outcome = "succeeded"
            return result
        finally:
            m.PROGRAMS.labels(label, outcome).inc()
            m.PROGRAM_DURATION.labels(label).observe(time.perf_counter() - started)
    return wrapper  # type: ignore[return-value]


# -- agent ---------------------------------------------------------------------------------

def discover(driver: Any) -> list[Any]:
    """``driver.discover()``, timed per driver; its exception is the caller's to handle."""
    started = time.perf_counter()
    outcome = "error"
    try:
        records = list(driver.discover())
        outcome = "ok"
        return records
    finally:
        m.DISCOVERIES.labels(driver.name, outcome).inc()
        m.DISCOVERY_DURATION.labels(driver.name).observe(time.perf_counter() - started)
