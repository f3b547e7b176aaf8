"""Every metric family acceld counts, and which service exposes which.

The families are created unregistered: each service serves its own registry
(:func:`registry_for`), so the API shows no bind counters and the agent no API
requests. Label values come from small fixed sets (a route's template, never a
raw path; a failure's class, never its text), so no client or device can grow
the number of series without bound.
"""

from __future__ import annotations

from typing import Iterable

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.registry import Collector

PREFIX = "acceld"

# -- API (gunicorn workers; multiprocess) ----------------------------------------------------

API_REQUESTS = Counter(
    "acceld_api_requests", "Public API requests answered, by route template, method and "
    "status code.", ["route", "method", "status"], registry=None)
API_LATENCY = Histogram(
    "acceld_api_request_duration_seconds", "Time from a request reaching acceld's "
    "application to its answer, by route template and method.", ["route", "method"],
    buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 120),
    registry=None)

# -- conductor ----------------------------------------------------------------------------

BINDS = Counter(
    "acceld_binds", "Binds resolved, by outcome (bound or failed).", ["outcome"],
    registry=None)
BIND_DURATION = Histogram(
    "acceld_bind_duration_seconds", "Time from the bind PATCH to Bound or BindFailed, by "
    "outcome.", ["outcome"],
    buckets=(0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 240, 300), registry=None)
BIND_FAILURES = Counter(
    "acceld_bind_failures", "Binds that ended BindFailed, by class of reason "
    "(acceld.metrics.record.FAILURE_REASONS).", ["reason"], registry=None)
NOVA_EVENTS = Counter(
    "acceld_nova_events", "accelerator-request-bound events for Nova, by result: delivered "
    "(Nova took it, or no Nova is configured), dropped (refused for good), retry (Nova "
    "unreachable; sent again later).", ["result"], registry=None)
PLACEMENT_WRITES = Counter(
    "acceld_placement_writes", "Accelerator providers written to or deleted from Placement.",
    ["operation"], registry=None)
PLACEMENT_ERRORS = Counter(
    "acceld_placement_errors", "Placement sync failures: refused (Placement answered an "
    "error for a provider) or unreachable (a pass or audit cut short).", ["kind"],
    registry=None)
PLACEMENT_DRIFT_REPAIRS = Counter(
    "acceld_placement_drift_repairs", "Differences between Placement and the database the "
    "audit found and repaired.", registry=None)
PLACEMENT_UP = Gauge(
    "acceld_placement_up", "1 when the last Placement sync pass reached Placement, 0 when "
    "it could not (absent until the first pass; not exposed when Placement is not "
    "configured).", registry=None)
RECONCILES = Counter(
    "acceld_reconciles", "Hardware reports reconciled into the inventory, by outcome (ok, "
    "refused_records when some records were refused, error).", ["outcome"], registry=None)
RECONCILE_DURATION = Histogram(
    "acceld_reconcile_duration_seconds", "Time to check and apply one node's hardware "
    "report.", registry=None)
HEARTBEATS = Counter(
    "acceld_heartbeats", "Agent heartbeats (hellos) the conductor recorded.", registry=None)
PROGRAMS = Counter(
    "acceld_programs", "Programs (bitstream or firmware) the conductor ran, by kind and "
    "outcome (succeeded, failed).", ["kind", "outcome"], registry=None)
PROGRAM_DURATION = Histogram(
    "acceld_program_duration_seconds", "Time one program took, lease wait included, by kind.",
    ["kind"], buckets=(0.1, 0.5, 1, 2.5, 5, 10, 30, 60, 100, 200, 300, 600), registry=None)

# -- agent --------------------------------------------------------------------------------

DISCOVERIES = Counter(
    "acceld_discoveries", "Hardware discoveries of an in-process driver, by driver and "
    "outcome (ok, error).", ["driver", "outcome"], registry=None)
DISCOVERY_DURATION = Histogram(
    "acceld_discovery_duration_seconds", "Time one in-process driver took to discover the "
    "node's hardware.", ["driver"],
    buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60), registry=None)

SERVICES: dict[str, tuple[Collector, ...]] = {
    "api": (API_REQUESTS, API_LATENCY),
    "conductor": (BINDS, BIND_DURATION, BIND_FAILURES, NOVA_EVENTS, PLACEMENT_WRITES,
                  PLACEMENT_ERRORS, PLACEMENT_DRIFT_REPAIRS, PLACEMENT_UP, RECONCILES,
                  RECONCILE_DURATION, HEARTBEATS, PROGRAMS, PROGRAM_DURATION),
    "agent": (DISCOVERIES, DISCOVERY_DURATION),
}


def registry_for(service: str, extra: Iterable[Collector] = ()) -> CollectorRegistry:
    """A registry holding ``service``'s families (in this process) and ``extra``."""
    registry = CollectorRegistry(auto_describe=True)
    for family in SERVICES[service]:
        registry.register(family)
    for collector in extra:
        registry.register(collector)
    return registry


def exposed_names() -> set[str]:
    """Every sample name acceld can expose (counters' _total, histograms' _bucket, ...),
    inventory included: what dashboards and alert rules may refer to."""
    from acceld.metrics.inventory import FAMILY_NAMES

    names: set[str] = set()
    for families in SERVICES.values():
        for family in families:
            for metric in family.describe():
                if metric.type == "counter":
                    names.update({metric.name + "_total", metric.name + "_created"})
                elif metric.type == "histogram":
                    names.update(metric.name + s for s in ("_bucket", "_sum", "_count",
                                                           "_created"))
                else:
                    names.add(metric.name)
    return names | set(FAMILY_NAMES)
